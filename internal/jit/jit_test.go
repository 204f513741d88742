package jit

import (
	"math"
	"testing"
)

// JIT Table 8 (BERT-L-PT, o = 5 s, f = 2e-3 per GPU-day) prints c* per hour.
func TestOptimalTable8(t *testing.T) {
	for _, tc := range []struct {
		n       float64
		perHour float64
	}{{4, 0.3464}, {1024, 5.543}, {8192, 15.68}} {
		got := OptimalPerSecond(tc.n, 2e-3, 5) * 3600
		if math.Abs(got-tc.perHour)/tc.perHour > 1e-3 {
			t.Errorf("N=%g: c* = %.4f per hour, want %.4f", tc.n, got, tc.perHour)
		}
		if iv := OptimalInterval(tc.n, 2e-3, 5); math.Abs(iv*got/3600-1) > 1e-12 {
			t.Errorf("N=%g: interval %g s is not 1/c*", tc.n, iv)
		}
	}
}
