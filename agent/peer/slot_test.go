package peer

import (
	"context"
	"errors"
	"net"
	"testing"
	"testing/synctest"
	"time"
)

// TestCallGivesUpOnAnotherDial: a dial to a peer that accepts and then
// says nothing holds the connection slot until its handshake times out.
// Another request to that peer waits only as long as its own ctx allows
// (the failure detector's beat must not be held by the mesh's search),
// and its error says so.
func TestCallGivesUpOnAnotherDial(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c // held open, never answered
		}
	}()
	cfg := baseConfig(t, "n1")
	cfg.HandshakeTimeout = time.Minute
	cl := newClient(t, cfg)
	addr := ln.Addr().String()

	slow, stopSlow := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() { _, err := cl.Connect(slow, addr); first <- err }()
	c := <-accepted // the first dial is in its handshake, holding the slot
	defer c.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	var rep struct{}
	err = cl.Call(ctx, addr, TBeat, struct{}{}, &rep)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a beat behind a stalled dial: %v, want its own deadline", err)
	}
	select {
	case err := <-first:
		t.Fatalf("the first dial ended (%v) before the beat gave up: the test proves nothing", err)
	default:
	}
	stopSlow()
	if err := <-first; err == nil {
		t.Error("the stalled dial succeeded")
	}
}

// TestDialResendsEverySecond: a connect whose SYNs are lost (a flap) is
// tried afresh every synRetry, not left to the kernel's backoff, so a
// link that heals is used within one retry; a refusal ends the dial at
// once; the dial's whole timeout still bounds it.
func TestDialResendsEverySecond(t *testing.T) {
	refused := errors.New("connect: connection refused")
	for _, tc := range []struct {
		name     string
		lost     int   // attempts that time out before the link answers
		other    error // what the attempt after them returns (nil: a connection)
		timeout  time.Duration
		attempts int
		took     time.Duration
		wantErr  bool
	}{
		{name: "up", lost: 0, timeout: 5 * time.Second, attempts: 1, took: 0},
		{name: "healed after 2.5 s", lost: 3, timeout: 5 * time.Second, attempts: 4, took: 3 * time.Second},
		{name: "refused", lost: 1, other: refused, timeout: 5 * time.Second, attempts: 2, took: time.Second, wantErr: true},
		{name: "down past the timeout", lost: 100, timeout: 5 * time.Second, attempts: 5, took: 5 * time.Second, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				attempts := 0
				dial := func(ctx context.Context, addr string) (net.Conn, error) {
					attempts++
					if attempts <= tc.lost {
						<-ctx.Done() // the SYN is lost: nothing answers
						return nil, &net.OpError{Op: "dial", Net: "tcp", Err: ctx.Err()}
					}
					if tc.other != nil {
						return nil, tc.other
					}
					a, b := net.Pipe()
					b.Close()
					return a, nil
				}
				start := time.Now()
				nc, err := dialTCP(context.Background(), "10.0.0.2:1", tc.timeout, synRetry, dial)
				if nc != nil {
					nc.Close()
				}
				if (err != nil) != tc.wantErr {
					t.Fatalf("err %v, want an error: %v", err, tc.wantErr)
				}
				if tc.other != nil && !errors.Is(err, tc.other) {
					t.Errorf("err %v, want the attempt's own error %v", err, tc.other)
				}
				if attempts != tc.attempts || time.Since(start) != tc.took {
					t.Errorf("%d attempts over %v, want %d over %v", attempts, time.Since(start), tc.attempts, tc.took)
				}
			})
		})
	}
}
