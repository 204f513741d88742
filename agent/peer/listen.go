package peer

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
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
	ports := make([]int, 0, hi-lo+1)
	for p := lo; p <= hi; p++ {
		ports = append(ports, p)
	}
	ln, err := listenPorts(bind, ports)
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, fmt.Errorf("peer listener: every port of [%d, %d] on %q is in use (widen agent.port_range in reft.toml, or look for stale agents with `ss -ltnp`): %w", lo, hi, bind, err)
	}
	return ln, err
}

// ListenPorts listens on the first free port of ports on bind, in order,
// skipping ports in use. When every port is in use the error wraps
// syscall.EADDRINUSE; any other error stops the search at once.
func ListenPorts(bind string, ports []int) (*net.TCPListener, error) {
	ln, err := listenPorts(bind, ports)
	if errors.Is(err, syscall.EADDRINUSE) {
		s := make([]string, len(ports))
		for i, p := range ports {
			s[i] = strconv.Itoa(p)
		}
		return nil, fmt.Errorf("peer listener: ports %s on %q are all in use (other agents or programs hold them; widen agent.port_range in reft.toml or free one): %w",
			strings.Join(s, ", "), bind, err)
	}
	return ln, err
}

// listenPorts is ListenPorts; all ports in use is a bare EADDRINUSE, for
// the caller to name the ports.
func listenPorts(bind string, ports []int) (*net.TCPListener, error) {
	if len(ports) == 0 {
		return nil, errors.New("peer listener: no candidate ports")
	}
	for _, p := range ports {
		if p < 1 || p > 65535 {
			return nil, fmt.Errorf("peer listener: port %d outside 1 to 65535 (agent.port_range in reft.toml)", p)
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(bind, strconv.Itoa(p)))
		if err == nil {
			return ln.(*net.TCPListener), nil
		}
		if errors.Is(err, syscall.EADDRINUSE) {
			continue
		}
		return nil, fmt.Errorf("peer listener on %s: %w (check the bind address; ports below 1024 need privileges)", net.JoinHostPort(bind, strconv.Itoa(p)), err)
	}
	return nil, syscall.EADDRINUSE
}
