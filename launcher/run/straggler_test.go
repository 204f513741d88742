package run

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reft-hpc/reft/launcher/recoverylog"
	"github.com/reft-hpc/reft/launcher/status"
)

// TestRunRecordsStragglers: while the step runs, reft run asks for
// stragglers every StragglerEvery; each straggling rank goes to the
// recovery log once per launch however often it is seen, and nothing
// else changes (the step completes, no failure, no relaunch).
func TestRunRecordsStragglers(t *testing.T) {
	h := newHarness(t, four, 0, fastPolicy(), fakeAttempt{exit: 0, linger: 200 * time.Millisecond})
	var asks atomic.Int32
	h.r.StragglerEvery = 5 * time.Millisecond
	h.r.Stragglers = func(context.Context) ([]status.Straggler, error) {
		n := asks.Add(1)
		ss := []status.Straggler{{Rank: 2, Node: "n3", ComputeS: 0.31, MedianS: 0.1, Ratio: 3.1}}
		if n > 2 { // a second one appears later
			ss = append(ss, status.Straggler{Rank: 0, Node: "n1", ComputeS: 0.2, MedianS: 0.1, Ratio: 2})
		}
		return ss, nil
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

// TestRunStragglerAskFails: an ask that fails is said once and the step
// runs on.
func TestRunStragglerAskFails(t *testing.T) {
	h := newHarness(t, four, 0, fastPolicy(), fakeAttempt{exit: 0, linger: 100 * time.Millisecond})
	h.r.StragglerEvery = 5 * time.Millisecond
	h.r.Stragglers = func(context.Context) ([]status.Straggler, error) {
		return nil, errors.New("squeue: connection refused")
	}
	if code := h.r.Run(context.Background()); code != ExitOK {
		t.Fatalf("exit %d\n%s", code, h.out.String())
	}
	if n := strings.Count(h.out.String(), "cannot ask the agents for stragglers (squeue: connection refused)"); n != 1 {
		t.Errorf("said %d times, want once:\n%s", n, h.out.String())
	}
}
