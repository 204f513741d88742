package train

import (
	"fmt"
	"math"
	"sync"
)

// Update-undo (SWIFT, section 2.3): a rank whose optimizer update of step t
// was interrupted (a failed peer under ZeRO-1's parameter all-gather, or an
// error between tensors) holds some tensors at step t and the others at
// t-1. Undo returns the applied tensors, and their optimizer state, to step
// t-1, so that the JIT flush can save a consistent step without any
// snapshot on the step path.
//
// Exactness. The inverse of x' = x - d is x = x' + d, but float32 rounding
// makes float32(x' + d) differ from x in some elements, and the moment
// updates m' = b*m + t lose bits of m outright when t is the larger term.
// The undo is exact by construction: while applying the update, each
// element's inverse is estimated in float64 from the updated values (the
// same expression undo evaluates later), and the difference between the
// original's bit pattern and the estimate's is kept, as an int8 per
// element and buffer, or, when it does not fit, as an exception (index and
// original bits). Undo adds the difference back to the estimate's bits:
// integer arithmetic, so the original returns whatever the rounding. The
// undo data is the step's gradient (which the trainer holds anyway), one
// byte per element per buffer (p, m, v: a quarter of a copy) and the rare
// exceptions; docs/UNDO.md has the measured rates and cost.

// undoLog is what undoing one update needs, over the optimizer's range
// [lo, lo+n) of the flat parameters. Segments are the parameter tensors
// (cut at the range's ends); applied[s] says whether segment s was updated.
// apply and undo are called by the trainer's goroutine only; within them
// the work is split by segment and block, never two goroutines on one
// element.
type undoLog struct {
	segs    [][2]int // [start, end) within the range
	applied []bool
	dp      []int8     // per element: bits(original) - bits(estimate), parameter
	dm, dv  []int8     // the same for m and v (nil when the optimizer has none)
	exc     [][]uint64 // per segment: uint64(buf)<<62 | index<<32 | original bits
	g       []float32  // the step's gradient over the range (not owned)
	bc1     float32    // the step's bias corrections (adam, adamw)
	bc2     float32
	active  bool // an update was recorded and not undone or committed
	// done: the last update was complete (committed) and its undo data is
	// kept until the next apply begins, so that a JIT flush can step back
	// over it (trainer.stepBack). The gradient g must stay unchanged as
	// long: the trainer keeps it in a buffer of its own (undoGrad).
	done bool
}

const (
	excP = 0
	excM = 1
	excV = 2
)

// checkUndo says why opt's update cannot be undone, or nil.
func checkUndo(c *Config) error {
	switch c.Optimizer {
	case SGD, Adam, AdamW:
	case Momentum:
		if c.Momentum == 0 {
			return fmt.Errorf("--undo with --optimizer momentum --momentum 0: the momentum buffer before a step cannot be recovered from the one after it (m = g); use --optimizer sgd, the same update with no state")
		}
	default:
		return fmt.Errorf("--undo: optimizer %q cannot be undone (undo supports sgd, momentum, adam, adamw)", c.Optimizer)
	}
	if c.Optimizer == AdamW && float32(1-float32(float32(c.LR)*float32(c.WeightDecay))) == 0 {
		return fmt.Errorf("--undo with adamw: lr*weight-decay = 1 zeroes the parameters, which cannot be undone; lower --lr or --weight-decay")
	}
	return nil
}

// newUndoLog cuts the range [lo, hi) at the tensor boundaries bounds
// (offsets into the flat parameters, increasing).
func newUndoLog(lo, hi int, bounds []int) *undoLog {
	u := &undoLog{}
	start := lo
	for _, b := range bounds {
		if b > start && b < hi {
			u.segs = append(u.segs, [2]int{start - lo, b - lo})
			start = b
		}
	}
	u.segs = append(u.segs, [2]int{start - lo, hi - lo})
	u.applied = make([]bool, len(u.segs))
	u.exc = make([][]uint64, len(u.segs))
	u.dp = make([]int8, hi-lo)
	return u
}

// apply runs o's update over p (the range's parameters) with gradient g,
// segment by segment, recording the undo data. before, when not nil, is
// called before each segment; an error from it stops the update there (a
// failure injected mid-update) and is returned, the segments before it
// applied. o.prepare must have been called for the step.
func (u *undoLog) apply(o *optimizer, p, g []float32, threads int, before func(seg int) error) error {
	u.g, u.bc1, u.bc2, u.active, u.done = g, o.bc1, o.bc2, true, false
	if o.m != nil && u.dm == nil {
		u.dm = make([]int8, len(u.dp))
	}
	if o.v != nil && u.dv == nil {
		u.dv = make([]int8, len(u.dp))
	}
	clear(u.applied)
	for s, sg := range u.segs {
		if before != nil {
			if err := before(s); err != nil {
				return err
			}
		}
		var mu sync.Mutex
		exc := u.exc[s][:0]
		parallelFor(sg[1]-sg[0], threads, 32, func(a, b int) {
			e := o.updateRecord(p, g, u, sg[0]+a, sg[0]+b)
			if len(e) > 0 {
				mu.Lock()
				exc = append(exc, e...)
				mu.Unlock()
			}
		})
		u.exc[s] = exc
		u.applied[s] = true
	}
	return nil
}

// commit marks the recorded update complete; its undo data stays until
// the next apply (kept).
func (u *undoLog) commit() { u.active, u.done = false, true }

// kept says whether the last update is complete and can still be undone.
func (u *undoLog) kept() bool { return u.done }

// undo returns the applied segments of the recorded update, interrupted
// (active) or complete (kept), to their state before it. It returns how
// many segments it undid.
func (u *undoLog) undo(o *optimizer, p []float32, threads int) int {
	if !u.active && !u.done {
		return 0
	}
	n := 0
	for s, sg := range u.segs {
		if !u.applied[s] {
			continue
		}
		parallelFor(sg[1]-sg[0], threads, 32, func(a, b int) {
			o.invert(p, u, sg[0]+a, sg[0]+b)
		})
		for _, e := range u.exc[s] {
			i, bits := int(e>>32&(1<<30-1)), math.Float32frombits(uint32(e))
			switch e >> 62 {
			case excP:
				p[i] = bits
			case excM:
				o.m[i] = bits
			case excV:
				o.v[i] = bits
			}
		}
		u.applied[s] = false
		n++
	}
	u.active, u.done = false, false
	return n
}

// exceptions counts the kept exceptions of the applied segments, by buffer.
func (u *undoLog) exceptions() (p, m, v int) {
	for s := range u.segs {
		if !u.applied[s] {
			continue
		}
		for _, e := range u.exc[s] {
			switch e >> 62 {
			case excP:
				p++
			case excM:
				m++
			default:
				v++
			}
		}
	}
	return
}

// corr is bits(x) - bits(c) when it fits an int8; ok false otherwise.
func corr(x, c float32) (int8, bool) {
	d := int64(math.Float32bits(x)) - int64(math.Float32bits(c))
	if d < math.MinInt8 || d > math.MaxInt8 {
		return 0, false
	}
	return int8(d), true
}

// uncorr is corr's inverse: the original from the estimate c and d.
func uncorr(c float32, d int8) float32 {
	return math.Float32frombits(uint32(int64(math.Float32bits(c)) + int64(d)))
}

// updateRecord applies the update to [lo, hi), writes the corrections of
// the elements into u's dense arrays and returns the exceptions. The
// update's expressions are optimizer.update's, operand for operand
// (TestUndoSameBits checks the bits); the estimates are estimate's, inlined
// per kind (the undo tests fail if they ever differ).
func (o *optimizer) updateRecord(p, g []float32, u *undoLog, lo, hi int) (exc []uint64) {
	miss := func(buf uint64, i int, x float32) {
		exc = append(exc, buf<<62|uint64(i)<<32|uint64(math.Float32bits(x)))
	}
	dp := u.dp[lo:hi:hi]
	switch o.kind {
	case SGD:
		lr := o.lr
		for i := lo; i < hi; i++ {
			x := p[i]
			d := float32(lr * g[i])
			y := x - d
			p[i] = y
			var ok bool
			if dp[i-lo], ok = corr(x, float32(float64(y)+float64(d))); !ok {
				miss(excP, i, x)
			}
		}
	case Momentum:
		lr, mu, m, imu := o.lr, o.mu, o.m, 1/float64(o.mu)
		dm := u.dm[lo:hi:hi]
		for i := lo; i < hi; i++ {
			x, gi, mo := p[i], g[i], m[i]
			mn := float32(mu*mo) + gi // agent/aor's momentumM
			m[i] = mn
			d := float32(lr * mn)
			y := x - d
			p[i] = y
			var ok bool
			if dp[i-lo], ok = corr(x, float32(float64(y)+float64(d))); !ok {
				miss(excP, i, x)
			}
			if dm[i-lo], ok = corr(mo, float32((float64(mn)-float64(gi))*imu)); !ok {
				miss(excM, i, mo)
			}
		}
	case Adam, AdamW:
		m, v, b1, b2 := o.m, o.v, o.b1, o.b2
		lr, eps, bc1, bc2, decay := o.lr, o.eps, o.bc1, o.bc2, o.lrDecay
		ib1, ib2, idecay := 1/float64(b1), 1/float64(b2), 1/float64(decay)
		adamw := o.kind == AdamW
		dm, dv := u.dm[lo:hi:hi], u.dv[lo:hi:hi]
		for i := lo; i < hi; i++ {
			x, gi, mo, vo := p[i], g[i], m[i], v[i]
			t1 := float32((1 - b1) * gi)
			t2 := float32(float32((1-b2)*gi) * gi)
			mn := float32(b1*mo) + t1 // aor's adamM
			vn := float32(b2*vo) + t2 // aor's adamV
			m[i], v[i] = mn, vn
			pi := x
			if adamw {
				pi = float32(pi * decay)
			}
			mh := mn / bc1
			vh := vn / bc2
			den := float32(math.Sqrt(float64(vh))) + eps
			d := float32(lr*mh) / den
			y := pi - d
			p[i] = y
			e := float64(y) + float64(d)
			if adamw {
				e *= idecay
			}
			var ok bool
			if dp[i-lo], ok = corr(x, float32(e)); !ok {
				miss(excP, i, x)
			}
			if dm[i-lo], ok = corr(mo, float32((float64(mn)-float64(t1))*ib1)); !ok {
				miss(excM, i, mo)
			}
			if dv[i-lo], ok = corr(vo, float32((float64(vn)-float64(t2))*ib2)); !ok {
				miss(excV, i, vo)
			}
		}
	}
	return exc
}

// invert writes the estimates of [lo, hi) corrected by u's dense arrays;
// undo then writes the exceptions.
func (o *optimizer) invert(p []float32, u *undoLog, lo, hi int) {
	for i := lo; i < hi; i++ {
		cp, cm, cv := o.estimate(p[i], u.g[i], i, u.bc1, u.bc2)
		p[i] = uncorr(cp, u.dp[i])
		if o.m != nil {
			o.m[i] = uncorr(cm, u.dm[i])
		}
		if o.v != nil {
			o.v[i] = uncorr(cv, u.dv[i])
		}
	}
}

// estimate computes element i's values before the update, in float64 (the
// divisions by the factors as products with their float64 reciprocals)
// and rounded once, from the updated parameter pu, the updated state in o.m,
// o.v and the gradient gi: the inverse of each expression of
// optimizer.update. It must be a pure function of its inputs: apply and
// undo both call it.
func (o *optimizer) estimate(pu, gi float32, i int, bc1, bc2 float32) (p, m, v float32) {
	switch o.kind {
	case SGD:
		p = float32(float64(pu) + float64(float32(o.lr*gi)))
	case Momentum:
		mu := o.m[i]
		p = float32(float64(pu) + float64(float32(o.lr*mu)))
		m = float32((float64(mu) - float64(gi)) * (1 / float64(o.mu)))
	case Adam, AdamW:
		mu, vu := o.m[i], o.v[i]
		mh := mu / bc1
		vh := vu / bc2
		den := float32(math.Sqrt(float64(vh))) + o.eps
		x := float64(pu) + float64(float32(o.lr*mh)/den)
		if o.kind == AdamW {
			x *= 1 / float64(o.lrDecay)
		}
		p = float32(x)
		m = float32((float64(mu) - float64(float32((1-o.b1)*gi))) * (1 / float64(o.b1)))
		v = float32((float64(vu) - float64(float32(float32((1-o.b2)*gi)*gi))) * (1 / float64(o.b2)))
	}
	return
}
