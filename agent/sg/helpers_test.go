package sg

import (
	"fmt"
	"testing"

	"github.com/reft-hpc/reft/spank/spec"
)

// block builds a job with ranks placed rpn per node in rank order (Slurm's
// block distribution) on nodes n1, n2, ...
func block(t testing.TB, specStr string, dp, pp, tp, rpn int, kinds Kind, domains map[string]string) Job {
	t.Helper()
	s, err := spec.Parse(specStr)
	if err != nil {
		t.Fatal(err)
	}
	l := Layout{DP: dp, PP: pp, TP: tp}
	rn := make([]string, l.World())
	for r := range rn {
		rn[r] = fmt.Sprintf("n%d", r/rpn+1)
	}
	return Job{Spec: s, Layout: l, Topology: Topology{RankNode: rn, Domain: domains}, Kinds: kinds}
}

func mustModel(t testing.TB, j Job) *Model {
	t.Helper()
	md, err := NewModel(j)
	if err != nil {
		t.Fatal(err)
	}
	return md
}

// subsets calls f with every subset of n items as a mask.
func subsets(n int, f func(mask []bool, size int)) {
	mask := make([]bool, n)
	for bits := 0; bits < 1<<n; bits++ {
		size := 0
		for i := range mask {
			mask[i] = bits&(1<<i) != 0
			if mask[i] {
				size++
			}
		}
		f(mask, size)
	}
}

func names(mask []bool) []string {
	var out []string
	for i, x := range mask {
		if x {
			out = append(out, fmt.Sprintf("n%d", i+1))
		}
	}
	return out
}
