package run

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reft-hpc/reft/agent/metrics"
	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/launcher/recoverylog"
	"github.com/reft-hpc/reft/launcher/status"
)

// TestRunRecordsStragglers: while the step runs, reft run asks for
// stragglers every HealthEvery; each straggling rank goes to the
// recovery log once per launch however often it is seen, and nothing
// else changes (the step completes, no failure, no relaunch).
func TestRunRecordsStragglers(t *testing.T) {
	h := newHarness(t, four, 0, fastPolicy(), fakeAttempt{exit: 0, linger: 200 * time.Millisecond})
	var asks atomic.Int32
	h.r.HealthEvery = 5 * time.Millisecond
	h.r.Health = func(context.Context) (AgentHealth, error) {
		n := asks.Add(1)
		ss := []status.Straggler{{Rank: 2, Node: "n3", ComputeS: 0.31, MedianS: 0.1, Ratio: 3.1}}
		if n > 2 { // a second one appears later
			ss = append(ss, status.Straggler{Rank: 0, Node: "n1", ComputeS: 0.2, MedianS: 0.1, Ratio: 2})
		}
		return AgentHealth{Stragglers: ss}, nil
	}
	if code := h.r.Run(context.Background()); code != ExitOK {
		t.Fatalf("exit %d\n%s", code, h.out.String())
	}
	if asks.Load() < 3 {
		t.Fatalf("asked %d times during a 200 ms step every 5 ms; the test proves nothing", asks.Load())
	}
	ev := h.events()
	ss := find(ev, recoverylog.Straggler)
	if len(ss) != 2 || ss[0].Node != "n3" || !slices.Equal(ss[0].Ranks, []int{2}) || ss[0].DurationS != 0.31 || ss[0].Step != "42.0" ||
		!strings.HasPrefix(ss[0].Cause, "straggler: rank 2 on n3 works 310ms per step") || ss[1].Node != "n1" || !slices.Equal(ss[1].Ranks, []int{0}) {
		t.Errorf("straggler events %+v; want rank 2 on n3, then rank 0 on n1, once each", ss)
	}
	if n := len(find(ev, recoverylog.FailureDetected)) + len(find(ev, recoverylog.StepRelaunched)); n != 0 || names(ev)[len(ev)-1] != recoverylog.Completed {
		t.Errorf("events %v: a straggler must change nothing else", names(ev))
	}
	if got := recoverylog.Format(ss[0]); !strings.HasPrefix(got, ss[0].Cause) {
		t.Errorf("reft log shows %q, want the cause first", got)
	}
}

// TestRunHealthAskFails: an ask that fails is said once and the step
// runs on.
func TestRunHealthAskFails(t *testing.T) {
	h := newHarness(t, four, 0, fastPolicy(), fakeAttempt{exit: 0, linger: 100 * time.Millisecond})
	h.r.HealthEvery = 5 * time.Millisecond
	h.r.Health = func(context.Context) (AgentHealth, error) {
		return AgentHealth{}, errors.New("squeue: connection refused")
	}
	if code := h.r.Run(context.Background()); code != ExitOK {
		t.Fatalf("exit %d\n%s", code, h.out.String())
	}
	if n := strings.Count(h.out.String(), "cannot ask the agents for stragglers and degraded nodes (squeue: connection refused)"); n != 1 {
		t.Errorf("said %d times, want once:\n%s", n, h.out.String())
	}
}

// TestDegradedChanges: a node's warnings are said once they are the same
// in two asks in a row, again only when they change, and "no longer
// degraded" once when they are gone; a one-ask blip is never said.
func TestDegradedChanges(t *testing.T) {
	peering := []string{metrics.ReasonPeering}
	lost := []string{metrics.ReasonPeerLost}
	type step struct {
		ask          map[string][]string
		wantDegraded map[string]string
		wantRestored []string
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"healthy", []step{{nil, map[string]string{}, nil}, {nil, map[string]string{}, nil}}},
		{"one-ask blip (a new agent's peering coming up)", []step{
			{map[string][]string{"n1": peering}, map[string]string{}, nil},
			{nil, map[string]string{}, nil},
			{nil, map[string]string{}, nil},
		}},
		{"said once, then restored once", []step{
			{map[string][]string{"n1": peering}, map[string]string{}, nil},
			{map[string][]string{"n1": peering}, map[string]string{"n1": peering[0]}, nil},
			{map[string][]string{"n1": peering}, map[string]string{}, nil},
			{nil, map[string]string{}, []string{"n1"}},
			{nil, map[string]string{}, nil},
		}},
		{"a change is said again after two asks", []step{
			{map[string][]string{"n1": peering}, map[string]string{}, nil},
			{map[string][]string{"n1": peering}, map[string]string{"n1": peering[0]}, nil},
			{map[string][]string{"n1": append(slices.Clone(peering), lost...)}, map[string]string{}, nil},
			{map[string][]string{"n1": append(slices.Clone(peering), lost...)}, map[string]string{"n1": peering[0] + ", " + lost[0]}, nil},
		}},
		{"two nodes, one restored", []step{
			{map[string][]string{"n1": peering, "n3": lost}, map[string]string{}, nil},
			{map[string][]string{"n1": peering, "n3": lost}, map[string]string{"n1": peering[0], "n3": lost[0]}, nil},
			{map[string][]string{"n3": lost}, map[string]string{}, []string{"n1"}},
		}},
		{"empty warnings are no warnings", []step{
			{map[string][]string{"n1": {}}, map[string]string{}, nil},
			{map[string][]string{"n1": {}}, map[string]string{}, nil},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newHealthWatch(nil, time.Second)
			for i, st := range tc.steps {
				deg, res := w.degradedChanges(st.ask)
				if !maps.Equal(deg, st.wantDegraded) || !slices.Equal(res, st.wantRestored) {
					t.Errorf("ask %d: degraded %q restored %q, want %q and %q", i, deg, res, st.wantDegraded, st.wantRestored)
				}
			}
		})
	}
}

// TestRunRecordsDegraded: a node whose agent reports warnings goes to the
// recovery log as degraded (a warning, the warnings as its cause) once,
// and as no longer degraded once its warnings are gone; the step runs on
// untouched.
func TestRunRecordsDegraded(t *testing.T) {
	h := newHarness(t, four, 0, fastPolicy(), fakeAttempt{exit: 0, linger: 300 * time.Millisecond})
	var asks atomic.Int32
	h.r.HealthEvery = 5 * time.Millisecond
	h.r.Health = func(context.Context) (AgentHealth, error) {
		if asks.Add(1) <= 6 {
			return AgentHealth{Degraded: map[string][]string{"n2": {metrics.ReasonPeering, metrics.ReasonRankLocal}}}, nil
		}
		return AgentHealth{}, nil
	}
	if code := h.r.Run(context.Background()); code != ExitOK {
		t.Fatalf("exit %d\n%s", code, h.out.String())
	}
	if asks.Load() < 8 {
		t.Fatalf("asked %d times during a 300 ms step every 5 ms; the test proves nothing", asks.Load())
	}
	ev := h.events()
	d, c := find(ev, recoverylog.Degraded), find(ev, recoverylog.DegradedCleared)
	if len(d) != 1 || d[0].Node != "n2" || d[0].Cause != "protection below the SPEC (peering, rank_local); `reft status` says why" || d[0].Level != "warn" || d[0].Step != "42.0" {
		t.Errorf("degraded events %+v; want one, n2's warning, at warn level", d)
	}
	if len(c) != 1 || c[0].Node != "n2" {
		t.Errorf("cleared events %+v; want one for n2", c)
	}
	if n := len(find(ev, recoverylog.FailureDetected)) + len(find(ev, recoverylog.StepRelaunched)); n != 0 || names(ev)[len(ev)-1] != recoverylog.Completed {
		t.Errorf("events %v: a degraded node must change nothing else", names(ev))
	}
	if got := recoverylog.Format(d[0]); !strings.HasPrefix(got, "degraded on n2: protection below the SPEC (peering, rank_local)") {
		t.Errorf("reft log shows %q", got)
	}
	if !strings.Contains(h.out.String(), "degraded on n2: protection below the SPEC (peering, rank_local)") {
		t.Errorf("reft run did not say it:\n%s", h.out.String())
	}
}

// TestHealthOf: a node is degraded when its agent's status falls short of
// its SPEC (metrics.Degraded), in the allocation only; a warning that is
// no loss of protection (unpinned arenas) is not degradation.
func TestHealthOf(t *testing.T) {
	on := &proto.Peering{State: proto.PeeringOn}
	rep := &status.Report{
		Nodes: []status.NodeReport{
			{Node: "n1", InAllocation: true, Status: &proto.Status{Spec: "arc", Peering: on, Memory: &proto.Memory{UnpinnedArenas: 2}}},
			{Node: "n2", InAllocation: true, Status: &proto.Status{Spec: "arc", Peering: &proto.Peering{State: proto.PeeringOff}}},
			{Node: "n3", InAllocation: false, Status: &proto.Status{Spec: "arc"}},
			{Node: "n4", InAllocation: true},
		},
		Stragglers: []status.Straggler{{Rank: 1, Node: "n2"}},
	}
	h := healthOf(rep)
	if len(h.Stragglers) != 1 || len(h.Degraded) != 1 || !slices.Equal(h.Degraded["n2"], []string{metrics.ReasonPeering}) {
		t.Errorf("healthOf = %+v; want n2 degraded (peering) alone", h)
	}
	if h := healthOf(&status.Report{Nodes: rep.Nodes[:1]}); h.Degraded != nil {
		t.Errorf("no loss of protection: Degraded = %v, want nil", h.Degraded)
	}
}
