package peer

import (
	"context"
	"errors"
	"net"
	"testing"
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
