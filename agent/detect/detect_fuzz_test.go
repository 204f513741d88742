package detect

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/reft-hpc/reft/agent/peer"
	"github.com/rs/zerolog"
)

// downTransport reaches no agent.
type downTransport struct{}

func (downTransport) Call(context.Context, string, peer.Type, any, any) error {
	return errors.New("unreachable")
}

// handlerSet collects the detector's handlers instead of a peer server.
type handlerSet map[peer.Type]peer.Handler

func (h handlerSet) Handle(t peer.Type, fn peer.Handler) error { h[t] = fn; return nil }

// FuzzHandlers: a beat, probe or failure frame from another agent of the
// job (authenticated, but its payload is still bytes off the network)
// never panics the detector; a malformed one is a CodeMalformed error;
// every reply encodes; and a failure report sent twice is a duplicate the
// second time, so a peer cannot make the coordinator publish (and relaunch
// the job) twice for one failure.
func FuzzHandlers(f *testing.F) {
	t0 := time.Unix(1e9, 0).UTC()
	rep, _ := json.Marshal(Failure{Node: "n2", Class: ClassNode, Cause: "x", Reporter: "n1", LastHeard: t0, DetectedAt: t0.Add(time.Second)})
	hang, _ := json.Marshal(Failure{Node: "n1", Class: ClassHang, Ranks: []int{3, 1}, LastHeard: t0, DetectedAt: t0, Published: true, Coordinator: "n1"})
	for _, s := range []struct {
		t    uint8
		from string
		p    []byte
	}{
		{uint8(peer.TBeat), "n1", []byte(`{"node":"n1"}`)}, {uint8(peer.TBeat), "n2", []byte(`{"node":"n2","leaving":true}`)},
		{uint8(peer.TProbe), "n1", []byte(`{"node":"n0"}`)}, {uint8(peer.TProbe), "n1", []byte(`{"node":"nx"}`)},
		{uint8(peer.TFailure), "n1", rep}, {uint8(peer.TFailure), "n2", hang}, {uint8(peer.TFailure), "stranger", []byte(`{"node":"n0"}`)},
		{uint8(peer.TBeat), "n1", []byte(`[`)}, {uint8(peer.TFailure), "n1", []byte(`{"node":"n1","detected_at":"9999-12-31T23:59:59Z","last_heard":"0001-01-01T00:00:00Z"}`)},
	} {
		f.Add(s.t, s.from, s.p)
	}
	f.Fuzz(func(t *testing.T, typ uint8, from string, p []byte) {
		var mu sync.Mutex
		published := 0
		d, err := New(Config{Self: "n0", Nodes: []Node{{Name: "n0"}, {Name: "n1", Index: 1}, {Name: "n2", Index: 2}},
			Transport: downTransport{}, NodeUp: func(context.Context, Node) (Reach, error) { return Refused, nil },
			Interval: time.Millisecond, Timeout: 2 * time.Millisecond, Confirm: 5 * time.Millisecond, Window: 4 * time.Millisecond,
			OnFailure: func(Failure) { mu.Lock(); published++; mu.Unlock() }, Log: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		hs := handlerSet{}
		if err := d.Register(hs); err != nil {
			t.Fatal(err)
		}
		types := []peer.Type{peer.TBeat, peer.TProbe, peer.TFailure}
		pt := types[int(typ)%len(types)]
		call := func() any {
			reply, err := hs[pt](context.Background(), from, p)
			if err != nil {
				var pe *peer.Error
				if !errors.As(err, &pe) || pe.Code != peer.CodeMalformed {
					t.Fatalf("%v frame: error %v is not a malformed-frame error", pt, err)
				}
				return nil
			}
			if _, err := json.Marshal(reply); err != nil {
				t.Fatalf("%v reply %+v does not encode: %v", pt, reply, err)
			}
			return reply
		}
		first := call()
		if pt != peer.TFailure || first == nil {
			return
		}
		var fl Failure
		if json.Unmarshal(p, &fl) != nil || fl.LastHeard.After(fl.DetectedAt) {
			return // not a report of one failure; same() need not match it
		}
		if r := call().(failureReply); !r.Duplicate {
			t.Fatalf("the second report of %+v is not a duplicate", fl)
		}
		mu.Lock()
		defer mu.Unlock()
		if published > 1 {
			t.Fatalf("one failure published %d times", published)
		}
	})
}
