package sg

import (
	"fmt"
	"math/big"
	"slices"
	"strings"
	"testing"
)

func nodeNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("n%d", i+1)
	}
	return out
}

func TestPlaceShapes(t *testing.T) {
	p, err := Place(nodeNames(4), 2)
	if err != nil || p.Strategy != "group" || len(p.Groups) != 2 || p.Ring != nil {
		t.Fatalf("N=4 m=2: %+v %v", p, err)
	}
	if !slices.Equal(p.Holders["n3"], []string{"n4"}) {
		t.Errorf("holders of n3 %v", p.Holders["n3"])
	}
	// GEMINI Figure 3c: N=5, m=2: one group of two, a ring of three.
	p, _ = Place(nodeNames(5), 2)
	if p.Strategy != "mixed" || !slices.Equal(p.Groups[0], []string{"n1", "n2"}) || !slices.Equal(p.Ring, []string{"n3", "n4", "n5"}) {
		t.Fatalf("N=5 m=2: %+v", p)
	}
	if !slices.Equal(p.Holders["n5"], []string{"n3"}) {
		t.Errorf("ring wraps: holders of n5 %v", p.Holders["n5"])
	}
	// m < N < 2m: everything is one ring.
	p, _ = Place(nodeNames(5), 3)
	if len(p.Groups) != 0 || len(p.Ring) != 5 || !slices.Equal(p.Holders["n4"], []string{"n5", "n1"}) {
		t.Fatalf("N=5 m=3: %+v", p)
	}
	p, _ = Place(nodeNames(3), 1)
	if p.Strategy != "none" || len(p.Holders["n1"]) != 0 {
		t.Errorf("m=1: %+v", p)
	}
	for _, bad := range []struct {
		n, m int
		want string
	}{{3, 4, "need 4 distinct nodes"}, {3, 0, "at least 1 replica"}, {0, 1, "at least one node"}} {
		if _, err := Place(nodeNames(bad.n), bad.m); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Place(%d, %d): %v", bad.n, bad.m, err)
		}
	}
	if _, err := Place([]string{"a", "a"}, 1); err == nil {
		t.Error("duplicate node accepted")
	}
}

// TestPlaceRecovery: for N up to 11 and every m, every node has m-1
// distinct other holders and any m-1 failures keep a replica of
// everything. Brute-force counts reproduce GEMINI's figures (and `reft plan
// placement`): N=4 m=2 k=2 loses 2 of 6 sets (Figure 3a), N=16 m=2 recovers
// 93.3 % of 2-failure sets and 80 % of 3-failure sets.
func TestPlaceRecovery(t *testing.T) {
	for n := 1; n <= 11; n++ {
		for m := 1; m <= n; m++ {
			p, err := Place(nodeNames(n), m)
			if err != nil {
				t.Fatal(err)
			}
			for x, hs := range p.Holders {
				seen := map[string]bool{x: true}
				for _, h := range hs {
					if seen[h] {
						t.Fatalf("N=%d m=%d: holders of %s %v repeat or include it", n, m, x, hs)
					}
					seen[h] = true
				}
				if len(hs) != m-1 {
					t.Fatalf("N=%d m=%d: %s has %d holders", n, m, x, len(hs))
				}
			}
			subsets(n, func(f []bool, size int) {
				if size < m && !placementSurvives(p, f) {
					t.Fatalf("N=%d m=%d: %d failures %v lost state", n, m, size, names(f))
				}
			})
		}
	}
	for _, c := range []struct{ n, m, k, lost int }{{4, 2, 2, 2}, {16, 2, 2, 8}, {16, 2, 3, 112}} {
		p, _ := Place(nodeNames(c.n), c.m)
		lost := 0
		combos(c.n, c.k, func(f []bool) {
			if !placementSurvives(p, f) {
				lost++
			}
		})
		total := new(big.Int).Binomial(int64(c.n), int64(c.k)).Int64()
		if lost != c.lost {
			t.Errorf("N=%d m=%d k=%d: %d of %d sets lose state, want %d", c.n, c.m, c.k, lost, total, c.lost)
		}
	}
}

func placementSurvives(p Placement, f []bool) bool {
	dead := map[string]bool{}
	for _, x := range names(f) {
		dead[x] = true
	}
	for x, hs := range p.Holders {
		if !dead[x] {
			continue
		}
		ok := false
		for _, h := range hs {
			ok = ok || !dead[h]
		}
		if !ok {
			return false
		}
	}
	return true
}

// combos calls f with every k-subset of n as a mask.
func combos(n, k int, f func([]bool)) {
	mask := make([]bool, n)
	var rec func(start, left int)
	rec = func(start, left int) {
		if left == 0 {
			f(mask)
			return
		}
		for i := start; i <= n-left; i++ {
			mask[i] = true
			rec(i+1, left-1)
			mask[i] = false
		}
	}
	rec(0, k)
}
