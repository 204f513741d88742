package logplan

import (
	"fmt"
	"math"
)

// Algorithm picks the grouping.
type Algorithm string

const (
	// Optimal finds the grouping of least R(𝒢) under the cap, exactly.
	// Under a per-node cap a node's log memory depends only on its own
	// group's two edges (an inner node holds no log), so feasibility is
	// per group and R(𝒢) is a sum over groups: a dynamic program over
	// the group ending at each node is exact, in O(N²).
	Optimal Algorithm = "optimal"
	// Greedy is SWIFT's algorithm as section 5.3 states it: start with one
	// group per node and merge the adjacent pair of least ΔR/ΔM until the
	// memory fits. It is a heuristic and can miss the optimum (the tests
	// show a case); it is here to reproduce the paper.
	Greedy Algorithm = "swift-greedy"
)

// Choose validates in and returns the grouping algo picks. Every boundary
// with no cap (NodeCap = +Inf) is logged; with NodeCap 0 the pipeline is
// one group and nothing is logged.
func Choose(in Input, algo Algorithm) (Plan, error) {
	if err := in.Validate(); err != nil {
		return Plan{}, err
	}
	switch algo {
	case Optimal:
		m := newModel(in)
		return m.planFor(m.optimal()), nil
	case Greedy:
		m := newModel(in)
		return m.planFor(m.greedy()), nil
	}
	return Plan{}, fmt.Errorf("algorithm %q: use %q (the least expected recovery time) or %q (SWIFT's heuristic)", algo, Optimal, Greedy)
}

// fits says whether the group first..last, with both its edges logged,
// keeps its nodes within the cap. Only its first and last node hold logs:
// the first the gradients it sends back over first-1|first, the last the
// activations it sends over last|last+1.
func (m *model) fits(first, last int) bool {
	var head, tail float64
	if first > 0 {
		head = m.logBytes(m.BackwardBytes[first-1])
	}
	if last < len(m.StageSeconds)-1 {
		tail = m.logBytes(m.ForwardBytes[last])
	}
	if first == last {
		return head+tail <= m.NodeCap
	}
	return head <= m.NodeCap && tail <= m.NodeCap
}

// optimal returns the logged boundaries of the least-R(𝒢) grouping.
// best[j] is the least sum of |G|/N*R(G) over groupings of nodes 0..j-1;
// ties keep the smallest first node of the last group (fewer groups, less
// memory). One group always fits: it logs nothing.
func (m *model) optimal() []bool {
	n := len(m.StageSeconds)
	best := make([]float64, n+1)
	from := make([]int, n+1)
	for j := 1; j <= n; j++ {
		best[j] = math.Inf(1)
		for i := 0; i < j; i++ {
			if math.IsInf(best[i], 1) || !m.fits(i, j-1) {
				continue
			}
			if c := best[i] + m.weighted(i, j-1); c < best[j] {
				best[j], from[j] = c, i
			}
		}
	}
	logged := make([]bool, n-1)
	for j := n; j > 0; j = from[j] {
		if from[j] > 0 {
			logged[from[j]-1] = true
		}
	}
	return logged
}

// greedy is section 5.3's loop: at most N-1 merges, each scanning the
// boundaries, O(N²). ΔR is the paper's
//
//	ΔR = R(G_i ∪ G_i+1)(|G_i|+|G_i+1|)/N - R(G_i)|G_i|/N - R(G_i+1)|G_i+1|/N
//
// and ΔM the memory the merge frees, 2T(M_fwd + M_bwd) (the paper's
// T·M(G_i, G_i+1), times KeptIntervals). The paper stops when the total
// fits M_max; under a per-node cap it stops when every node fits, and
// only merges that relieve a node over the cap are candidates: any other
// merge adds recovery time and brings no node under it. Ties go to the
// lowest boundary.
func (m *model) greedy() []bool {
	n := len(m.StageSeconds)
	logged := make([]bool, n-1)
	// first[i], last[i]: the group node i is in, kept up to date on merges.
	first, last := make([]int, n), make([]int, n)
	for i := range first {
		first[i], last[i] = i, i
	}
	for i := range logged {
		logged[i] = true
	}
	for {
		best, bestRatio := -1, math.Inf(1)
		for b := range logged {
			if !logged[b] || !(m.nodeBytes(b, logged) > m.NodeCap || m.nodeBytes(b+1, logged) > m.NodeCap) {
				continue
			}
			dR := m.weighted(first[b], last[b+1]) - m.weighted(first[b], b) - m.weighted(b+1, last[b+1])
			if r := dR / (m.logBytes(m.ForwardBytes[b]) + m.logBytes(m.BackwardBytes[b])); r < bestRatio {
				best, bestRatio = b, r
			}
		}
		if best < 0 {
			return logged // every node fits
		}
		logged[best] = false
		f, l := first[best], last[best+1]
		for i := f; i <= l; i++ {
			first[i], last[i] = f, l
		}
	}
}
