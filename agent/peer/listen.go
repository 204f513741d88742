package peer

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"
)

// ListenRange listens on the first free port of [lo, hi] on bind, in
// order, skipping ports in use; [0, 0] takes any free port. Errors other
// than "in use" (no such address, permission) stop the search at once:
// they would repeat on every port.
func ListenRange(bind string, lo, hi int) (*net.TCPListener, error) {
	if lo == 0 && hi == 0 {
		ln, err := net.Listen("tcp", net.JoinHostPort(bind, "0"))
		if err != nil {
			return nil, fmt.Errorf("peer listener on %q: %w (is the bind address one of this node's?)", bind, err)
		}
		return ln.(*net.TCPListener), nil
	}
	if lo < 1 || hi > 65535 || lo > hi {
		return nil, fmt.Errorf("peer port range [%d, %d]: want 1 <= low <= high <= 65535 (agent.port_range in reft.toml)", lo, hi)
	}
	for p := lo; p <= hi; p++ {
		ln, err := net.Listen("tcp", net.JoinHostPort(bind, strconv.Itoa(p)))
		if err == nil {
			return ln.(*net.TCPListener), nil
		}
		if errors.Is(err, syscall.EADDRINUSE) {
			continue
		}
		return nil, fmt.Errorf("peer listener on %s: %w (check the bind address; ports below 1024 need privileges)", net.JoinHostPort(bind, strconv.Itoa(p)), err)
	}
	return nil, fmt.Errorf("peer listener: every port of [%d, %d] on %q is in use (widen agent.port_range in reft.toml, or look for stale agents with `ss -ltnp`)", lo, hi, bind)
}
