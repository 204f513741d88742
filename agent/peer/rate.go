package peer

import (
	"net"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// rateMeter measures the rate at which a connection's data gets through
// while it has data queued, from the kernel's TCP_INFO counters: bytes
// acknowledged over busy time (tcpi_bytes_acked / tcpi_busy_time), over
// the interval since its previous sample. A chunk's write returns once
// the socket buffer (megabytes) has taken it, long before the link
// carried it, so the write's duration says nothing of the link's rate.
// Nor does tcpi_delivery_rate, sampled over one round trip: a shaper's
// bucket lets the start of each burst through at the wire's speed (on
// the capped test cluster it read 2 to 20 times the cap). The lifetime
// ratio reads too low instead (a fifth of the cap there): busy time
// also runs while the queue's tail shares the link with the trainer's
// traffic. Per-interval samples let the caller keep the best recent one
// (agent/netsched), which is a chunk that had the link to itself. Safe
// for concurrent use.
type rateMeter struct {
	mu          sync.Mutex
	acked, busy uint64 // at the previous sample: bytes, microseconds
}

// sample returns the rate since the previous sample in bytes per second,
// or false when the connection is not TCP or was not busy since.
func (m *rateMeter) sample(nc net.Conn) (float64, bool) {
	acked, busy, ok := tcpCounters(nc)
	if !ok {
		return 0, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	da, db := acked-m.acked, busy-m.busy
	if acked < m.acked || busy < m.busy { // a new connection's counters
		da, db = acked, busy
	}
	m.acked, m.busy = acked, busy
	if da == 0 || db == 0 {
		return 0, false
	}
	return float64(da) / (float64(db) / 1e6), true
}

// tcpCounters reads tcpi_bytes_acked and tcpi_busy_time (microseconds).
func tcpCounters(nc net.Conn) (acked, busy uint64, ok bool) {
	sc, isSC := nc.(syscall.Conn)
	if !isSC {
		return 0, 0, false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return 0, 0, false
	}
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		var info *unix.TCPInfo
		info, gerr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		if gerr == nil {
			acked, busy = info.Bytes_acked, info.Busy_time
		}
	}); err != nil || gerr != nil {
		return 0, 0, false
	}
	return acked, busy, true
}
