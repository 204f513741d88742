// Command reft-delayline is the test cluster's latency injector (`cluster
// delay NODE MS`, tests/cluster/cluster): the test machine's kernel has no
// netem qdisc, so a node's frames are relayed in user space instead.
//
// It joins two Ethernet interfaces with AF_PACKET sockets: the node's side
// (the host end of the node's veth, taken off the bridge) and the bridge's
// side (one end of a fresh veth pair whose other end the tool puts on the
// bridge). Every frame the node sends leaves on the bridge's side the given
// delay after it arrived, in order; frames to the node pass at once. The
// node's round trip to any peer so grows by the delay, as with netem on the
// node's egress. Frames are passed with their virtio-net header
// (PACKET_VNET_HDR), so segmentation and checksum offload survive the hop
// unchanged.
//
// It runs until SIGTERM or until an interface goes away (the node killed),
// and writes "ready" on stdout once both sockets are bound, so the tool
// re-plumbs the bridge only when no frame can be lost.
package main

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	node := flag.String("node", "", "the node's side: the host end of its veth (off the bridge)")
	bridge := flag.String("bridge", "", "the bridge's side: a veth end whose peer is on the bridge")
	delay := flag.Duration("delay", 0, "how long each frame from the node is held (e.g. 200ms)")
	flag.Parse()
	if *node == "" || *bridge == "" || *delay <= 0 {
		fmt.Fprintln(os.Stderr, "reft-delayline: error: -node, -bridge and a positive -delay are required (e.g. -node rftv16800-2 -bridge rftd16800-2 -delay 200ms)")
		os.Exit(2)
	}
	if err := run(*node, *bridge, *delay); err != nil {
		fmt.Fprintf(os.Stderr, "reft-delayline: error: %v\n", err)
		os.Exit(1)
	}
}

func run(nodeIf, bridgeIf string, delay time.Duration) error {
	nodeSock, err := open(nodeIf)
	if err != nil {
		return err
	}
	bridgeSock, err := open(bridgeIf)
	if err != nil {
		return err
	}
	fmt.Println("ready")
	errc := make(chan error, 3)
	// From the node: held for the delay. To the node: at once.
	var out, in atomic.Int64
	go func() { errc <- RelayCounting(nodeSock, bridgeSock, delay, &out) }()
	go func() { errc <- RelayCounting(bridgeSock, nodeSock, 0, &in) }()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	// What passed, said at the end: the tests check that the node's
	// traffic really went through the relay.
	defer func() {
		fmt.Printf("relayed %d frames from the node (each held %v), %d to it\n", out.Load(), delay, in.Load())
	}()
	select {
	case err := <-errc:
		return err
	case <-sig:
		return nil
	}
}

// packetSock is an AF_PACKET socket bound to one interface, reading and
// writing whole frames with their virtio-net header.
type packetSock struct {
	fd   int
	name string
}

// open binds a packet socket to ifname. It sees every frame the interface
// receives (promiscuous, whatever the destination MAC address) and none it
// sends itself (PACKET_IGNORE_OUTGOING), so no frame is relayed twice.
func open(ifname string) (*packetSock, error) {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("interface %s: %w (the tool creates it before starting the relay)", ifname, err)
	}
	proto := htons(unix.ETH_P_ALL)
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(proto))
	if err != nil {
		return nil, fmt.Errorf("packet socket for %s: %w (needs root)", ifname, err)
	}
	for _, o := range []struct {
		name string
		opt  int
	}{{"PACKET_VNET_HDR", unix.PACKET_VNET_HDR}, {"PACKET_IGNORE_OUTGOING", unix.PACKET_IGNORE_OUTGOING}} {
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, o.opt, 1); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("%s on %s: %w", o.name, ifname, err)
		}
	}
	mreq := unix.PacketMreq{Ifindex: int32(ifi.Index), Type: unix.PACKET_MR_PROMISC}
	if err := unix.SetsockoptPacketMreq(fd, unix.SOL_PACKET, unix.PACKET_ADD_MEMBERSHIP, &mreq); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("promiscuous mode on %s: %w", ifname, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: proto, Ifindex: ifi.Index}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind to %s: %w", ifname, err)
	}
	return &packetSock{fd: fd, name: ifname}, nil
}

func (s *packetSock) ReadFrame(buf []byte) (int, error) {
	for {
		n, _, err := unix.Recvfrom(s.fd, buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("read from %s: %w", s.name, err)
		}
		return n, nil
	}
}

func (s *packetSock) WriteFrame(frame []byte) error {
	for {
		_, err := unix.Write(s.fd, frame)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("write to %s: %w", s.name, err)
		}
		return nil
	}
}

func htons(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}
