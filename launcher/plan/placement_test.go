package plan

import (
	"math"
	"math/bits"
	"strings"
	"testing"
)

func TestGeminiCorollary1(t *testing.T) {
	tests := []struct {
		k    int
		want float64 // percent, as GEMINI prints it
	}{
		{2, 93.3},
		{3, 80.0},
	}
	for _, tc := range tests {
		p := Placement{Nodes: 16, Replicas: 2, Failures: tc.k}
		if got := round(100*p.Recovery(), 1); got != tc.want {
			t.Errorf("N=16 M=2 K=%d: recovery %.3f %%, want %.1f %%", tc.k, 100*p.Recovery(), tc.want)
		}
		if got := round(100*p.CorollaryBound(), 1); got != tc.want {
			t.Errorf("N=16 M=2 K=%d: Corollary 1 bound %.3f %%, want %.1f %%", tc.k, 100*p.CorollaryBound(), tc.want)
		}
	}
}

// TestGeminiFigure3 is the paper's N=4, m=2 example: two failures lose
// data in 2 of 6 cases with groups and 4 of 6 with a ring.
func TestGeminiFigure3(t *testing.T) {
	p := Placement{Nodes: 4, Replicas: 2, Failures: 2}
	if got := p.Recovery(); math.Abs(got-4.0/6) > 1e-12 {
		t.Errorf("group recovery = %v, want 4/6", got)
	}
	if got := p.Ring(); math.Abs(got-2.0/6) > 1e-12 {
		t.Errorf("ring recovery = %v, want 2/6", got)
	}
}

// holders lists, for each machine, the machines holding its replicas,
// built straight from GEMINI Algorithm 1's description.
func holders(n, m int, ringOnly bool) [][]int {
	out := make([][]int, n)
	groups, ring := (Placement{Nodes: n, Replicas: m}).Layout()
	if ringOnly {
		groups, ring = 0, n
	}
	for g := 0; g < groups; g++ {
		for i := 0; i < m; i++ {
			for j := 0; j < m; j++ {
				out[g*m+i] = append(out[g*m+i], g*m+j)
			}
		}
	}
	base := groups * m
	for i := 0; i < ring; i++ {
		for j := 0; j < m; j++ {
			out[base+i] = append(out[base+i], base+(i+j)%ring)
		}
	}
	return out
}

// bruteRecovery enumerates every k-subset of failed machines.
func bruteRecovery(n, m, k int, ringOnly bool) float64 {
	h := holders(n, m, ringOnly)
	good, all := 0, 0
	for set := uint32(0); set < 1<<n; set++ {
		if bits.OnesCount32(set) != k {
			continue
		}
		all++
		ok := true
		for _, hs := range h {
			lost := true
			for _, x := range hs {
				if set&(1<<x) == 0 {
					lost = false
					break
				}
			}
			if lost {
				ok = false
				break
			}
		}
		if ok {
			good++
		}
	}
	return float64(good) / float64(all)
}

func TestPlacementAgainstEnumeration(t *testing.T) {
	for n := 2; n <= 13; n++ {
		for m := 1; m <= min(n, 4); m++ {
			for k := 0; k <= n; k++ {
				p := Placement{Nodes: n, Replicas: m, Failures: k}
				if got, want := p.Recovery(), bruteRecovery(n, m, k, false); math.Abs(got-want) > 1e-9 {
					t.Errorf("mixed N=%d m=%d k=%d: %v, enumeration gives %v", n, m, k, got, want)
				}
				if got, want := p.Ring(), bruteRecovery(n, m, k, true); math.Abs(got-want) > 1e-9 {
					t.Errorf("ring N=%d m=%d k=%d: %v, enumeration gives %v", n, m, k, got, want)
				}
				if b := p.CorollaryBound(); !math.IsNaN(b) && b > p.Recovery()+1e-12 {
					t.Errorf("N=%d m=%d k=%d: Corollary 1 bound %v above the exact %v", n, m, k, b, p.Recovery())
				}
			}
		}
	}
}

// TestPlacementLarge runs at a job's scale, where enumeration is out of
// reach: the bound is exact below 2m failures, and groups beat the ring.
func TestPlacementLarge(t *testing.T) {
	for _, k := range []int{2, 3, 5} {
		p := Placement{Nodes: 4096, Replicas: 3, Failures: k}
		r, b := p.Recovery(), p.CorollaryBound()
		if math.Abs(r-b) > 1e-9 {
			t.Errorf("N=4096 m=3 k=%d: exact %v, bound %v; they must agree below 2m", k, r, b)
		}
		if p.Ring() > r+1e-9 {
			t.Errorf("N=4096 m=3 k=%d: ring %v beats groups %v", k, p.Ring(), r)
		}
	}
}

func TestPlacementValidate(t *testing.T) {
	tests := []struct {
		p    Placement
		want string
	}{
		{Placement{0, 2, 1}, "--nodes must be >= 1"},
		{Placement{16, 0, 1}, "--replicas must be >= 1"},
		{Placement{4, 5, 1}, "must not exceed --nodes"},
		{Placement{16, 2, 17}, "--failures must lie in"},
	}
	for _, tc := range tests {
		if err := tc.p.validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error = %v, want one containing %q", tc.p, err, tc.want)
		}
	}
}
