package peer

import (
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"testing"
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
