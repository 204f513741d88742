package stepend

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

// seq answers call i with answers[min(i, last)].
type seq[T any] struct {
	answers []T
	errs    []error
	calls   int
}

func (s *seq[T]) next(context.Context) (T, error) {
	i := min(s.calls, len(s.answers)-1)
	s.calls++
	var err error
	if i < len(s.errs) {
		err = s.errs[i]
	}
	return s.answers[i], err
}

func TestHold(t *testing.T) {
	step := []string{"n1", "n2", "n3", "n4"}
	all := []string{"n1", "n2", "n3", "n4", "n5"}
	shrunk := []string{"n1", "n3", "n4", "n5"}
	noAgent := errors.New("dial unix agent.sock: connect: no such file or directory")
	for _, tc := range []struct {
		name     string
		lost     seq[[]string]
		job      seq[[]string]
		wantLost []string
		left     bool
		reason   string // substring of String()
		jobCalls int    // at least
		settle   time.Duration
	}{
		{name: "no agent", lost: seq[[]string]{answers: [][]string{nil}, errs: []error{noAgent}},
			job: seq[[]string]{answers: [][]string{all}}, reason: "no hold: no agent to ask"},
		{name: "no verdict: a rank failed, no node", lost: seq[[]string]{answers: [][]string{nil}},
			job: seq[[]string]{answers: [][]string{all}}, reason: "no hold: the agents found no node of the step lost"},
		{name: "a lost spare is not the step's", lost: seq[[]string]{answers: [][]string{{"n5"}}},
			job: seq[[]string]{answers: [][]string{all}}, reason: "no hold"},
		{name: "verdict after the tasks died, then the shrink",
			lost:     seq[[]string]{answers: [][]string{nil, nil, {"n2"}}},
			job:      seq[[]string]{answers: [][]string{all, all, all, shrunk}},
			wantLost: []string{"n2"}, left: true, reason: "until lost node(s) n2 left the job", jobCalls: 4},
		{name: "two nodes lost together",
			lost:     seq[[]string]{answers: [][]string{{"n2", "n3"}}},
			job:      seq[[]string]{answers: [][]string{all, {"n1", "n3", "n4", "n5"}, {"n1", "n4", "n5"}}},
			wantLost: []string{"n2", "n3"}, left: true, reason: "n2,n3 left the job", jobCalls: 3},
		{name: "a second node confirmed a beat later", settle: 30 * time.Millisecond,
			lost:     seq[[]string]{answers: [][]string{{"n2"}, {"n2"}, {"n2"}, {"n2", "n3"}}},
			job:      seq[[]string]{answers: [][]string{all, {"n1", "n3", "n4", "n5"}, {"n1", "n3", "n4", "n5"}, {"n1", "n3", "n4", "n5"}, {"n1", "n4", "n5"}}},
			wantLost: []string{"n2", "n3"}, left: true, reason: "n2,n3 left the job", jobCalls: 5},
		{name: "the node never leaves", lost: seq[[]string]{answers: [][]string{{"n2"}}},
			job: seq[[]string]{answers: [][]string{all}}, wantLost: []string{"n2"}, reason: "still in the job: gave up after", jobCalls: 2},
		{name: "Slurm does not answer", lost: seq[[]string]{answers: [][]string{{"n2"}}},
			job:      seq[[]string]{answers: [][]string{nil}, errs: []error{errors.New("scontrol: slurmctld unreachable")}},
			wantLost: []string{"n2"}, reason: "still in the job: scontrol: slurmctld unreachable", jobCalls: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := Hold{StepNodes: step, Lost: tc.lost.next, JobNodes: tc.job.next,
				Verdict: 50 * time.Millisecond, Settle: tc.settle, Max: 60 * time.Millisecond, Poll: 5 * time.Millisecond}
			r := h.Run(context.Background())
			if !slices.Equal(r.Lost, tc.wantLost) || r.Left != tc.left || !strings.Contains(r.String(), tc.reason) {
				t.Errorf("%+v (%s): want lost %v, left %v, %q", r, r, tc.wantLost, tc.left, tc.reason)
			}
			if tc.jobCalls > 0 && tc.job.calls < tc.jobCalls {
				t.Errorf("Slurm asked %d times, want at least %d", tc.job.calls, tc.jobCalls)
			}
			if tc.wantLost == nil && tc.job.calls != 0 {
				t.Errorf("no lost node, yet Slurm was asked %d times", tc.job.calls)
			}
		})
	}
}

// A cancelled hold (slurmstepd ending) returns at once.
func TestHoldCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	h := Hold{StepNodes: []string{"n1"}, Lost: func(context.Context) ([]string, error) { return nil, nil },
		JobNodes: func(context.Context) ([]string, error) { return nil, nil }, Verdict: time.Hour, Max: time.Hour}
	if r := h.Run(ctx); len(r.Lost) != 0 || r.Reason != "cancelled" {
		t.Errorf("%+v: want no hold, cancelled", r)
	}
}
