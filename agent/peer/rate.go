package peer

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// deliveryRate is the rate at which the connection's data got through
// while it had data in flight, in bytes per second, from the kernel's
// TCP_INFO: bytes acknowledged over busy time (tcpi_bytes_acked /
// tcpi_busy_time, the connection's lifetime), or false when the
// connection is not TCP or has not been busy yet. A chunk's write returns
// once the socket buffer (megabytes) has taken it, long before the link
// carried it, so the write's duration says nothing of the link's rate.
// Nor does tcpi_delivery_rate, sampled over one round trip: a shaper's
// bucket lets the start of each burst through at the wire's speed (on
// the capped test cluster it read 2 to 20 times the cap).
func deliveryRate(nc net.Conn) (float64, bool) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return 0, false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return 0, false
	}
	var acked, busy uint64 // bytes, microseconds
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		var info *unix.TCPInfo
		info, gerr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		if gerr == nil {
			acked, busy = info.Bytes_acked, info.Busy_time
		}
	}); err != nil || gerr != nil || acked == 0 || busy == 0 {
		return 0, false
	}
	return float64(acked) / (float64(busy) / 1e6), true
}
