package sg

import (
	"slices"
	"testing"

	"github.com/reft-hpc/reft/agent/erasure"
)

// TestMatchesErasureLayout holds the analysis to the codes the agent runs:
// without arc, sg's stripes are agent/erasure's (parity on members a..a+K-1,
// piece (a-i-1) mod m of member i in stripe a), and its ARC holders are
// erasure.ARCHolders. If either side changes, the analysis would promise
// recoveries the agent cannot do.
func TestMatchesErasureLayout(t *testing.T) {
	for m := 2; m <= 9; m++ {
		for k := 1; k < m; k++ {
			l, err := erasure.NewLayout(erasure.Params{Members: m, Parity: k, Size: 4096})
			if err != nil {
				t.Fatal(err)
			}
			e, err := NewEC(m, k, false)
			if err != nil {
				t.Fatal(err)
			}
			if e.DataPieces() != l.DataPieces() {
				t.Fatalf("m=%d k=%d: %d data pieces, erasure %d", m, k, e.DataPieces(), l.DataPieces())
			}
			for a := 0; a < m; a++ {
				st := e.Stripe(a)
				if !slices.Equal(st.Parity, l.StripeParity(a)) {
					t.Fatalf("m=%d k=%d stripe %d: parity on %v, erasure %v", m, k, a, st.Parity, l.StripeParity(a))
				}
				var members []int
				for _, d := range st.Data {
					members = append(members, d.Member)
					if got := l.PieceIn(d.Member, a); got != d.Index {
						t.Fatalf("m=%d k=%d stripe %d: member %d gives piece %d, erasure %d", m, k, a, d.Member, d.Index, got)
					}
				}
				slices.Sort(members)
				want := slices.Clone(l.StripeData(a))
				slices.Sort(want)
				if !slices.Equal(members, want) {
					t.Fatalf("m=%d k=%d stripe %d: data from %v, erasure %v", m, k, a, members, want)
				}
			}
		}
		g := Group{Members: make([]Member, m)}
		for i := 0; i < m; i++ {
			h, err := erasure.ARCHolders(m, 1, i)
			if err != nil {
				t.Fatal(err)
			}
			if h[0] != g.Holder(i) {
				t.Fatalf("m=%d: shard %d's ARC copy on %d, erasure %d", m, i, g.Holder(i), h[0])
			}
		}
	}
}
