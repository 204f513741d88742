package plan

import (
	"fmt"
	"math"
)

// Placement is GEMINI section 4: N machines, each keeping its checkpoint in
// its own memory and in m-1 peers' (m replicas in all), and k machines lost
// at once, every set of k equally likely. The checkpoint is lost when all m
// holders of some machine's replicas are among the k.
type Placement struct {
	Nodes    int // N
	Replicas int // m
	Failures int // k
}

func (p Placement) validate() error {
	switch {
	case p.Nodes < 1:
		return fmt.Errorf("--nodes must be >= 1; got %d", p.Nodes)
	case p.Replicas < 1:
		return fmt.Errorf("--replicas must be >= 1 (1 means only the local copy); got %d", p.Replicas)
	case p.Replicas > p.Nodes:
		return fmt.Errorf("--replicas (%d) must not exceed --nodes (%d): each replica needs its own machine", p.Replicas, p.Nodes)
	case p.Failures < 0 || p.Failures > p.Nodes:
		return fmt.Errorf("--failures must lie in [0, --nodes = %d]; got %d", p.Nodes, p.Failures)
	}
	return nil
}

// Layout returns GEMINI's mixed placement (Algorithm 1): when m divides N,
// N/m groups of m; otherwise floor(N/m)-1 groups and a ring of the
// remaining N - m(floor(N/m)-1) machines, each sending to the next m-1.
func (p Placement) Layout() (groups, ring int) {
	if p.Nodes%p.Replicas == 0 {
		return p.Nodes / p.Replicas, 0
	}
	g := p.Nodes/p.Replicas - 1
	return g, p.Nodes - g*p.Replicas
}

// Recovery is the exact probability that mixed placement recovers from CPU
// memory. Failures split hypergeometrically between the groups and the ring;
// each part must keep at least one replica of every checkpoint.
func (p Placement) Recovery() float64 {
	m, k := p.Replicas, p.Failures
	groups, ring := p.Layout()
	gm := groups * m
	gok := groupsIntact(groups, m, min(k, gm))
	total := 0.0
	for j := max(0, k-gm); j <= min(k, ring); j++ {
		w := math.Exp(logChoose(ring, j) + logChoose(gm, k-j) - logChoose(p.Nodes, k))
		total += w * ringIntact(ring, m, j) * gok[k-j]
	}
	return math.Min(total, 1)
}

// Ring is the same probability for plain ring placement over all N machines,
// the baseline GEMINI compares against.
func (p Placement) Ring() float64 { return ringIntact(p.Nodes, p.Replicas, p.Failures) }

// CorollaryBound is GEMINI Corollary 1 (Eq. 3), the paper's lower bound for
// group placement when m divides N: 1 if k < m, else
// max(0, 1 - N C(N-m, k-m) / (m C(N, k))). It counts each fully lost group
// once, so it is exact while no two groups can be lost together (k < 2m).
// NaN when m does not divide N, where the corollary does not apply.
func (p Placement) CorollaryBound() float64 {
	n, m, k := p.Nodes, p.Replicas, p.Failures
	if n%m != 0 {
		return math.NaN()
	}
	if k < m {
		return 1
	}
	return math.Max(0, 1-float64(n)/float64(m)*math.Exp(logChoose(n-m, k-m)-logChoose(n, k)))
}

// groupsIntact returns, for every i in [0, kmax], the probability that i
// failures spread uniformly over g groups of m machines leave no group fully
// failed. It adds one group at a time, splitting the i failures
// hypergeometrically between the new group and the rest, so it never forms
// a count that could overflow.
func groupsIntact(g, m, kmax int) []float64 {
	prev := make([]float64, kmax+1)
	prev[0] = 1 // zero groups: only zero failures fit, and nothing is lost
	for n := 1; n <= g; n++ {
		cur := make([]float64, kmax+1)
		size := n * m
		for i := 0; i <= min(kmax, size); i++ {
			s := 0.0
			for a := max(0, i-(size-m)); a <= min(i, m-1); a++ {
				s += math.Exp(logChoose(m, a)+logChoose(size-m, i-a)-logChoose(size, i)) * prev[i-a]
			}
			cur[i] = s
		}
		prev = cur
	}
	return prev
}

// ringIntact is the probability that j failures among L machines in a ring
// leave no m cyclically consecutive machines all failed (machine i's
// replicas live on i..i+m-1). It walks the ring once, drawing each machine
// failed with probability (failures left)/(machines left), which weighs
// every j-subset equally, and tracks the leading and trailing runs so the
// run that wraps around is caught too.
func ringIntact(L, m, j int) float64 {
	if L == 0 {
		if j == 0 {
			return 1
		}
		return 0
	}
	if j < m {
		return 1
	}
	if m == 1 {
		return 0 // j >= 1 failures and no peer copy
	}
	// state: closed says a survivor has been seen; lead is the length of
	// the run of failures before the first survivor; run is the current
	// trailing run; used counts failures so far.
	type key struct {
		closed          bool
		lead, run, used int
	}
	cur := map[key]float64{{}: 1}
	for pos := 0; pos < L; pos++ {
		next := make(map[key]float64, len(cur))
		left := L - pos
		for s, pr := range cur {
			pFail := float64(j-s.used) / float64(left)
			if pFail > 0 && s.run+1 < m {
				ns := s
				ns.run++
				ns.used++
				next[ns] += pr * pFail
			}
			if pFail < 1 {
				ns := s
				if !s.closed {
					ns.closed, ns.lead = true, s.run
				}
				ns.run = 0
				next[ns] += pr * (1 - pFail)
			}
		}
		cur = next
	}
	total := 0.0
	for s, pr := range cur {
		// Without a survivor every machine failed. Otherwise the run that
		// wraps from the end to the start must stay shorter than m.
		if s.closed && s.lead+s.run < m {
			total += pr
		}
	}
	return total
}
