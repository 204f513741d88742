package train

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

func bitsEqual(a, b []float32) (int, bool) {
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i, false
		}
	}
	return -1, true
}

// ulps is the distance between a and b in float32 steps (same sign).
func ulps(a, b float32) int64 {
	d := int64(math.Float32bits(a)) - int64(math.Float32bits(b))
	if d < 0 {
		d = -d
	}
	return d
}

// TestUndoRealRun runs the trainer's real steps, then updates one more step
// with the undo recorded and undoes it: the bits must come back. It also
// measures the inverse alone (without the kept exceptions), the figures of
// docs/UNDO.md.
func TestUndoRealRun(t *testing.T) {
	for _, tc := range []struct {
		opt   string
		lr    float64
		steps int64
	}{
		{SGD, 1e-2, 6}, {SGD, 1e-1, 20},
		{Momentum, 1e-2, 6}, {Momentum, 1e-1, 20},
		{Adam, 1e-3, 6}, {Adam, 1e-2, 20},
		{AdamW, 1e-3, 6}, {AdamW, 1e-2, 20},
	} {
		t.Run(fmt.Sprintf("%s-lr%g-step%d", tc.opt, tc.lr, tc.steps+1), func(t *testing.T) {
			c := small()
			c.Optimizer, c.LR, c.Undo, c.SizeBytes = tc.opt, tc.lr, true, 4<<20/8
			if err := c.Validate(1); err != nil {
				t.Fatal(err)
			}
			w := NewLocalWorld(1)
			tr, err := newTrainer(c, Options{Comm: w.Comm(0)})
			if err != nil {
				t.Fatal(err)
			}
			step := func(s int64) {
				t.Helper()
				if err := tr.computeGradients(s, stageIO{}); err != nil {
					t.Fatal(err)
				}
				if err := tr.dpc.AllReduceSumI64(tr.acc); err != nil {
					t.Fatal(err)
				}
			}
			for s := int64(1); s <= tc.steps; s++ {
				step(s)
				if err := tr.update(); err != nil {
					t.Fatal(err)
				}
				tr.state[0] = s
			}
			step(tc.steps + 1)
			p0, m0, v0 := slices.Clone(tr.params), slices.Clone(tr.opt.m), slices.Clone(tr.opt.v)
			if err := tr.update(); err != nil {
				t.Fatal(err)
			}
			if _, same := bitsEqual(p0, tr.params); same {
				t.Fatal("the update changed no parameter")
			}
			// The recorded update is committed; keep it for the measurement.
			tr.undo.active = true
			ep, em, ev := tr.undo.exceptions()

			// The estimates alone (no corrections), against the originals.
			n := len(tr.params)
			type meas struct {
				diff   int
				maxAbs float64
				maxUlp int64
			}
			var mp, mm, mv meas
			add := func(ms *meas, got, want float32) {
				if math.Float32bits(got) != math.Float32bits(want) {
					ms.diff++
					ms.maxAbs = max(ms.maxAbs, math.Abs(float64(got)-float64(want)))
					ms.maxUlp = max(ms.maxUlp, ulps(got, want))
				}
			}
			for i := 0; i < n; i++ {
				cp, cm, cv := tr.opt.estimate(tr.params[i], tr.undo.g[i], i, tr.undo.bc1, tr.undo.bc2)
				add(&mp, cp, p0[i])
				if m0 != nil {
					add(&mm, cm, m0[i])
				}
				if v0 != nil {
					add(&mv, cv, v0[i])
				}
			}
			bufs := 1
			if m0 != nil {
				bufs++
			}
			if v0 != nil {
				bufs++
			}
			pct := func(k int) float64 { return 100 * float64(k) / float64(n) }
			t.Logf("%d params: the estimate alone differs in p %.2f%% (max |diff| %.3g, %d ulp), m %.2f%% (%.3g, %d ulp), v %.2f%% (%.3g, %d ulp); "+
				"kept: %d B dense + %d exceptions (p %d m %d v %d) = %.3f of a copy",
				n, pct(mp.diff), mp.maxAbs, mp.maxUlp, pct(mm.diff), mm.maxAbs, mm.maxUlp, pct(mv.diff), mv.maxAbs, mv.maxUlp,
				bufs*n, ep+em+ev, ep, em, ev, float64(bufs*n+8*(ep+em+ev))/float64(4*bufs*n))
			if mp.diff == 0 {
				t.Errorf("the estimate is exact for every parameter: the measurement measures nothing")
			}

			for i := range tr.undo.applied {
				tr.undo.applied[i] = true
			}
			err = tr.rollback(tr.params, errors.New("test"))
			var ue *UndoneError
			if !errors.As(err, &ue) || ue.Tensors != len(tr.undo.segs) || ue.Step != tc.steps {
				t.Fatalf("rollback: %v, want an UndoneError of %d tensors, step %d", err, len(tr.undo.segs), tc.steps)
			}
			if i, ok := bitsEqual(tr.params, p0); !ok {
				t.Fatalf("param %d: undone %v, before %v", i, tr.params[i], p0[i])
			}
			if i, ok := bitsEqual(tr.opt.m, m0); !ok {
				t.Fatalf("m[%d]: undone %v, before %v", i, tr.opt.m[i], m0[i])
			}
			if i, ok := bitsEqual(tr.opt.v, v0); !ok {
				t.Fatalf("v[%d]: undone %v, before %v", i, tr.opt.v[i], v0[i])
			}
		})
	}
}

// randF32 draws values over many binades, with zeros, signed zeros and
// subnormals among them.
func randF32(u uint64, minExp, maxExp int, signed bool) float32 {
	switch u % 64 {
	case 0:
		return 0
	case 1:
		if signed {
			return float32(math.Copysign(0, -1))
		}
		return 0
	case 2:
		return math.Float32frombits(uint32(u>>40) & 0x7fffff) // subnormal
	}
	e := minExp + int((u>>8)%uint64(maxExp-minExp+1))
	x := float32(math.Ldexp(1+float64(u>>40)/(1<<24), e))
	if signed && u&(1<<7) != 0 {
		x = -x
	}
	return x
}

// TestUndoProperty: update-then-undo returns the bits for every optimizer
// over random parameters, states and gradients spanning many binades, a
// range of learning rates and step counts, and non-finite values.
func TestUndoProperty(t *testing.T) {
	const n = 1 << 14
	for _, kind := range []string{SGD, Momentum, Adam, AdamW} {
		for _, lr := range []float64{1e-4, 1e-2, 0.5} {
			for _, step := range []int64{1, 7, 5000} {
				t.Run(fmt.Sprintf("%s-lr%g-t%d", kind, lr, step), func(t *testing.T) {
					c := Config{Optimizer: kind, LR: lr, WeightDecay: 0.01, Momentum: 0.9}
					o := newOptimizer(&c, n)
					o.prepare(step)
					p, g := make([]float32, n), make([]float32, n)
					seed := key(uint64(len(kind)), math.Float64bits(lr), uint64(step))
					for i := range p {
						p[i] = randF32(mix(seed+uint64(4*i)), -40, 8, true)
						g[i] = randF32(mix(seed+uint64(4*i+1)), -40, 4, true)
						if o.m != nil {
							o.m[i] = randF32(mix(seed+uint64(4*i+2)), -40, 4, true)
						}
						if o.v != nil {
							o.v[i] = randF32(mix(seed+uint64(4*i+3)), -80, 8, false)
						}
					}
					g[5], g[6], p[7] = float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))
					p0, m0, v0 := slices.Clone(p), slices.Clone(o.m), slices.Clone(o.v)
					u := newUndoLog(0, n, []int{100, 5000})
					if err := u.apply(o, p, g, 2, nil); err != nil {
						t.Fatal(err)
					}
					ep, em, ev := u.exceptions()
					if got := u.undo(o, p, 2); got != 3 {
						t.Fatalf("undid %d segments, want 3", got)
					}
					t.Logf("exceptions (corrections beyond int8): p %d m %d v %d of %d", ep, em, ev, n)
					for _, b := range []struct {
						name      string
						got, want []float32
					}{{"p", p, p0}, {"m", o.m, m0}, {"v", o.v, v0}} {
						if i, ok := bitsEqual(b.got, b.want); !ok {
							t.Fatalf("%s[%d]: undone %v (%#x), before %v (%#x)", b.name, i, b.got[i], math.Float32bits(b.got[i]), b.want[i], math.Float32bits(b.want[i]))
						}
					}
				})
			}
		}
	}
}

// FuzzUndo: one element of any bits, any optimizer: undo returns them.
func FuzzUndo(f *testing.F) {
	f.Add(uint8(0), uint32(0x3f800000), uint32(0), uint32(0), uint32(0x3c23d70a), 1e-3, int64(1))
	f.Add(uint8(3), uint32(0x80000000), uint32(0x7f800000), uint32(1), uint32(0xbf800000), 0.5, int64(100))
	f.Add(uint8(1), uint32(0x00000001), uint32(0x3f000000), uint32(0), uint32(0x7fc00000), 1e-2, int64(3))
	f.Fuzz(func(t *testing.T, k uint8, pb, mb, vb, gb uint32, lr float64, step int64) {
		if !(lr > 0 && lr < 10) || step < 1 || step > 1e7 {
			return
		}
		kind := []string{SGD, Momentum, Adam, AdamW}[k%4]
		c := Config{Optimizer: kind, LR: lr, WeightDecay: 0.01, Momentum: 0.9}
		if checkUndo(&c) != nil {
			return
		}
		o := newOptimizer(&c, 1)
		o.prepare(step)
		p, g := []float32{math.Float32frombits(pb)}, []float32{math.Float32frombits(gb)}
		if o.m != nil {
			o.m[0] = math.Float32frombits(mb)
		}
		if o.v != nil {
			o.v[0] = math.Float32frombits(vb)
		}
		p0, m0, v0 := slices.Clone(p), slices.Clone(o.m), slices.Clone(o.v)
		u := newUndoLog(0, 1, nil)
		if err := u.apply(o, p, g, 1, nil); err != nil {
			t.Fatal(err)
		}
		u.undo(o, p, 1)
		for _, b := range [][2][]float32{{p, p0}, {o.m, m0}, {o.v, v0}} {
			if i, ok := bitsEqual(b[0], b[1]); !ok {
				t.Fatalf("%s: element %d undone to %#x, was %#x", kind, i, math.Float32bits(b[0][i]), math.Float32bits(b[1][i]))
			}
		}
	})
}

// TestUndoMidUpdate injects a failure between tensors of one step's
// update (--save-every 0, nothing snapshotted on the step path): every rank
// undoes the tensors it had updated, the flush saves the step before, and a
// run resumed from it ends bit-identical to an uninterrupted one.
func TestUndoMidUpdate(t *testing.T) {
	const failStep = 5
	for _, tc := range []struct {
		opt    string
		dp, pp int
		zero1  bool
		// only: inject on this rank alone (the others are interrupted by
		// the aborted all-gather); -1: on every rank, rank r before its
		// tensor r%2 (none or one updated).
		only int
	}{
		{SGD, 1, 1, false, -1},
		{Momentum, 2, 1, false, -1},
		{Adam, 2, 1, false, -1},
		{Adam, 2, 1, true, -1},
		{AdamW, 2, 1, true, -1},
		{SGD, 2, 1, true, 1},
		{Momentum, 2, 1, true, 1},
		{Adam, 2, 1, true, 1},
		{AdamW, 2, 1, true, 0},
	} {
		t.Run(fmt.Sprintf("%s-dp%d-pp%d-zero1=%v-only%d", tc.opt, tc.dp, tc.pp, tc.zero1, tc.only), func(t *testing.T) {
			c := small()
			c.Optimizer, c.DP, c.PP, c.Zero1, c.LogEvery = tc.opt, tc.dp, tc.pp, tc.zero1, 1
			n := tc.dp * tc.pp
			want := runOK(t, c, n, nil)

			c.Undo, c.SaveEvery = true, 0
			store := NewMemStore(n)
			snaps := make([]*memSnap, n)
			injected := errors.New("injected failure")
			_, errs := RunLocal(c, n, func(r int) Options {
				snaps[r] = store.Rank(r).(*memSnap)
				return Options{Snap: snaps[r], beforeTensor: func(step int64, seg int) error {
					if step == failStep && (tc.only == r || tc.only < 0 && seg == r%2) {
						return injected
					}
					return nil
				}}
			})
			for r, err := range errs {
				var ue *UndoneError
				if !errors.As(err, &ue) || ue.Step != failStep-1 {
					t.Fatalf("rank %d: %v, want an undone update back at step %d", r, err, failStep-1)
				}
				if tc.only < 0 || tc.only == r {
					if !errors.Is(err, injected) || ue.Tensors != r%2 && tc.only < 0 {
						t.Errorf("rank %d: %v, want the injected failure after %d tensors", r, err, r%2)
					}
				} else if !errors.Is(err, ErrAborted) || ue.Tensors == 0 {
					// Its whole update was applied; the all-gather failed.
					t.Errorf("rank %d: %v, want the aborted all-gather after its whole update", r, err)
				}
				step, ok, err := snaps[r].Flush()
				if err != nil || !ok || step != failStep-1 {
					t.Fatalf("rank %d: flush: step %d ok %v err %v, want step %d", r, step, ok, err, failStep-1)
				}
			}
			got := runOK(t, c, n, func(r int) Options { return Options{Snap: store.Rank(r)} })
			if got.ResumedFrom != failStep-1 {
				t.Errorf("resumed from %d, want %d", got.ResumedFrom, failStep-1)
			}
			if got.Hash != want.Hash {
				t.Errorf("resumed hash %s, uninterrupted %s", got.Hash, want.Hash)
			}
		})
	}
}

// TestUndoRefused: the optimizers undo cannot invert are refused with the
// reason.
func TestUndoRefused(t *testing.T) {
	for _, tc := range []struct {
		opt      string
		mom, wd  float64
		lr       float64
		wantPart string
	}{
		{Momentum, 0, 0, 1e-3, "--momentum 0"},
		{AdamW, 0.9, 1, 1, "lr*weight-decay = 1"},
	} {
		c := small()
		c.Optimizer, c.Momentum, c.WeightDecay, c.LR, c.Undo = tc.opt, tc.mom, tc.wd, tc.lr, true
		err := c.check()
		if err == nil || !strings.Contains(err.Error(), tc.wantPart) {
			t.Errorf("%s: %v, want an error naming %q", tc.opt, err, tc.wantPart)
		}
		c.Undo = false
		if err := c.check(); err != nil {
			t.Errorf("%s without --undo: %v", tc.opt, err)
		}
	}
}

// TestUndoSameBits: a run with --undo computes the same bits as one
// without (the recorded update repeats optimizer.update's expressions).
func TestUndoSameBits(t *testing.T) {
	for _, opt := range []string{SGD, Momentum, Adam, AdamW} {
		for _, lay := range []struct {
			dp    int
			zero1 bool
		}{{1, false}, {2, true}} {
			t.Run(fmt.Sprintf("%s-dp%d-zero1=%v", opt, lay.dp, lay.zero1), func(t *testing.T) {
				c := small()
				c.Optimizer, c.DP, c.Zero1, c.Steps = opt, lay.dp, lay.zero1, 12
				want := runOK(t, c, lay.dp, nil)
				c.Undo = true
				got := runOK(t, c, lay.dp, nil)
				if got.Hash != want.Hash {
					t.Errorf("--undo hash %s, without %s", got.Hash, want.Hash)
				}
			})
		}
	}
}
