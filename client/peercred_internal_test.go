package client

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestDialChecksAgentUID: the client talks only to an agent of its own
// uid (SO_PEERCRED); a socket served by another user is refused before
// a byte is sent to it (issue 14, finding 7). The test poses as another
// user through ownUID: the listener runs as this process's uid.
func TestDialChecksAgentUID(t *testing.T) {
	cases := []struct {
		name  string
		uid   func() int
		allow bool
	}{
		{"same uid", os.Getuid, true},
		{"agent of another uid", func() int { return os.Getuid() + 1 }, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "agent.sock")
			ln, err := net.Listen("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			got := make(chan int, 1) // bytes the "agent" received
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				n, _ := io.Copy(io.Discard, c)
				got <- int(n)
			}()
			defer func(f func() int) { ownUID = f }(ownUID)
			ownUID = tc.uid
			c, err := dial(context.Background(), path)
			if tc.allow {
				if err != nil {
					t.Fatalf("dial: %v", err)
				}
				c.c.Close()
				return
			}
			if !errors.Is(err, ErrAgentNotOurs) {
				t.Fatalf("dial = %v, want ErrAgentNotOurs", err)
			}
			if n := <-got; n != 0 {
				t.Fatalf("the other user's socket received %d bytes", n)
			}
		})
	}
}
