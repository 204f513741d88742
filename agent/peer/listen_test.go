package peer

import (
	"errors"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// freeRange finds three consecutive free loopback ports.
func freeRange(t *testing.T) int {
	for range 50 {
		base := 20000 + rand.IntN(20000)
		var lns []net.Listener
		for p := base; p < base+3; p++ {
			ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
			if err != nil {
				break
			}
			lns = append(lns, ln)
		}
		for _, ln := range lns {
			ln.Close()
		}
		if len(lns) == 3 {
			return base
		}
	}
	t.Fatal("no three consecutive free ports")
	return 0
}

func TestListenRange(t *testing.T) {
	base := freeRange(t)
	hold, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(base))
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	var got []net.Listener
	defer func() {
		for _, ln := range got {
			ln.Close()
		}
	}()
	for _, want := range []int{base + 1, base + 2} {
		ln, err := ListenRange("127.0.0.1", base, base+2)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ln)
		if p := ln.Addr().(*net.TCPAddr).Port; p != want {
			t.Fatalf("port %d, want %d (the first free one)", p, want)
		}
	}
	for _, tc := range []struct {
		bind   string
		lo, hi int
		substr string
	}{
		{"127.0.0.1", base, base + 2, "widen agent.port_range"},
		{"127.0.0.1", 10, 5, "want 1 <= low <= high"},
		{"127.0.0.1", 0, 70000, "want 1 <= low <= high"},
		{"192.0.2.1", base, base + 2, "check the bind address"}, // TEST-NET: not ours
		{"not-an-address", 0, 0, "bind address"},
	} {
		if _, err := ListenRange(tc.bind, tc.lo, tc.hi); err == nil || !strings.Contains(err.Error(), tc.substr) {
			t.Errorf("ListenRange(%s, %d, %d): %v, want an error naming %q", tc.bind, tc.lo, tc.hi, err, tc.substr)
		}
	}
}

// TestListenPorts: an explicit candidate list is tried in its own order,
// skipping ports in use; all in use names them and wraps EADDRINUSE.
func TestListenPorts(t *testing.T) {
	base := freeRange(t)
	hold, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(base+2))
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	ln, err := ListenPorts("127.0.0.1", []int{base + 2, base})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if p := ln.Addr().(*net.TCPAddr).Port; p != base {
		t.Fatalf("port %d, want %d (the first free candidate)", p, base)
	}
	_, err = ListenPorts("127.0.0.1", []int{base + 2, base})
	if !errors.Is(err, syscall.EADDRINUSE) || !strings.Contains(err.Error(), strconv.Itoa(base+2)+", "+strconv.Itoa(base)) {
		t.Fatalf("every candidate in use: %v, want EADDRINUSE naming both ports", err)
	}
	if _, err := ListenPorts("127.0.0.1", nil); err == nil {
		t.Fatal("no candidates: no error")
	}
}

// TestConnectDrop: Connect authenticates once and reports the peer's node;
// Drop closes the connection, and the next Connect dials again.
func TestConnectDrop(t *testing.T) {
	s := startServer(t, baseConfig(t, "srv"), newMemSource())
	cl := newClient(t, baseConfig(t, "cli"))
	ctx := testCtx(t, 10*time.Second)
	addr := s.Addr().String()
	for range 2 {
		node, err := cl.Connect(ctx, addr)
		if err != nil || node != "srv" {
			t.Fatalf("Connect: %q, %v; want node srv", node, err)
		}
	}
	if n := accepted(s, 1); n != 1 {
		t.Fatalf("two Connects made %d connections, want 1", n)
	}
	cl.Drop(addr)
	if _, err := cl.Connect(ctx, addr); err != nil {
		t.Fatal(err)
	}
	if n := accepted(s, 2); n != 2 {
		t.Fatalf("Connect after Drop: %d connections in all, want 2", n)
	}
	other := baseConfig(t, "x")
	other.Job = "78"
	if _, err := newClient(t, other).Connect(ctx, addr); !IsCode(err, CodeForbidden) {
		t.Fatalf("another job's Connect: %v, want forbidden", err)
	}
}

// accepted is the server's count of accepted connections once it reaches
// want (or after 5 s): the dialer's Connect can return, its handshake
// done, a moment before the listener's side counts the connection.
func accepted(s *Server, want uint64) uint64 {
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := s.Stats().Accepted.Load()
		if n >= want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(5 * time.Millisecond)
	}
}
