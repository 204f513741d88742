package train

import "math"

// optimizer applies one update to a contiguous range of parameters, with the
// standard (PyTorch) formulas in float32.
type optimizer struct {
	kind        string
	lr, wd, mu  float32
	b1, b2, eps float32
	m, v        []float32 // state over this rank's range (momentum uses m)
	lrDecay     float32   // adamw: 1 - lr*wd
	bc1, bc2    float32   // adam bias corrections for the current step
}

func newOptimizer(c *Config, n int) *optimizer {
	o := &optimizer{kind: c.Optimizer, lr: float32(c.LR), wd: float32(c.WeightDecay), mu: float32(c.Momentum),
		b1: 0.9, b2: 0.999, eps: 1e-8}
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
		for i := lo; i < hi; i++ {
			m[i] = float32(o.mu*m[i]) + g[i]
			p[i] -= float32(o.lr * m[i])
		}
	case Adam, AdamW:
		m, v := o.m, o.v
		for i := lo; i < hi; i++ {
			if o.kind == AdamW {
				p[i] = float32(p[i] * o.lrDecay)
			}
			gi := g[i]
			m[i] = float32(o.b1*m[i]) + float32((1-o.b1)*gi)
			v[i] = float32(o.b2*v[i]) + float32(float32((1-o.b2)*gi)*gi)
			mh := m[i] / o.bc1
			vh := v[i] / o.bc2
			den := float32(math.Sqrt(float64(vh))) + o.eps
			p[i] -= float32(o.lr*mh) / den
		}
	}
}
