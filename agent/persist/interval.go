package persist

import (
	"fmt"
	"math"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/internal/jit"
	"github.com/reft-hpc/reft/spank/spec"
)

// FirstRetry is how long a time-based policy waits before it tries the
// first persistent write again after it failed.
const FirstRetry = 5 * time.Minute

// maxPeriodLog2 caps the step interval at 2^40 steps.
const maxPeriodLog2 = 40

// Interval decides which committed steps are persisted. A job-wide restore
// needs the same step on every rank, and each node's agent decides alone,
// so the decision is a function of the step: a rank's generation is
// persisted when its step reaches a multiple of the period (in steps) that
// the rank's previous commit had not reached. persist=N uses N. A duration,
// and auto's JIT optimum 1/c*, become a number of steps from the measured
// step time, rounded to a power of two: agents whose measurements differ a
// little still choose the same period, and where they differ by a factor
// of two, the coarser one's steps are a subset of the finer one's. The
// time-based policies persist the first generation they see at once (auto
// needs one write to measure o).
type Interval struct {
	policy spec.Persist
	f      float64 // failures per node per day
	log    zerolog.Logger

	period  int64 // steps; 0 until known
	first   int64 // the first step persisted (time-based); -1: none yet
	retryAt time.Time
	prev    map[int]int64 // each rank's previous committed step

	// Step time over the current timeline: the first and the newest step
	// this agent saw committed, and when.
	s0, s1 int64
	t0, t1 time.Time
	seen   bool

	o     time.Duration // total write time of the last persisted step
	oStep int64
	ranks map[int]bool
	world int
}

// NewInterval returns the decision for policy (not PersistOff) and says
// in log which interval is in effect and why.
func NewInterval(policy spec.Persist, failuresPerNodeDay float64, log zerolog.Logger) *Interval {
	iv := &Interval{policy: policy, f: failuresPerNodeDay, log: log, first: -1, oStep: -1,
		prev: map[int]int64{}, ranks: map[int]bool{}}
	ev := log.Info().Str("event", "persist_interval").Str("persist", policy.String())
	switch policy.Kind {
	case spec.PersistSteps:
		iv.period = int64(policy.Steps)
		ev.Int64("interval_steps", iv.period).Msgf("persistent checkpoints every %d steps (persist=%d in --reft): "+
			"the first generation committed at or after each multiple of %d, the same steps on every node", iv.period, iv.period, iv.period)
	case spec.PersistDuration:
		ev.Msgf("persistent checkpoints every %s (persist=%s in --reft): the first generation now, then every power-of-two number of steps "+
			"nearest %s once the step time is measured, so that every node persists the same steps", policy.Every, policy, policy.Every)
	default:
		ev.Float64("failures_per_node_day", iv.f).Msgf("persistent checkpoints at the JIT optimum (persist=auto): every 1/c*, "+
			"c* = sqrt(N f / (2 o)) with f = %g failures per node per day (reft.toml persist.failures_per_node_day), "+
			"N the job's nodes and o this agent's persistent write time; the first generation now, to measure o", iv.f)
	}
	return iv
}

// Period is the interval in steps; 0 while it is not known yet.
func (iv *Interval) Period() int64 { return iv.period }

// Registered tells the interval of a rank on this node and the job's size,
// from which auto estimates the job's nodes.
func (iv *Interval) Registered(rank, world int) {
	iv.ranks[rank] = true
	iv.world = max(iv.world, world)
}

// nodes estimates N as the world size over the ranks on this node.
func (iv *Interval) nodes() int {
	if len(iv.ranks) == 0 || iv.world < 1 {
		return 1
	}
	return (iv.world + len(iv.ranks) - 1) / len(iv.ranks)
}

// Commit records that rank committed step at time at and reports whether
// that generation is to be persisted.
func (iv *Interval) Commit(rank int, step int64, at time.Time) bool {
	prev, had := iv.prev[rank]
	iv.prev[rank] = step
	switch {
	case had && step <= prev: // the job went back (a restore): a new timeline
		had = false
		iv.s0, iv.t0, iv.s1, iv.t1, iv.seen = step, at, step, at, true
	case !iv.seen:
		iv.s0, iv.t0, iv.s1, iv.t1, iv.seen = step, at, step, at, true
	case step > iv.s1: // ranks lagging behind the newest step say nothing new
		iv.s1, iv.t1 = step, at
	}
	iv.update()
	if p := iv.period; p > 0 && ((had && step/p > prev/p) || (!had && step%p == 0)) {
		return true
	}
	if iv.policy.Kind == spec.PersistSteps {
		return false
	}
	if iv.first < 0 && iv.period == 0 && !at.Before(iv.retryAt) {
		iv.first = step
	}
	return step == iv.first
}

// Wrote records the outcome of persisting step: d is the time its
// successful writes took (ok: there was one); failed: a write failed.
// After a failed first write of a time-based policy it returns how long
// until the next try. A first step that needed no write (already
// persisted) measured nothing: the next commit is tried at once.
func (iv *Interval) Wrote(step int64, d time.Duration, ok, failed bool, at time.Time) time.Duration {
	if !ok {
		if iv.policy.Kind != spec.PersistSteps && iv.period == 0 && step == iv.first {
			iv.first = -1
			if failed {
				iv.retryAt = at.Add(FirstRetry)
				return FirstRetry
			}
		}
		return 0
	}
	if step == iv.oStep {
		iv.o += d // ranks that committed late were written in a later round
	} else {
		iv.oStep, iv.o = step, d
	}
	return 0
}

// stepTime is the mean wall time per step over the current timeline.
func (iv *Interval) stepTime() time.Duration {
	if !iv.seen || iv.s1 <= iv.s0 || !iv.t1.After(iv.t0) {
		return 0
	}
	return iv.t1.Sub(iv.t0) / time.Duration(iv.s1-iv.s0)
}

// update derives the period of the time-based policies once their inputs
// are known, and changes it only when the ideal moves more than a factor
// of two away, so that noise does not flip it.
func (iv *Interval) update() {
	st := iv.stepTime()
	if iv.policy.Kind == spec.PersistSteps || st <= 0 {
		return
	}
	var target time.Duration
	var why string
	switch iv.policy.Kind {
	case spec.PersistDuration:
		target = iv.policy.Every
		why = fmt.Sprintf("persist=%s", iv.policy)
	default:
		if iv.o <= 0 {
			return
		}
		n := iv.nodes()
		secs := jit.OptimalInterval(float64(n), iv.f, iv.o.Seconds())
		if math.IsNaN(secs) || math.IsInf(secs, 0) {
			return
		}
		target = time.Duration(secs * float64(time.Second))
		why = fmt.Sprintf("JIT optimum 1/c* = %s (c* = sqrt(N f / (2 o)), N = %d nodes (world %d / %d ranks here), f = %g per node-day, o = %s, "+
			"this agent's last persistent write)", target.Round(time.Second), n, iv.world, len(iv.ranks), iv.f, iv.o.Round(time.Millisecond))
	}
	ideal := target.Seconds() / st.Seconds()
	if iv.period > 0 && math.Abs(math.Log2(ideal/float64(iv.period))) <= 1 {
		return
	}
	p := int64(1)
	if ideal > 1 {
		p = int64(1) << min(int(math.Round(math.Log2(ideal))), maxPeriodLog2)
	}
	if p == iv.period {
		return
	}
	old := iv.period
	iv.period = p
	msg := fmt.Sprintf("%s at %s per step (measured over steps %d..%d) is %.1f steps, "+
		"rounded to a power of two so that every node persists the same steps", why, st.Round(time.Millisecond), iv.s0, iv.s1, ideal)
	if old > 0 {
		msg = fmt.Sprintf("persistent checkpoint interval changed from %d to %d steps: %s", old, p, msg)
	} else {
		msg = fmt.Sprintf("persistent checkpoints every %d steps: %s", p, msg)
	}
	iv.log.Info().Str("event", "persist_interval").Str("persist", iv.policy.String()).Int64("interval_steps", p).
		Float64("step_seconds", st.Seconds()).Float64("target_seconds", target.Seconds()).Float64("o_seconds", iv.o.Seconds()).
		Int("nodes", iv.nodes()).Msg(msg)
}
