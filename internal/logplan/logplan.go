// Package logplan is SWIFT's selective logging planner (SWIFT section 5.3)
// and its rule for which protection a pipeline stage gets: a neutral model
// package of pure functions, so that `reft plan logging` (launcher/plan)
// and, later, the agent decide with the same math.
//
// The machines of a pipeline (one entry per node, in pipeline order; a node
// that hosts several stages is one entry) are cut into groups of
// consecutive nodes. What crosses a group boundary is logged by its sender
// in host memory (activations forward, gradients backward); what crosses
// inside a group is not. A failed node's whole group restores its snapshot
// and replays from the logs at the group's two edges.
//
// Cost model (SWIFT section 5.3, each term as the paper states it):
//
//	R(G)      = sum of the group's per-step compute times
//	            + sum over its inner boundaries of M(i,i+1)/B     (merge equation)
//	R(𝒢)      = sum over groups of |G|/N * R(G)                   (ΔR's expected value:
//	                                                               every node fails alike)
//	M(i,i+1)  = forward + backward bytes crossing boundary i per step
//
// and the objective min R(𝒢) subject to the memory cap. Choose solves it
// exactly (Optimal) or with the paper's greedy merges (Greedy).
//
// reft's memory differs from the paper's in two ways, both from how the
// agent holds logs. (1) The paper caps the total, M(𝒢) = T * sum M(G_i,
// G_i+1) <= M_max; reft keeps a log on its sender's node, under that node's
// memory budget, so the cap is per node: node i holds the forward log of
// boundary i and the backward log of boundary i-1. (2) Logs are truncated
// at each snapshot of the receiving stage, and those since the second
// newest snapshot are kept (the newest may be incomplete when a failure
// strikes), so one logged direction of a boundary costs
// bytes/step * T * KeptIntervals.
package logplan

import (
	"fmt"
	"math"
)

// MaxStages bounds N: a pipeline spans at most a few hundred nodes, and
// the planners are O(N²).
const MaxStages = 4096

// KeptIntervals is how many snapshot intervals of logs a sender keeps:
// those since the second newest snapshot of the receiving stage.
const KeptIntervals = 2

// Input is one pipeline's measurements and limits. N = len(StageSeconds)
// nodes; boundary i lies between node i and node i+1.
type Input struct {
	// StageSeconds[i] is node i's compute time per training step, forward
	// plus backward over all micro-batches (the paper's R(G_i)).
	StageSeconds []float64
	// ForwardBytes[i] are the activation bytes node i sends to node i+1
	// per step; BackwardBytes[i] the gradient bytes node i+1 sends back.
	ForwardBytes, BackwardBytes []float64
	// Bandwidth is the node-to-node bandwidth in bytes per second (B).
	Bandwidth float64
	// Interval is the snapshot interval in steps (T).
	Interval int
	// NodeCap is the most log bytes one node may hold; math.Inf(1) is
	// unlimited, 0 forbids logging.
	NodeCap float64
	// StepSeconds is the pipeline's measured wall-clock time of one
	// training step: what a full restart recomputes per lost step.
	StepSeconds float64
}

// Group is the nodes First..Last (inclusive) of the pipeline.
type Group struct{ First, Last int }

// Size is the number of nodes in g.
func (g Group) Size() int { return g.Last - g.First + 1 }

// Plan is a grouping and what it costs.
type Plan struct {
	Groups []Group
	// Logged[i] says whether boundary i is logged (it is a group edge).
	Logged []bool
	// NodeLogBytes[i] is the log memory node i holds at most.
	NodeLogBytes []float64
	// ReplaySeconds[g] is R(Groups[g]): the time to replay one lost step.
	ReplaySeconds []float64
	// LostSteps is the steps a failure loses on average: Interval/2, for
	// a failure at a uniformly random point of the snapshot interval.
	LostSteps float64
	// Expected is R(𝒢) * LostSteps: the expected recovery time of one
	// node failure, every node equally likely to fail.
	Expected float64
	// FullRestart is StepSeconds * LostSteps: every stage rolls back to
	// its last snapshot and recomputes.
	FullRestart float64
}

// Fields of Input, as FieldError names them.
const (
	FieldStageSeconds  = "stage seconds"
	FieldForwardBytes  = "forward bytes"
	FieldBackwardBytes = "backward bytes"
	FieldBandwidth     = "bandwidth"
	FieldInterval      = "interval"
	FieldNodeCap       = "node cap"
	FieldStepSeconds   = "step seconds"
)

// FieldError is a bad Input field: Field names it (one of the Field
// constants) so that a caller can name its own flag or key, and Msg says
// what is wrong and the fix.
type FieldError struct{ Field, Msg string }

func (e *FieldError) Error() string { return e.Msg }

func bad(field, format string, a ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, a...)}
}

// Validate checks the input; its errors are *FieldError.
func (in Input) Validate() error {
	n := len(in.StageSeconds)
	if n == 0 {
		return bad(FieldStageSeconds, "no stages: give one compute time per node of the pipeline")
	}
	if n > MaxStages {
		return bad(FieldStageSeconds, "%d stages, more than %d: give one entry per node of one pipeline", n, MaxStages)
	}
	for i, s := range in.StageSeconds {
		if !(s > 0) || math.IsInf(s, 0) {
			return bad(FieldStageSeconds, "stage %d's compute time is %v: every stage needs a measured time > 0 seconds per step", i, s)
		}
	}
	if err := checkMessages(FieldForwardBytes, "forward", in.ForwardBytes, n); err != nil {
		return err
	}
	if err := checkMessages(FieldBackwardBytes, "backward", in.BackwardBytes, n); err != nil {
		return err
	}
	switch {
	case !(in.Bandwidth > 0) || math.IsInf(in.Bandwidth, 0):
		return bad(FieldBandwidth, "bandwidth %v: give the node-to-node bandwidth in bytes per second (> 0)", in.Bandwidth)
	case in.Interval < 1:
		return bad(FieldInterval, "snapshot interval %d: give the steps between snapshots (>= 1)", in.Interval)
	case !(in.NodeCap >= 0):
		return bad(FieldNodeCap, "node log cap %v: give bytes >= 0, or +Inf for unlimited", in.NodeCap)
	case !(in.StepSeconds > 0) || math.IsInf(in.StepSeconds, 0):
		return bad(FieldStepSeconds, "step time %v: give the pipeline's measured seconds per training step (> 0)", in.StepSeconds)
	}
	return in.checkRange()
}

// checkMessages checks one direction's sizes: one per boundary, each > 0.
func checkMessages(field, name string, v []float64, n int) error {
	if len(v) != n-1 {
		return bad(field, "%d %s message sizes for %d stages: give one per boundary, %d", len(v), name, n, n-1)
	}
	for i, b := range v {
		if !(b > 0) || math.IsInf(b, 0) {
			return bad(field, "%s bytes at boundary %d|%d are %v: a pipeline boundary carries data every step; measure it (> 0)", name, i, i+1, b)
		}
	}
	return nil
}

// checkRange refuses measurements whose products overflow (a unit
// mistake: bytes for GiB, seconds for ms), which would reach the report
// as +Inf.
func (in Input) checkRange() error {
	lost := float64(in.Interval) / 2
	if math.IsInf(in.StepSeconds*lost, 0) {
		return bad(FieldStepSeconds, "step time %v over %d steps overflows: check the unit (seconds)", in.StepSeconds, in.Interval)
	}
	m := newModel(in)
	n := len(in.StageSeconds)
	if math.IsInf(m.compute[n]*lost, 0) {
		return bad(FieldStageSeconds, "the stages' compute times overflow when summed: check the unit (seconds)")
	}
	if math.IsInf(m.comm[n-1]*lost, 0) || math.IsInf(m.replay(0, n-1)*lost, 0) {
		return bad(FieldBandwidth, "the transfer times (bytes / bandwidth) overflow: check the units (bytes, bytes per second)")
	}
	for i := 0; i < n-1; i++ {
		if math.IsInf(in.logBytes(in.ForwardBytes[i])+in.logBytes(in.BackwardBytes[i]), 0) {
			return bad(FieldForwardBytes, "the log of boundary %d|%d over %d steps overflows: check the unit (bytes)", i, i+1, in.Interval)
		}
	}
	return nil
}

// model is an Input with the prefix sums that make R(G) O(1): compute[i]
// is the compute of nodes 0..i-1, comm[i] the transfers across
// boundaries 0..i-1.
type model struct {
	Input
	compute, comm []float64
}

func newModel(in Input) *model {
	n := len(in.StageSeconds)
	m := &model{Input: in, compute: make([]float64, n+1), comm: make([]float64, n)}
	for i, c := range in.StageSeconds {
		m.compute[i+1] = m.compute[i] + c
		if i < n-1 {
			m.comm[i+1] = m.comm[i] + (in.ForwardBytes[i]+in.BackwardBytes[i])/in.Bandwidth
		}
	}
	return m
}

// logBytes is what one logged direction of a boundary costs its sender.
func (in Input) logBytes(perStep float64) float64 {
	return perStep * float64(in.Interval) * KeptIntervals
}

// nodeBytes is node i's log memory when logged says which boundaries are
// logged: the forward log of boundary i and the backward log of i-1.
func (in Input) nodeBytes(i int, logged []bool) float64 {
	var b float64
	if i < len(logged) && logged[i] {
		b += in.logBytes(in.ForwardBytes[i])
	}
	if i > 0 && logged[i-1] {
		b += in.logBytes(in.BackwardBytes[i-1])
	}
	return b
}

// replay is R(G) for the nodes first..last: their compute plus the
// transfers across their inner boundaries, which replay also redoes.
func (m *model) replay(first, last int) float64 {
	return m.compute[last+1] - m.compute[first] + m.comm[last] - m.comm[first]
}

// weighted is |G|/N * R(G): G's share of the expected recovery per step.
func (m *model) weighted(first, last int) float64 {
	return float64(last-first+1) / float64(len(m.StageSeconds)) * m.replay(first, last)
}

// planFor fills in a Plan for the groups whose edges logged marks.
func (m *model) planFor(logged []bool) Plan {
	in := m.Input
	n := len(in.StageSeconds)
	p := Plan{Logged: logged, NodeLogBytes: make([]float64, n), LostSteps: float64(in.Interval) / 2}
	first := 0
	perStep := 0.0
	for i := 0; i < n; i++ {
		p.NodeLogBytes[i] = in.nodeBytes(i, logged)
		if i == n-1 || logged[i] {
			p.Groups = append(p.Groups, Group{first, i})
			p.ReplaySeconds = append(p.ReplaySeconds, m.replay(first, i))
			perStep += m.weighted(first, i)
			first = i + 1
		}
	}
	p.Expected = perStep * p.LostSteps
	p.FullRestart = in.StepSeconds * p.LostSteps
	return p
}
