package logplan

import (
	"fmt"
	"strings"
)

// Kind is how a stage's state is recovered after its node fails.
type Kind string

const (
	// Replicas: another data-parallel rank holds the same stage's state
	// and the replacement copies it (SWIFT section 3).
	Replicas Kind = "replicas (DP)"
	// Logs: the replacement restores the stage's snapshot and replays its
	// group from the logs at the group's edges (SWIFT sections 5.1, 5.3).
	Logs Kind = "logs"
	// Checkpoints: the stage restores a snapshot (its peer copy) and every
	// stage rolls back to it, as reft does without logging.
	Checkpoints Kind = "peer copies/checkpoints"
)

// StageProtection is what protects one pipeline stage, and why.
type StageProtection struct {
	Stage int
	Kind  Kind
	// Group is the stage's logging group (Kind Logs only).
	Group Group
	// Edges are the logged boundaries the group replays from, as "i|i+1"
	// (Kind Logs only).
	Edges []string
	Why   string
}

// String is the kind with the logged edges, as the reports print it.
func (s StageProtection) String() string {
	if s.Kind == Logs {
		return fmt.Sprintf("logs (group boundaries %s)", strings.Join(s.Edges, ", "))
	}
	return string(s.Kind)
}

// Protect applies SWIFT's rule, "replicas when they exist, logging when it
// is worth it, else checkpoints" (sections 3, 5.4), to a job of dp
// data-parallel replicas of a pp-stage pipeline whose logging plan is p.
// With dp >= 2 every stage has replicas, and the plan does not matter.
// With dp = 1 a stage gets logs when its group has a logged edge and its
// expected replay, R(G)*LostSteps, beats a full restart; otherwise peer
// copies/checkpoints. pp must equal the plan's stage count when dp = 1.
//
// `reft explain` does not print this: it knows a job's layout (--dp,
// --pp) but not the per-stage compute times and message sizes, nor
// whether the trainer logs, and without them the rule can only say
// "replicas" or "not replicas", which explain's sharding groups already
// show. `reft plan logging` takes the measurements and prints it.
func Protect(dp, pp int, p Plan) ([]StageProtection, error) {
	if dp < 1 || pp < 1 {
		return nil, fmt.Errorf("dp %d, pp %d: both degrees must be >= 1", dp, pp)
	}
	out := make([]StageProtection, pp)
	if dp >= 2 {
		for i := range out {
			out[i] = StageProtection{Stage: i, Kind: Replicas,
				Why: fmt.Sprintf("%d other data-parallel rank(s) hold this stage's state", dp-1)}
		}
		return out, nil
	}
	stages := 0
	for _, g := range p.Groups {
		stages += g.Size()
	}
	if stages != pp {
		return nil, fmt.Errorf("the logging plan covers %d stages, the job has pp=%d: plan with one compute time per stage", stages, pp)
	}
	for gi, g := range p.Groups {
		sp := StageProtection{Kind: Checkpoints}
		switch {
		case pp == 1:
			sp.Why = "no replica, and one stage has no boundary to log"
		case len(p.Groups) == 1:
			sp.Why = "no replica, and no boundary's log fits the node cap: one group, nothing logged"
		case p.ReplaySeconds[gi]*p.LostSteps >= p.FullRestart:
			sp.Why = fmt.Sprintf("no replica; replaying group %d (%.3g s) is no faster than a full restart (%.3g s)",
				gi, p.ReplaySeconds[gi]*p.LostSteps, p.FullRestart)
		default:
			sp = StageProtection{Kind: Logs, Group: g, Edges: edges(g, pp),
				Why: fmt.Sprintf("no replica; a failure replays stages %d-%d from the logs", g.First, g.Last)}
		}
		for s := g.First; s <= g.Last; s++ {
			sp.Stage = s
			out[s] = sp
		}
	}
	return out, nil
}

// edges names g's logged boundaries in a pipeline of pp stages.
func edges(g Group, pp int) []string {
	var e []string
	if g.First > 0 {
		e = append(e, fmt.Sprintf("%d|%d", g.First-1, g.First))
	}
	if g.Last < pp-1 {
		e = append(e, fmt.Sprintf("%d|%d", g.Last, g.Last+1))
	}
	return e
}
