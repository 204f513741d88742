package peer

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// deliveryRate is the kernel's estimate of the connection's delivery rate
// in bytes per second (TCP_INFO tcpi_delivery_rate: bytes acknowledged
// over the last round trip's interval), or false when the connection is
// not TCP or says none yet. A chunk's write returns once the socket
// buffer (megabytes) has taken it, long before the link carried it, so the
// write's duration says nothing of the link's rate; this does.
func deliveryRate(nc net.Conn) (float64, bool) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return 0, false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return 0, false
	}
	var rate uint64
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		var info *unix.TCPInfo
		info, gerr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		if gerr == nil {
			rate = info.Delivery_rate
		}
	}); err != nil || gerr != nil || rate == 0 {
		return 0, false
	}
	return float64(rate), true
}
