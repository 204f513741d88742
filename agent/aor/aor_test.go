package aor

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// reference is the trainer's optimizer update as it was before its state
// part moved here (examples/trainer/train/optim.go): m and v in the same
// loop as the parameter update. The kernels must give the same bits.
func reference(o Optimizer, p, m, v, g []float32, lr, lrDecay, bc1, bc2, eps float32) {
	for i := range g {
		switch o.Kind {
		case SGD:
			p[i] -= float32(lr * g[i])
		case Momentum:
			m[i] = float32(o.Momentum*m[i]) + g[i]
			p[i] -= float32(lr * m[i])
		case Adam, AdamW:
			if o.Kind == AdamW {
				p[i] = float32(p[i] * lrDecay)
			}
			gi := g[i]
			m[i] = float32(o.Beta1*m[i]) + float32((1-o.Beta1)*gi)
			v[i] = float32(o.Beta2*v[i]) + float32(float32((1-o.Beta2)*gi)*gi)
			mh := m[i] / bc1
			vh := v[i] / bc2
			den := float32(math.Sqrt(float64(vh))) + eps
			p[i] -= float32(lr*mh) / den
		}
	}
}

// gradients gives a step's gradient with awkward values: tiny, huge,
// subnormal, zero of both signs.
func gradients(r *rand.Rand, n int) []float32 {
	g := make([]float32, n)
	for i := range g {
		switch r.IntN(8) {
		case 0:
			g[i] = float32(r.NormFloat64() * 1e-30)
		case 1:
			g[i] = float32(r.NormFloat64() * 1e6)
		case 2:
			g[i] = math.Float32frombits(uint32(r.IntN(1 << 23))) // subnormal
		case 3:
			g[i] = float32(math.Copysign(0, r.NormFloat64()))
		default:
			g[i] = float32(r.NormFloat64() * 1e-3)
		}
	}
	return g
}

var optimizers = []Optimizer{
	{Kind: SGD},
	{Kind: Momentum, Momentum: 0.9},
	{Kind: Momentum, Momentum: 0},
	{Kind: Adam, Beta1: 0.9, Beta2: 0.999},
	{Kind: Adam, Beta1: 0.5, Beta2: 0.9},
	{Kind: AdamW, Beta1: 0.9, Beta2: 0.999},
}

// TestMatchesTrainerUpdate: an owner running the trainer's fused update
// and a replica running Moments (and, separately, Update per state) on the
// same gradients hold the same bits after every step.
func TestMatchesTrainerUpdate(t *testing.T) {
	const n, steps = 1001, 50
	for _, o := range optimizers {
		t.Run(o.Kind, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			p := make([]float32, n)
			m, v := make([]float32, n), make([]float32, n)   // owner
			rm, rv := make([]float32, n), make([]float32, n) // replica, Moments
			um, uv := make([]float32, n), make([]float32, n) // replica, Update per state
			for step := 1; step <= steps; step++ {
				g := gradients(r, n)
				bc1 := float32(1 - math.Pow(float64(o.Beta1), float64(step)))
				bc2 := float32(1 - math.Pow(float64(o.Beta2), float64(step)))
				reference(o, p, m, v, g, 1e-3, 0.99999, bc1, bc2, 1e-8)
				o.Moments(rm, rv, g)
				for _, st := range o.StateBuffers() {
					s := map[string][]float32{StateM: um, StateV: uv}[st]
					if err := o.Update(st, s, g); err != nil {
						t.Fatal(err)
					}
				}
				if !Equal(m, rm) || !Equal(v, rv) {
					t.Fatalf("step %d: Moments differs from the trainer's update", step)
				}
				if !Equal(m, um) || !Equal(v, uv) {
					t.Fatalf("step %d: Update per state differs from the trainer's update", step)
				}
			}
			if o.Kind != SGD && Equal(m, make([]float32, n)) {
				t.Fatal("state stayed zero: the test compares nothing")
			}
		})
	}
}

// TestSplitInvariant: pieces of the range (as the trainer's goroutines
// and an agent's copier may cut it) give the same bits as one call.
func TestSplitInvariant(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	o := Optimizer{Kind: Adam, Beta1: 0.9, Beta2: 0.999}
	const n = 777
	m, v := make([]float32, n), make([]float32, n)
	pm, pv := make([]float32, n), make([]float32, n)
	for step := 0; step < 5; step++ {
		g := gradients(r, n)
		o.Moments(m, v, g)
		for lo := 0; lo < n; lo += 100 {
			hi := min(lo+100, n)
			o.Moments(pm[lo:hi], pv[lo:hi], g[lo:hi])
		}
	}
	if !Equal(m, pm) || !Equal(v, pv) {
		t.Fatal("split update differs")
	}
}

func TestValidate(t *testing.T) {
	nan := float32(math.NaN())
	for _, tc := range []struct {
		o    Optimizer
		want string // "" valid; else a substring of the error
	}{
		{Optimizer{Kind: SGD}, ""},
		{Optimizer{Kind: Momentum, Momentum: 0.9}, ""},
		{Optimizer{Kind: Momentum}, ""},
		{Optimizer{Kind: Momentum, Momentum: 1}, "momentum 1: must be in [0, 1)"},
		{Optimizer{Kind: Momentum, Momentum: -0.1}, "momentum -0.1"},
		{Optimizer{Kind: Momentum, Momentum: nan}, "momentum NaN"},
		{Optimizer{Kind: Adam, Beta1: 0.9, Beta2: 0.999}, ""},
		{Optimizer{Kind: AdamW, Beta1: 0, Beta2: 0.5}, ""},
		{Optimizer{Kind: Adam, Beta1: 1, Beta2: 0.999}, "beta1 1"},
		{Optimizer{Kind: AdamW, Beta1: 0.9, Beta2: nan}, "beta2 NaN"},
		{Optimizer{Kind: Adam, Beta1: 0.9, Beta2: 0.999, Momentum: 7}, ""}, // momentum is not adam's
		{Optimizer{Kind: "adagrad"}, `optimizer "adagrad": use one of sgd, momentum, adam, adamw`},
		{Optimizer{}, `optimizer ""`},
	} {
		err := tc.o.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v", tc.o, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: error %v, want one with %q", tc.o, err, tc.want)
		}
	}
}

func TestStateBuffers(t *testing.T) {
	for _, tc := range []struct {
		kind string
		want string
	}{{SGD, "[]"}, {Momentum, "[m]"}, {Adam, "[m v]"}, {AdamW, "[m v]"}, {"lion", "[]"}} {
		o := Optimizer{Kind: tc.kind}
		if got := strings.Join(o.StateBuffers(), " "); "["+got+"]" != tc.want {
			t.Errorf("%s: %v, want %s", tc.kind, o.StateBuffers(), tc.want)
		}
		if o.HasState(StateV) != (tc.want == "[m v]") {
			t.Errorf("%s: HasState(v) = %v", tc.kind, o.HasState(StateV))
		}
	}
}

func TestUpdateErrors(t *testing.T) {
	g := make([]float32, 4)
	for _, tc := range []struct {
		o     Optimizer
		state string
		n     int
		want  string
	}{
		{Optimizer{Kind: Momentum}, StateV, 4, `optimizer "momentum" has no state "v"`},
		{Optimizer{Kind: SGD}, StateM, 4, `optimizer "sgd" has no state "m"`},
		{Optimizer{Kind: Adam}, "w", 4, `no state "w"`},
		{Optimizer{Kind: Adam}, StateV, 3, "state \"v\" has 3 elements, the gradient 4"},
	} {
		err := tc.o.Update(tc.state, make([]float32, tc.n), g)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %s: %v, want %q", tc.o.Kind, tc.state, err, tc.want)
		}
	}
}

func TestFloat32s(t *testing.T) {
	f := []float32{1, -2.5, 3}
	b := make([]byte, 12)
	for i, x := range f {
		u := math.Float32bits(x)
		b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
	}
	got, err := Float32s(b)
	if err != nil || !Equal(got, f) {
		t.Fatalf("Float32s = %v, %v; want %v (little-endian host)", got, err, f)
	}
	got[0] = 7 // a view, not a copy
	if b[3] == 0x3f {
		t.Error("Float32s copied")
	}
	if _, err := Float32s(b[:5]); err == nil {
		t.Error("5 bytes accepted")
	}
	if _, err := Float32s(b[1:9]); err == nil {
		t.Error("misaligned buffer accepted")
	}
	if got, err := Float32s(nil); got != nil || err != nil {
		t.Errorf("nil: %v, %v", got, err)
	}
}

func TestEqual(t *testing.T) {
	nz := float32(math.Copysign(0, -1))
	nan := float32(math.NaN())
	if Equal([]float32{0}, []float32{nz}) {
		t.Error("+0 equals -0")
	}
	if !Equal([]float32{nan}, []float32{nan}) {
		t.Error("a NaN differs from its own bits")
	}
	if Equal([]float32{1}, []float32{1, 2}) {
		t.Error("lengths ignored")
	}
}
