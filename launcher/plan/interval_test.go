package plan

import (
	"math"
	"strings"
	"testing"
)

// truncate cuts v to the given decimals, the way JIT Table 8 prints its
// figures (0.3464 per hour appears as 0.34, 15.68 as 15.6).
func truncate(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Floor(v*p+1e-9) / p
}

func TestJITTable8(t *testing.T) {
	bert := Interval{FailuresPerGPUDay: 2e-3, CheckpointSeconds: 5, RestartSeconds: 9.9}
	tests := []struct {
		gpus int
		// per hour and percent exactly as Table 8 prints them, with the
		// number of decimals each has
		perHour   float64
		perDigits int
		wasted    float64 // percent
		wDigits   int
		// which JIT quantity the printed percentage matches: Eq. 6's w_f,
		// or for N = 8192 Eq. 5's w* (Eq. 6 gives 4.34 % there)
		useWStar bool
	}{
		{4, 0.34, 2, 0.096, 3, false},
		{1024, 5.54, 2, 1.53, 2, false},
		{8192, 15.6, 1, 4.5, 1, true},
	}
	for _, tc := range tests {
		iv := bert
		iv.GPUs = tc.gpus
		if got := truncate(iv.PerHour(), tc.perDigits); got != tc.perHour {
			t.Errorf("N=%d: c* = %.4f per hour, Table 8 prints %g", tc.gpus, iv.PerHour(), tc.perHour)
		}
		w := 100 * iv.WastedFraction()
		if tc.useWStar {
			w = 100 * iv.WastedPerUseful()
		}
		if got := truncate(w, tc.wDigits); got != tc.wasted {
			t.Errorf("N=%d: wasted %.4f %%, Table 8 prints %g %%", tc.gpus, w, tc.wasted)
		}
	}
	// Pin the N = 8192 discrepancy: Eq. 6 applied to Table 8's inputs.
	iv := bert
	iv.GPUs = 8192
	if got := round(100*iv.WastedFraction(), 2); got != 4.35 {
		t.Errorf("N=8192: w_f = %.4f %%, want 4.35 %% from Eq. 6", 100*iv.WastedFraction())
	}
}

// TestJITEq10 checks the paper's own numeric form of Eq. 5 for BERT-L-PT,
// w* = 4.8e-4 sqrt(N) + 2.3e-7 N, to its two significant digits.
func TestJITEq10(t *testing.T) {
	iv := Interval{FailuresPerGPUDay: 2e-3, CheckpointSeconds: 5, RestartSeconds: 9.9}
	for _, n := range []int{1, 64, 4096} {
		iv.GPUs = n
		want := 4.8e-4*math.Sqrt(float64(n)) + 2.3e-7*float64(n)
		if got := iv.WastedPerUseful(); math.Abs(got-want)/want > 0.01 {
			t.Errorf("N=%d: w* = %.4g, Eq. 10 gives %.4g", n, got, want)
		}
	}
}

func TestIntervalOptimum(t *testing.T) {
	// c* must minimise Eq. 1's W/(Nt) = c o + N f r + N f / (2c).
	iv := Interval{GPUs: 1024, FailuresPerGPUDay: 2e-3, CheckpointSeconds: 5, RestartSeconds: 9.9}
	nf := float64(iv.GPUs) * iv.perSecond()
	w := func(c float64) float64 { return c*iv.CheckpointSeconds + nf*iv.RestartSeconds + nf/(2*c) }
	c := iv.OptimalPerSecond()
	if got := w(c); math.Abs(got-iv.WastedPerUseful()) > 1e-12 {
		t.Errorf("Eq. 1 at c* = %g, Eq. 5 = %g", got, iv.WastedPerUseful())
	}
	for _, f := range []float64{0.9, 1.1} {
		if w(c*f) <= w(c) {
			t.Errorf("W(%g c*) = %g is not above W(c*) = %g", f, w(c*f), w(c))
		}
	}
}

func TestReftLoss(t *testing.T) {
	tests := []struct {
		name      string
		iv        Interval
		wantLoss  float64
		wantShare float64
	}{
		// 1024 GPUs fail 2.048 times a day; each costs one 2 s step + 9.9 s.
		{"restart from flag", Interval{GPUs: 1024, FailuresPerGPUDay: 2e-3, CheckpointSeconds: 5, RestartSeconds: 9.9, StepSeconds: 2}, 11.9, 2.048 * 11.9 / 86400},
		{"own reft restart", Interval{GPUs: 1024, FailuresPerGPUDay: 2e-3, CheckpointSeconds: 5, RestartSeconds: 9.9, StepSeconds: 2, ReftRestartSeconds: 3}, 5, 2.048 * 5 / 86400},
	}
	for _, tc := range tests {
		if got := tc.iv.ReftLossSeconds(); math.Abs(got-tc.wantLoss) > 1e-12 {
			t.Errorf("%s: loss %g s, want %g", tc.name, got, tc.wantLoss)
		}
		want := tc.wantShare / (1 + tc.wantShare)
		if got := tc.iv.ReftWastedFraction(); math.Abs(got-want) > 1e-15 {
			t.Errorf("%s: share %g, want %g", tc.name, got, want)
		}
		if tc.iv.ReftWastedFraction() >= tc.iv.WastedFraction() {
			t.Errorf("%s: reft wastes %g, periodic %g", tc.name, tc.iv.ReftWastedFraction(), tc.iv.WastedFraction())
		}
	}
}

func TestIntervalWarnings(t *testing.T) {
	fine := Interval{GPUs: 1024, FailuresPerGPUDay: 2e-3, CheckpointSeconds: 5, RestartSeconds: 9.9}
	if w := fine.warnings(); len(w) != 0 {
		t.Errorf("Table 8 inputs warn: %v", w)
	}
	// A checkpoint of 3 hours on a failure-prone job cannot keep up.
	bad := Interval{GPUs: 16384, FailuresPerGPUDay: 0.05, CheckpointSeconds: 10800, RestartSeconds: 60}
	w := bad.warnings()
	if len(w) != 2 || !strings.Contains(w[0], "GEMINI Eq. 2") || !strings.Contains(w[1], "never make progress") {
		t.Errorf("warnings = %q, want the Eq. 2 and the progress warning", w)
	}
}

func TestIntervalValidate(t *testing.T) {
	ok := Interval{GPUs: 4, FailuresPerGPUDay: 2e-3, CheckpointSeconds: 5, RestartSeconds: 9.9}
	tests := []struct {
		edit func(*Interval)
		want string
	}{
		{func(i *Interval) { i.GPUs = 0 }, "--gpus must be >= 1"},
		{func(i *Interval) { i.FailuresPerGPUDay = 0 }, "--failures-per-gpu-day must be > 0"},
		{func(i *Interval) { i.CheckpointSeconds = 0 }, "--checkpoint-seconds must be > 0"},
		{func(i *Interval) { i.RestartSeconds = -2 }, "--restart-seconds must be >= 0"},
		{func(i *Interval) { i.StepSeconds = math.NaN() }, "--step-seconds must be >= 0"},
	}
	for _, tc := range tests {
		iv := ok
		tc.edit(&iv)
		if err := iv.validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error = %v, want one containing %q", err, tc.want)
		}
	}
}
