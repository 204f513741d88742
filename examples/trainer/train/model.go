package train

import (
	"math"
	"runtime"
	"sync"
)

// All float32 products are written float32(a*b): the Go spec lets a compiler
// fuse a*b+c into an FMA unless the product is explicitly converted, and a
// fused result would differ between builds.

// splitmix64 finaliser: a counter-based generator, so any element of the data
// or of the initial weights can be computed on its own from its coordinates.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

func key(parts ...uint64) uint64 {
	h := uint64(0x5265465472616e)
	for _, p := range parts {
		h = mix(h ^ p)
	}
	return h
}

// unit maps 64 random bits to a float32 in [-1, 1).
func unit(u uint64) float32 { return float32(int32(u>>32)) / (1 << 31) }

const (
	domainData    = 1
	domainTeacher = 2
	domainInit    = 3
)

// sampleInput fills x with the input of global sample idx of step: a pure
// function of (seed, step, idx), whichever rank computes it.
func sampleInput(seed uint64, step int64, idx int, x []float32) {
	k := key(seed, domainData, uint64(step), uint64(idx))
	for i := range x {
		x[i] = unit(mix(k + uint64(i)))
	}
}

// teacherFanIn inputs feed each teacher output.
const teacherFanIn = 8

// teacher is the fixed seeded function the MLP learns: output j is
// tanh(0.5 * sum of teacherFanIn signed inputs). Sparse, so computing
// targets costs little next to the model.
type teacher struct {
	idx  []int32
	sign []float32
}

func newTeacher(seed uint64, width int) *teacher {
	t := &teacher{idx: make([]int32, width*teacherFanIn), sign: make([]float32, width*teacherFanIn)}
	for i := range t.idx {
		u := mix(key(seed, domainTeacher) + uint64(i))
		t.idx[i] = int32(u % uint64(width))
		t.sign[i] = 1
		if u>>63 == 1 {
			t.sign[i] = -1
		}
	}
	return t
}

func (t *teacher) target(x, y []float32) {
	for j := range y {
		var s float32
		for k := 0; k < teacherFanIn; k++ {
			s += float32(t.sign[j*teacherFanIn+k] * x[t.idx[j*teacherFanIn+k]])
		}
		y[j] = float32(math.Tanh(float64(float32(0.5 * s))))
	}
}

// layer is one dense layer y = act(W x + b), W out x in row-major. Its slices
// are views into the stage's flat parameter and gradient buffers.
type layer struct {
	global  int  // index in the whole model
	in, out int  //
	linear  bool // the model's last layer has no tanh
	w, b    []float32
	gw, gb  []float32
}

// initLayer draws W uniform in [-1/sqrt(in), 1/sqrt(in)) from (seed, global
// layer, element), so a layer's values do not depend on the pipeline split.
func initLayer(seed uint64, l *layer, threads int) {
	scale := float32(1 / math.Sqrt(float64(l.in)))
	k := key(seed, domainInit, uint64(l.global))
	parallelFor(l.out, threads, l.in, func(lo, hi int) {
		for i := lo * l.in; i < hi*l.in; i++ {
			l.w[i] = float32(unit(mix(k+uint64(i))) * scale)
		}
	})
	clear(l.b)
}

// forward computes y (n x out) from x (n x in).
func (l *layer) forward(x, y []float32, n, threads int) {
	parallelFor(l.out, threads, n*l.in, func(lo, hi int) {
		for o := lo; o < hi; o++ {
			row := l.w[o*l.in : (o+1)*l.in]
			for s := 0; s < n; s++ {
				z := dot(row, x[s*l.in:(s+1)*l.in]) + l.b[o]
				if !l.linear {
					z = float32(math.Tanh(float64(z)))
				}
				y[s*l.out+o] = z
			}
		}
	})
}

// backward takes gy = dL/dy (n x out, overwritten with dL/dz), the layer's
// input x and output y, accumulates dL/dW and dL/db, and writes dL/dx into gx
// unless gx is nil.
func (l *layer) backward(x, y, gy, gx []float32, n, threads int) {
	if !l.linear {
		for i, g := range gy {
			gy[i] = float32(g * float32(1-float32(y[i]*y[i])))
		}
	}
	parallelFor(l.out, threads, n*l.in, func(lo, hi int) {
		for o := lo; o < hi; o++ {
			grow := l.gw[o*l.in : (o+1)*l.in]
			for s := 0; s < n; s++ {
				g := gy[s*l.out+o]
				axpy(g, x[s*l.in:(s+1)*l.in], grow)
				l.gb[o] += g
			}
		}
	})
	if gx == nil {
		return
	}
	// dL/dx by column blocks: each element is summed over o in a fixed order.
	parallelFor(l.in, threads, n*l.out, func(lo, hi int) {
		for s := 0; s < n; s++ {
			dst := gx[s*l.in+lo : s*l.in+hi]
			clear(dst)
			for o := 0; o < l.out; o++ {
				axpy(gy[s*l.out+o], l.w[o*l.in+lo:o*l.in+hi], dst)
			}
		}
	})
}

// dot with four partial sums, combined in a fixed order.
func dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += float32(a[i] * b[i])
		s1 += float32(a[i+1] * b[i+1])
		s2 += float32(a[i+2] * b[i+2])
		s3 += float32(a[i+3] * b[i+3])
	}
	for ; i < len(a); i++ {
		s0 += float32(a[i] * b[i])
	}
	return (s0 + s1) + (s2 + s3)
}

// axpy: y += a*x.
func axpy(a float32, x, y []float32) {
	x = x[:len(y)]
	for i := range y {
		y[i] += float32(a * x[i])
	}
}

// parallelFor splits [0, n) into contiguous blocks over up to threads
// goroutines (0: GOMAXPROCS). Every output element is computed by exactly one
// goroutine in a fixed order, so results do not depend on the split. cost is
// the work per index, to keep small loops on the calling goroutine.
func parallelFor(n, threads, cost int, f func(lo, hi int)) {
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	if threads > n {
		threads = n
	}
	if threads <= 1 || n*cost < 1<<15 {
		f(0, n)
		return
	}
	var wg sync.WaitGroup
	for t := 0; t < threads; t++ {
		lo, hi := n*t/threads, n*(t+1)/threads
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(lo, hi)
		}()
	}
	wg.Wait()
}
