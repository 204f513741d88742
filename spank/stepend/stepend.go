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
	var lost []string
	for deadline := start.Add(h.Verdict); ; {
		ln, err := h.Lost(ctx)
		if err != nil {
			return Result{Reason: "no agent to ask: " + err.Error()}
		}
		for _, n := range ln {
			if slices.Contains(h.StepNodes, n) && !slices.Contains(lost, n) {
				lost = append(lost, n)
			}
		}
		if len(lost) > 0 {
			break
		}
		if !time.Now().Before(deadline) {
			return Result{Reason: fmt.Sprintf("the agents found no node of the step lost within %s", h.Verdict)}
		}
		if !sleep(ctx, poll) {
			return Result{Reason: "cancelled"}
		}
	}
	res := Result{Lost: lost}
	for deadline := time.Now().Add(h.Max); ; {
		nodes, err := h.JobNodes(ctx)
		if err == nil && !slices.ContainsFunc(lost, func(n string) bool { return slices.Contains(nodes, n) }) {
			res.Held, res.Left = time.Since(start), true
			return res
		}
		if err != nil {
			res.Reason = err.Error()
		} else {
			res.Reason = fmt.Sprintf("gave up after %s (Slurm may keep this step until the job ends; later steps of the job need srun --overlap)", h.Max)
		}
		if !time.Now().Before(deadline) || !sleep(ctx, poll) {
			res.Held = time.Since(start)
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
