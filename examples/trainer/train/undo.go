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
// makes float32(x' + d) differ from x in a few elements, and the moment
// updates m' = b*m + t lose information outright (two m can round to the
// same m'). The undo is made exact by construction: while applying the
// update, each element's inverse is computed (in float64, then the float32
// neighbour, if any, that the forward expression maps to the updated value)
// and compared with the original; the elements where they differ are kept
// as exceptions (index and original bits) and written back by Undo. The
// undo data is thus the step's gradient (which the trainer holds anyway)
// plus the exceptions; docs/UNDO.md has the measured exception rates.

// undoSearch is how many float32 neighbours on each side of the float64
// estimate the inverse tries.
const undoSearch = 2

// undoBlock is how many elements are updated at a time while recording:
// their originals are copied to the stack, the trainer's own update code
// runs on them, and the inverse is checked against the copies, so that the
// recorded update is the same code, bit for bit, as the unrecorded one.
const undoBlock = 256

// undoLog is what undoing one update needs, over the optimizer's range
// [lo, lo+n) of the flat parameters. Segments are the parameter tensors
// (cut at the range's ends); applied[s] says whether segment s was updated.
// apply and undo are called by the trainer's goroutine only; within them
// the work is split by segment and block, never two goroutines on one
// element.
type undoLog struct {
	segs    [][2]int // [start, end) within the range
	applied []bool
	exc     [][]uint64 // per segment: uint64(buf)<<62 | index<<32 | original bits
	g       []float32  // the step's gradient over the range (not owned)
	bc1     float32    // the step's bias corrections (adam, adamw)
	bc2     float32
	active  bool // an update was recorded and not undone or committed
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
	return u
}

// apply runs o's update over p (the range's parameters) with gradient g,
// segment by segment, recording the undo data. before, when not nil, is
// called before each segment; an error from it stops the update there (a
// failure injected mid-update) and is returned, the segments before it
// applied. o.prepare must have been called for the step.
func (u *undoLog) apply(o *optimizer, p, g []float32, threads int, before func(seg int) error) error {
	u.g, u.bc1, u.bc2, u.active = g, o.bc1, o.bc2, true
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
			e := o.updateRecord(p, g, sg[0]+a, sg[0]+b, nil)
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

// commit forgets the recorded update: the step is complete.
func (u *undoLog) commit() { u.active = false }

// undo returns the applied segments to their state before the update. It
// returns how many segments it undid.
func (u *undoLog) undo(o *optimizer, p []float32, threads int) int {
	if !u.active {
		return 0
	}
	n := 0
	for s, sg := range u.segs {
		if !u.applied[s] {
			continue
		}
		parallelFor(sg[1]-sg[0], threads, 32, func(a, b int) {
			o.invert(p, u.g, sg[0]+a, sg[0]+b, u.bc1, u.bc2)
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
	u.active = false
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

// updateRecord applies o.update to [lo, hi) block by block and returns the
// exceptions: the elements whose inverse is not their original bits. The
// update is o.update itself, so the bits are the unrecorded run's.
func (o *optimizer) updateRecord(p, g []float32, lo, hi int, exc []uint64) []uint64 {
	var op, om, ov [undoBlock]float32
	for a := lo; a < hi; a += undoBlock {
		b := min(a+undoBlock, hi)
		copy(op[:], p[a:b])
		if o.m != nil {
			copy(om[:], o.m[a:b])
		}
		if o.v != nil {
			copy(ov[:], o.v[a:b])
		}
		o.update(p, g, a, b)
		for i := a; i < b; i++ {
			rp, rm, rv := o.inverse(p[i], g[i], i, o.bc1, o.bc2)
			if math.Float32bits(rp) != math.Float32bits(op[i-a]) {
				exc = append(exc, excP<<62|uint64(i)<<32|uint64(math.Float32bits(op[i-a])))
			}
			if o.m != nil && math.Float32bits(rm) != math.Float32bits(om[i-a]) {
				exc = append(exc, excM<<62|uint64(i)<<32|uint64(math.Float32bits(om[i-a])))
			}
			if o.v != nil && math.Float32bits(rv) != math.Float32bits(ov[i-a]) {
				exc = append(exc, excV<<62|uint64(i)<<32|uint64(math.Float32bits(ov[i-a])))
			}
		}
	}
	return exc
}

// invert writes the inverse of element i's update over [lo, hi): the
// parameter first (its update reads the updated moments), then m and v.
func (o *optimizer) invert(p, g []float32, lo, hi int, bc1, bc2 float32) {
	for i := lo; i < hi; i++ {
		rp, rm, rv := o.inverse(p[i], g[i], i, bc1, bc2)
		p[i] = rp
		if o.m != nil {
			o.m[i] = rm
		}
		if o.v != nil {
			o.v[i] = rv
		}
	}
}

// inverse computes element i's values before the update from the updated
// parameter pu, the state in o.m, o.v (updated) and the gradient gi. Every
// expression is the inverse of the one in optimizer.update, operand for
// operand.
func (o *optimizer) inverse(pu, gi float32, i int, bc1, bc2 float32) (p, m, v float32) {
	switch o.kind {
	case SGD:
		p = preSub(pu, float32(o.lr*gi))
	case Momentum:
		mu := o.m[i]
		p = preSub(pu, float32(o.lr*mu))
		m = preMulAdd(mu, o.mu, gi)
	case Adam, AdamW:
		mu, vu := o.m[i], o.v[i]
		mh := mu / bc1
		vh := vu / bc2
		den := float32(math.Sqrt(float64(vh))) + o.eps
		p = preSub(pu, float32(o.lr*mh)/den)
		if o.kind == AdamW {
			p = preMul(p, o.lrDecay)
		}
		m = preMulAdd(mu, o.b1, float32((1-o.b1)*gi))
		v = preMulAdd(vu, o.b2, float32(float32((1-o.b2)*gi)*gi))
	}
	return
}

// neighbours visits c, then the float32 values k = 1..undoSearch steps
// above and below it, until ok returns true; it returns that value, or c.
func neighbours(c float32, ok func(x float32) bool) float32 {
	if ok(c) {
		return c
	}
	up, dn := c, c
	for k := 0; k < undoSearch; k++ {
		up = math.Nextafter32(up, float32(math.Inf(1)))
		if ok(up) {
			return up
		}
		dn = math.Nextafter32(dn, float32(math.Inf(-1)))
		if ok(dn) {
			return dn
		}
	}
	return c
}

// preSub returns an x with x - d == y in float32 (forward: p -= d).
func preSub(y, d float32) float32 {
	return neighbours(float32(float64(y)+float64(d)), func(x float32) bool { return x-d == y })
}

// preMul returns an x with float32(x*a) == y (forward: adamw's decay).
func preMul(y, a float32) float32 {
	return neighbours(float32(float64(y)/float64(a)), func(x float32) bool { return float32(x*a) == y })
}

// preMulAdd returns an x with float32(a*x) + t == y (forward: the moment
// updates of agent/aor, m = mu*m + g and m = b*m + t).
func preMulAdd(y, a, t float32) float32 {
	return neighbours(float32((float64(y)-float64(t))/float64(a)), func(x float32) bool { return float32(a*x)+t == y })
}
