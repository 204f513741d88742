// Package stepend holds the end of a failed step on a surviving node until
// the node the step lost has left the job.
//
// Why: slurmctld (seen with 22.05) ends a step only when the last of its
// nodes reports it complete through the step-complete RPC. A node removed
// from a running job (reft run giving a lost node back with `scontrol
// update NodeList=`, or Slurm dropping a DOWN node of a --no-kill job) is
// marked complete without that ending. So when the survivors report first
// (their ranks die within milliseconds of the peer's loss, long before
// anyone calls the node lost), the step stays RUNNING for as long as the
// job lives, holding its CPUs: any later srun of the job without --overlap
// waits forever. Held until the lost node is out of the job, the
// survivors' reports come last and the step ends.
package stepend

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Hold is one step's end on one node.
type Hold struct {
	// StepNodes are the step's nodes.
	StepNodes []string
	// Lost asks the node's agent which nodes its failure detector
	// published lost (an error: no agent to ask, so no hold).
	Lost func(ctx context.Context) ([]string, error)
	// JobNodes asks Slurm which nodes the job holds now.
	JobNodes func(ctx context.Context) ([]string, error)
	// Verdict is how long to wait for the agents' verdict after the
	// step's tasks ended (detect.timeout + detect.confirm): a failed node
	// is confirmed after its peers' ranks have already died of it.
	Verdict time.Duration
	// Settle is how long after the first lost node the agents' verdicts
	// on others still count (nodes lost together are confirmed a beat or
	// two apart); each must leave the job before the hold ends.
	Settle time.Duration
	// Max bounds the hold once a lost node of the step is known.
	Max time.Duration
	// Poll is the interval between questions (default 100 ms).
	Poll time.Duration
}

// Result says what the hold did, for the node's slurmd log.
type Result struct {
	Lost   []string      // the step's nodes the agents called lost
	Held   time.Duration // how long the step's end was held
	Left   bool          // every lost node left the job within Max
	Reason string        // why there was no hold, or why it ended
}

func (r Result) String() string {
	switch {
	case len(r.Lost) == 0:
		return "no hold: " + r.Reason
	case r.Left:
		return fmt.Sprintf("held the step's end %.1f s until lost node(s) %s left the job", r.Held.Seconds(), strings.Join(r.Lost, ","))
	}
	return fmt.Sprintf("held the step's end %.1f s; lost node(s) %s still in the job: %s", r.Held.Seconds(), strings.Join(r.Lost, ","), r.Reason)
}

// Run waits for a verdict on a node of the step, then for that node to
// leave the job; it returns at once when no agent answers.
func (h Hold) Run(ctx context.Context) Result {
	poll := h.Poll
	if poll <= 0 {
		poll = 100 * time.Millisecond
	}
	start := time.Now()
	var res Result
	var first time.Time // when the first lost node of the step was known
	for {
		ln, err := h.Lost(ctx)
		switch {
		case err != nil && len(res.Lost) == 0:
			return Result{Reason: "no agent to ask: " + err.Error()}
		case err == nil: // after a verdict the agent may be stopping: keep what it said
			for _, n := range ln {
				if slices.Contains(h.StepNodes, n) && !slices.Contains(res.Lost, n) {
					res.Lost = append(res.Lost, n)
				}
			}
		}
		now := time.Now()
		if len(res.Lost) == 0 {
			if now.Sub(start) >= h.Verdict {
				return Result{Reason: fmt.Sprintf("the agents found no node of the step lost within %s", h.Verdict)}
			}
		} else {
			if first.IsZero() {
				first = now
			}
			nodes, err := h.JobNodes(ctx)
			out := err == nil && !slices.ContainsFunc(res.Lost, func(n string) bool { return slices.Contains(nodes, n) })
			if out && now.Sub(first) >= h.Settle {
				res.Held, res.Left, res.Reason = time.Since(start), true, ""
				return res
			}
			switch {
			case err != nil:
				res.Reason = err.Error()
			case !out:
				res.Reason = fmt.Sprintf("gave up after %s (Slurm may keep this step until the job ends; later steps of the job need srun --overlap)", h.Max)
			}
			if now.Sub(first) >= h.Max {
				res.Held = time.Since(start)
				return res
			}
		}
		if !sleep(ctx, poll) {
			res.Held = time.Since(start)
			if len(res.Lost) == 0 {
				res.Reason = "cancelled"
			}
			return res
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
