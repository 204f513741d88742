package train

import (
	"testing"
	"time"
)

// BenchmarkUndoUpdate: the optimizer update of 4M parameters with the undo
// recorded (copy, update, inverse and compare, block by block) against the
// plain update, in alternating rounds of the same run; reports
// undo/plain, the update's cost factor, and the kept corrections per
// element (bytes, 8 per exception).
func BenchmarkUndoUpdate(b *testing.B) {
	const n = 4 << 20
	for _, kind := range []string{SGD, Momentum, Adam, AdamW} {
		b.Run(kind, func(b *testing.B) {
			c := Config{Optimizer: kind, LR: 1e-3, WeightDecay: 0.01, Momentum: 0.9}
			o := newOptimizer(&c, n)
			p, g := make([]float32, n), make([]float32, n)
			for i := range p {
				p[i] = unit(mix(uint64(i))) * 0.05
				g[i] = unit(mix(uint64(i)+n)) * 1e-3
			}
			u := newUndoLog(0, n, []int{n / 3, 2 * n / 3})
			var plain, rec time.Duration
			step := int64(0)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				step++
				o.prepare(step)
				t0 := time.Now()
				parallelFor(n, 1, 16, func(a, b int) { o.update(p, g, a, b) })
				plain += time.Since(t0)
				step++
				o.prepare(step)
				t0 = time.Now()
				if err := u.apply(o, p, g, 1, nil); err != nil {
					b.Fatal(err)
				}
				rec += time.Since(t0)
				u.commit()
			}
			ep, em, ev := u.exceptions()
			b.ReportMetric(float64(rec)/float64(plain), "undo/plain")
			bufs := 1 + min(len(o.m), 1) + min(len(o.v), 1)
			b.ReportMetric(float64(bufs*n+8*(ep+em+ev))/n, "undo-B/elem")
		})
	}
}

// BenchmarkUndoStep: whole training steps (forward, backward, update) of
// a 16 MiB model under Adam, --save-every 0, with --undo against without,
// alternating rounds in the same run; reports the ratio of the mean step
// times: the steady-state cost of keeping the undo data.
func BenchmarkUndoStep(b *testing.B) {
	c := Defaults()
	c.SizeBytes, c.Steps, c.SaveEvery, c.LogEvery, c.Threads = 16<<20, 12, 0, 1000, 1
	var off, on float64
	for i := 0; i < b.N; i++ {
		for _, undo := range []bool{false, true} {
			c.Undo = undo
			res, errs := RunLocal(c, 1, nil)
			if errs[0] != nil {
				b.Fatal(errs[0])
			}
			if undo {
				on += res[0].MeanStepMs
			} else {
				off += res[0].MeanStepMs
			}
		}
	}
	b.ReportMetric(on/off, "undo/off")
	b.ReportMetric(off/float64(b.N), "off-ms/step")
}
