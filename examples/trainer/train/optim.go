package train

import (
	"math"

	"github.com/reft-hpc/reft/agent/aor"
)

// optimizer applies one update to a contiguous range of parameters, with the
// standard (PyTorch) formulas in float32. The state (m, v) is updated by
// agent/aor's kernels, the ones a reft agent runs on its AOR replica of a
// neighbour's ZeRO-1 shard, so that the replica is bit-identical by
// construction; the parameter update is here.
type optimizer struct {
	kind        string
	st          aor.Optimizer // the state update: kind, betas, momentum
	lr, wd, mu  float32
	b1, b2, eps float32
	m, v        []float32 // state over this rank's range (momentum uses m)
	lrDecay     float32   // adamw: 1 - lr*wd
	bc1, bc2    float32   // adam bias corrections for the current step
}

func newOptimizer(c *Config, n int) *optimizer {
	o := &optimizer{kind: c.Optimizer, lr: float32(c.LR), wd: float32(c.WeightDecay), mu: float32(c.Momentum),
		b1: 0.9, b2: 0.999, eps: 1e-8}
	o.st = aor.Optimizer{Kind: o.kind, Beta1: o.b1, Beta2: o.b2, Momentum: o.mu}
	switch c.Optimizer {
	case Momentum:
		o.m = make([]float32, n)
	case Adam, AdamW:
		o.m, o.v = make([]float32, n), make([]float32, n)
	}
	o.lrDecay = float32(1 - float32(o.lr*o.wd))
	return o
}

// prepare sets the per-step constants for update number t (1-based).
func (o *optimizer) prepare(t int64) {
	o.bc1 = float32(1 - math.Pow(float64(o.b1), float64(t)))
	o.bc2 = float32(1 - math.Pow(float64(o.b2), float64(t)))
}

// update applies the step to p[i], g[i] for i in [lo, hi) of the state range.
func (o *optimizer) update(p, g []float32, lo, hi int) {
	switch o.kind {
	case SGD:
		for i := lo; i < hi; i++ {
			p[i] -= float32(o.lr * g[i])
		}
	case Momentum:
		m := o.m
		o.st.Moments(m[lo:hi], nil, g[lo:hi])
		for i := lo; i < hi; i++ {
			p[i] -= float32(o.lr * m[i])
		}
	case Adam, AdamW:
		m, v := o.m, o.v
		o.st.Moments(m[lo:hi], v[lo:hi], g[lo:hi])
		for i := lo; i < hi; i++ {
			if o.kind == AdamW {
				p[i] = float32(p[i] * o.lrDecay)
			}
			mh := m[i] / o.bc1
			vh := v[i] / o.bc2
			den := float32(math.Sqrt(float64(vh))) + o.eps
			p[i] -= float32(o.lr*mh) / den
		}
	}
}
