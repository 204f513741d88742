package plan

import (
	"fmt"
	"math"
)

// Survival is REFT section 5: k independent failure units (devices or
// nodes, whatever the rates refer to) whose time to failure is Weibull,
// P(unit alive at t) = exp(-λ t^c), grouped into k/n sharding groups of n.
// Time is in days, so rates are per unit per day^c.
type Survival struct {
	Units     int     // k in Eq. 5 and 6
	SGSize    int     // n
	Shape     float64 // c
	HWRate    float64 // λ of P_s: hardware failure, which loses host memory
	SWRate    float64 // λ of P_tr: software failure, which only a checkpoint survives without reft
	AgentRate float64 // λ of P_re: reft's own snapshot process failing; 0 unless given
	Tolerance int     // losses per SG survived (1 for the paper's ARC/AEC)
}

func (s Survival) validate() error {
	switch {
	case s.Units < 1:
		return fmt.Errorf("--devices must be >= 1; got %d", s.Units)
	case s.SGSize < 2:
		return fmt.Errorf("--sg-size must be >= 2 (an SG of one member has no peer to hold its redundancy); got %d", s.SGSize)
	case s.Units%s.SGSize != 0:
		return fmt.Errorf("--devices (%d) must be a multiple of --sg-size (%d): every unit belongs to exactly one sharding group", s.Units, s.SGSize)
	case !(s.Shape > 0) || math.IsInf(s.Shape, 0):
		return fmt.Errorf("--shape must be > 0 (the Weibull shape c; 1 is a constant failure rate); got %g", s.Shape)
	case !(s.HWRate >= 0) || math.IsInf(s.HWRate, 0):
		return fmt.Errorf("--hw-rate must be >= 0; got %g", s.HWRate)
	case !(s.SWRate >= 0) || math.IsInf(s.SWRate, 0):
		return fmt.Errorf("--sw-rate must be >= 0; got %g", s.SWRate)
	case !(s.AgentRate >= 0) || math.IsInf(s.AgentRate, 0):
		return fmt.Errorf("--agent-rate must be >= 0; got %g", s.AgentRate)
	case s.Tolerance < 0 || s.Tolerance >= s.SGSize:
		return fmt.Errorf("tolerance %d must lie in [0, --sg-size-1 = %d]", s.Tolerance, s.SGSize-1)
	}
	return nil
}

// groupLoss is the probability that more than tol of n independent members
// have failed, each with probability q. It sums the tail directly instead of
// 1 - head, so tiny losses keep their precision.
func groupLoss(n, tol int, q float64) float64 {
	if q <= 0 {
		return 0
	}
	if q >= 1 {
		return 1
	}
	lq, lp := math.Log(q), math.Log1p(-q)
	sum := 0.0
	for j := tol + 1; j <= n; j++ {
		sum += math.Exp(logChoose(n, j) + float64(j)*lq + float64(n-j)*lp)
	}
	return math.Min(sum, 1)
}

func logChoose(n, k int) float64 {
	a, _ := math.Lgamma(float64(n + 1))
	b, _ := math.Lgamma(float64(k + 1))
	c, _ := math.Lgamma(float64(n - k + 1))
	return a - b - c
}

// logReft is log P_re-survive (Eq. 5) generalised from "at most one failure
// per SG" to "at most Tolerance failures per SG":
//
//	P = (Σ_{j<=T} C(n,j) (1-P_s)^j P_s^(n-j))^(k/n) · P_re^k.
//
// For T = 1 the sum is the paper's P_s^n + n(1-P_s)P_s^(n-1).
func (s Survival) logReft(t float64) float64 {
	tc := math.Pow(t, s.Shape)
	q := -math.Expm1(-s.HWRate * tc) // 1 - P_s
	loss := groupLoss(s.SGSize, s.Tolerance, q)
	if loss >= 1 {
		return math.Inf(-1)
	}
	groups := float64(s.Units / s.SGSize)
	return groups*math.Log1p(-loss) - float64(s.Units)*s.AgentRate*tc
}

// Reft is the probability that in-memory state with reft survives to day t.
func (s Survival) Reft(t float64) float64 { return math.Exp(s.logReft(t)) }

// Checkpoint is Eq. 6, P_ck-survive = P_s^k P_tr^k: without reft any hardware
// or software failure sends the job back to its last persistent checkpoint.
func (s Survival) Checkpoint(t float64) float64 {
	return math.Exp(-float64(s.Units) * (s.HWRate + s.SWRate) * math.Pow(t, s.Shape))
}

// CheckpointDays is the time Eq. 6 stays at or above threshold, in closed form.
func (s Survival) CheckpointDays(threshold float64) float64 {
	rate := float64(s.Units) * (s.HWRate + s.SWRate)
	if rate == 0 {
		return math.Inf(1)
	}
	return math.Pow(-math.Log(threshold)/rate, 1/s.Shape)
}

// ReftDays is the time Eq. 5 stays at or above threshold. Eq. 5 has no closed
// form for T >= 1, but it falls monotonically in t, so bisect on log t.
func (s Survival) ReftDays(threshold float64) float64 {
	if s.HWRate == 0 && s.AgentRate == 0 {
		return math.Inf(1)
	}
	return solveDecreasing(s.logReft, math.Log(threshold))
}

// solveDecreasing finds t > 0 with f(t) = target for a decreasing f, to a
// relative precision far below what any table prints.
func solveDecreasing(f func(float64) float64, target float64) float64 {
	lo, hi := 1e-12, 1.0
	for f(hi) >= target {
		hi *= 10
		if hi > 1e15 {
			return math.Inf(1)
		}
	}
	for i := 0; i < 200 && hi/lo > 1+1e-13; i++ {
		mid := math.Sqrt(lo * hi)
		if f(mid) >= target {
			lo = mid
		} else {
			hi = mid
		}
	}
	return math.Sqrt(lo * hi)
}
