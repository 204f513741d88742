package plan

import (
	"fmt"
	"math"

	"github.com/reft-hpc/reft/internal/jit"
)

const secondsPerDay = jit.SecondsPerDay

// Interval is JIT-checkpointing section 5: N GPUs, each failing f times per
// day, the whole job restarting on any failure. A periodic checkpoint costs
// o seconds of every GPU's time; a restart costs r seconds plus the work
// since the last checkpoint.
type Interval struct {
	GPUs               int
	FailuresPerGPUDay  float64 // f
	CheckpointSeconds  float64 // o
	RestartSeconds     float64 // r
	StepSeconds        float64 // one training step; 0 leaves reft out
	ReftRestartSeconds float64 // reft's restart; defaults to RestartSeconds
}

func (iv Interval) validate() error {
	switch {
	case iv.GPUs < 1:
		return fmt.Errorf("--gpus must be >= 1; got %d", iv.GPUs)
	case !(iv.FailuresPerGPUDay > 0) || math.IsInf(iv.FailuresPerGPUDay, 0):
		return fmt.Errorf("--failures-per-gpu-day must be > 0 (JIT Table 8 uses 2e-3); got %g", iv.FailuresPerGPUDay)
	case !(iv.CheckpointSeconds > 0) || math.IsInf(iv.CheckpointSeconds, 0):
		return fmt.Errorf("--checkpoint-seconds must be > 0 (the time one persistent checkpoint stalls a GPU); got %g", iv.CheckpointSeconds)
	case !(iv.RestartSeconds >= 0) || math.IsInf(iv.RestartSeconds, 0):
		return fmt.Errorf("--restart-seconds must be >= 0; got %g", iv.RestartSeconds)
	case !(iv.StepSeconds >= 0) || math.IsInf(iv.StepSeconds, 0):
		return fmt.Errorf("--step-seconds must be >= 0; got %g", iv.StepSeconds)
	case !(iv.ReftRestartSeconds >= 0) || math.IsInf(iv.ReftRestartSeconds, 0):
		return fmt.Errorf("--reft-restart-seconds must be >= 0; got %g", iv.ReftRestartSeconds)
	}
	return nil
}

// perSecond is f converted to failures per GPU per second, the unit in which
// o and r are given.
func (iv Interval) perSecond() float64 { return iv.FailuresPerGPUDay / secondsPerDay }

// OptimalPerSecond is JIT Eq. 3, c* = sqrt(N f / (2 o)).
func (iv Interval) OptimalPerSecond() float64 {
	return jit.OptimalPerSecond(float64(iv.GPUs), iv.FailuresPerGPUDay, iv.CheckpointSeconds)
}

// PerHour is c* in checkpoints per hour, as JIT Table 8 prints it.
func (iv Interval) PerHour() float64 { return iv.OptimalPerSecond() * 3600 }

// WastedPerUseful is JIT Eq. 5, w* = 2 sqrt(N f o / 2) + N f r: GPU time
// lost per unit of useful time at c*. The two square-root terms are the
// checkpoint cost and the work redone after a failure, equal at the optimum.
func (iv Interval) WastedPerUseful() float64 {
	nf := float64(iv.GPUs) * iv.perSecond()
	return 2*math.Sqrt(nf*iv.CheckpointSeconds/2) + nf*iv.RestartSeconds
}

// WastedFraction is JIT Eq. 6, w_f = w* / (1 + w*): the share of wall time
// that does no useful work.
func (iv Interval) WastedFraction() float64 {
	w := iv.WastedPerUseful()
	return w / (1 + w)
}

// PeriodicLossSeconds is GEMINI Eq. 1 at c*, t_ckpt + 1/(2f) + t_rtol: the
// average time one failure costs with periodic checkpoints.
func (iv Interval) PeriodicLossSeconds() float64 {
	return iv.CheckpointSeconds + 1/(2*iv.OptimalPerSecond()) + iv.RestartSeconds
}

// ReftLossSeconds is what one failure costs with reft: at most one step of
// work (the snapshot is per step, and the just-in-time flush keeps the loss
// to one step) plus reft's restart.
func (iv Interval) ReftLossSeconds() float64 {
	return iv.StepSeconds + iv.reftRestart()
}

func (iv Interval) reftRestart() float64 {
	if iv.ReftRestartSeconds > 0 {
		return iv.ReftRestartSeconds
	}
	return iv.RestartSeconds
}

// ReftWastedFraction applies JIT Eq. 7's shape to reft: no periodic
// checkpoint term (snapshots overlap training), N f times the per-failure
// loss, then Eq. 6.
func (iv Interval) ReftWastedFraction() float64 {
	w := float64(iv.GPUs) * iv.perSecond() * iv.ReftLossSeconds()
	return w / (1 + w)
}

// warnings reports where the optimum breaks the papers' own constraints.
func (iv Interval) warnings() []string {
	var out []string
	c := iv.OptimalPerSecond()
	if 1/c < iv.CheckpointSeconds || (iv.StepSeconds > 0 && 1/c < iv.StepSeconds) {
		out = append(out, "the optimal interval is shorter than one checkpoint or one step (GEMINI Eq. 2); checkpoint as often as those allow")
	}
	if c <= float64(iv.GPUs)*iv.perSecond() {
		out = append(out, "the job fails more often than it could checkpoint; it may never make progress (JIT section 5.2)")
	}
	return out
}
