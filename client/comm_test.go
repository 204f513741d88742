package client_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/client"
)

// TestCommPhase: a comm notice goes out only when the phase changes, is
// never answered, and does not wait for a request in flight (here a
// generations request the agent answers only after it saw the notice).
func TestCommPhase(t *testing.T) {
	notices := make(chan proto.Comm, 8)
	asked := make(chan struct{})
	release := make(chan struct{})
	c := commClient(t, notices, func(f proto.Frame) []proto.Frame {
		if f.Type != proto.TGenerations {
			return nil
		}
		close(asked)
		<-release
		return []proto.Frame{msg(f.Type|proto.ReplyBit, f.ID, `{"rank":0,"generations":[]}`)}
	})
	done := make(chan error, 1)
	go func() {
		_, err := c.Generations(context.Background())
		done <- err
	}()
	<-asked
	// The fake agent reads frames in order, so it sees the notices only
	// after answering; the calls must return without that answer.
	for _, active := range []bool{true, true, false, false, true} {
		c.CommPhase(active)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("generations around the notices: %v", err)
	}
	var got []bool
	for len(got) < 3 {
		select {
		case cm := <-notices:
			got = append(got, cm.Active)
		case <-time.After(30 * time.Second):
			t.Fatalf("the agent got comm notices %v, want [true false true]", got)
		}
	}
	if !slices.Equal(got, []bool{true, false, true}) {
		t.Fatalf("comm notices %v, want [true false true] (one per change)", got)
	}
	c.Close()
	if len(notices) != 0 {
		t.Fatalf("more comm notices than changes: %v", <-notices)
	}
}

// TestCollective: a named phase reaches the agent with its name; a name
// that cannot name anything is refused with the cause and sends nothing.
func TestCollective(t *testing.T) {
	comm := make(chan proto.Comm, 8)
	c := commClient(t, comm, nil)
	for _, tc := range []struct {
		op      string
		wantErr string // "": sent
	}{
		{"gradient all-reduce", ""},
		{strings.Repeat("x", proto.MaxCommOp+1), "longer than 96"},
		{"all-reduce\nreft: rank 0: forged", "unprintable character at byte 10"},
		{"all-reduce \xff", "unprintable character at byte 11"},
	} {
		err := c.Collective(tc.op)
		if tc.wantErr == "" {
			if err != nil {
				t.Errorf("Collective(%q): %v", tc.op, err)
			}
			c.CommPhase(false)
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("Collective(%q) = %v, want an error saying %q", tc.op, err, tc.wantErr)
		}
	}
	c.Close()
	var got []proto.Comm
	for len(got) < 2 {
		select {
		case cm := <-comm:
			got = append(got, cm)
		case <-time.After(30 * time.Second):
			t.Fatalf("the agent got comm notices %+v, want the named phase and its end", got)
		}
	}
	if want := []proto.Comm{{Active: true, Op: "gradient all-reduce"}, {Active: false}}; !slices.Equal(got, want) {
		t.Fatalf("comm notices %+v, want %+v", got, want)
	}
	if len(comm) != 0 {
		t.Fatalf("a refused name was sent: %+v", <-comm)
	}
}

// commClient opens a client on a fake agent that answers hello, sends
// every comm notice it reads to notices, and answers any other request
// with other's frames (nil other, or no frames: an unexpected request).
// The client is closed when the test ends.
func commClient(t *testing.T, notices chan<- proto.Comm, other func(proto.Frame) []proto.Frame) *client.Client {
	fa := &fakeAgent{reply: func(f proto.Frame) ([]proto.Frame, bool) {
		switch f.Type {
		case proto.THello:
			return []proto.Frame{msg(proto.THelloReply, f.ID, helloOK)}, false
		case proto.TComm:
			var cm proto.Comm
			if err := f.Unmarshal(&cm); err != nil {
				t.Errorf("comm notice: %v", err)
			}
			notices <- cm
			return nil, false
		}
		if other != nil {
			if out := other(f); out != nil {
				return out, false
			}
		}
		t.Errorf("unexpected %s", f.Type)
		return nil, true
	}}
	c, err := client.Open(context.Background(), client.Options{Socket: fa.start(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
