package plan

import (
	"fmt"
	"math"
	"math/big"
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

// MaxPlacementNodes bounds --nodes so exact counting stays within seconds.
const MaxPlacementNodes = MaxSimNodes

func (p Placement) validate() error {
	switch {
	case p.Nodes < 1:
		return fmt.Errorf("--nodes must be >= 1; got %d", p.Nodes)
	case p.Replicas < 1:
		return fmt.Errorf("--replicas must be >= 1 (1 means only the local copy); got %d", p.Replicas)
	case p.Replicas > p.Nodes:
		return fmt.Errorf("--replicas (%d) must not exceed --nodes (%d): each replica needs its own machine", p.Replicas, p.Nodes)
	case p.Nodes > MaxPlacementNodes:
		return fmt.Errorf("--nodes must be <= %d; the counts are exact and grow with N; got %d", MaxPlacementNodes, p.Nodes)
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
// memory: the k-subsets that leave every checkpoint a replica, counted
// exactly, over all C(N, k). A subset splits into j failures in the ring and
// k-j in the groups, and each part must keep a replica of everything.
func (p Placement) Recovery() float64 {
	m, k := p.Replicas, p.Failures
	if k < m {
		return 1 // fewer losses than replicas can never take every copy
	}
	groups, ring := p.Layout()
	good := new(big.Int)
	t := new(big.Int)
	for j := max(0, k-groups*m); j <= min(k, ring); j++ {
		t.Mul(ringGood(ring, m, j), groupsGood(groups, m, k-j))
		good.Add(good, t)
	}
	return ratio(good, new(big.Int).Binomial(int64(p.Nodes), int64(k)))
}

// Ring is the same probability for plain ring placement over all N machines,
// the baseline GEMINI compares against.
func (p Placement) Ring() float64 {
	if p.Failures < p.Replicas {
		return 1
	}
	return ratio(ringGood(p.Nodes, p.Replicas, p.Failures), new(big.Int).Binomial(int64(p.Nodes), int64(p.Failures)))
}

func ratio(a, b *big.Int) float64 {
	f, _ := new(big.Rat).SetFrac(a, b).Float64()
	return f
}

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

// groupsGood counts the ways i failures can fall on g groups of m machines
// without taking a whole group, by inclusion-exclusion over the t groups
// forced to fail: Σ_t (-1)^t C(g, t) C((g-t)m, i-tm). Exact integers keep
// the alternating sum free of cancellation error at any size. Each term
// follows from the last by small exact multiplications and divisions, each
// of which leaves an integer product of binomials.
func groupsGood(g, m, i int) *big.Int {
	sum := new(big.Int)
	if i > g*m {
		return sum
	}
	term := new(big.Int).Binomial(int64(g*m), int64(i)) // t = 0
	var x big.Int
	for t := 0; ; t++ {
		if t%2 == 0 {
			sum.Add(sum, term)
		} else {
			sum.Sub(sum, term)
		}
		if t == g || i-(t+1)*m < 0 {
			return sum
		}
		// C(g, t) -> C(g, t+1)
		term.Mul(term, x.SetInt64(int64(g-t)))
		term.Quo(term, x.SetInt64(int64(t+1)))
		// C(n, k) -> C(n-m, k-m), one step C(n-1, k-1) = C(n, k) k / n at a time
		n, k := (g-t)*m, i-t*m
		for s := 0; s < m; s++ {
			term.Mul(term, x.SetInt64(int64(k-s)))
			term.Quo(term, x.SetInt64(int64(n-s)))
		}
	}
}

// ringGood counts the j-subsets of L machines in a ring that leave no m
// cyclically consecutive machines all failed (machine i's replicas live on
// i..i+m-1). Read from a uniformly chosen survivor, the runs of failures
// between the r = L-j survivors form a composition of j into r parts, every
// composition equally likely (each of the C(L,j) rings times r survivors
// maps to one composition and one of L starting points). So the share of
// good rings is the share of compositions with all parts below m:
//
//	Σ_i (-1)^i C(r, i) C(j-im+r-1, r-1)  over  C(j+r-1, r-1),
//
// and the count is that share times C(L, j) = C(j+r-1, r-1) L / r.
func ringGood(L, m, j int) *big.Int {
	if j < m {
		return new(big.Int).Binomial(int64(L), int64(j))
	}
	r := L - j
	if r == 0 {
		return new(big.Int) // every machine failed
	}
	sum := new(big.Int)
	term := new(big.Int).Binomial(int64(j+r-1), int64(r-1)) // i = 0
	var x big.Int
	for i := 0; ; i++ {
		if i%2 == 0 {
			sum.Add(sum, term)
		} else {
			sum.Sub(sum, term)
		}
		if i == r || j-(i+1)*m < 0 {
			break
		}
		// C(r, i) -> C(r, i+1)
		term.Mul(term, x.SetInt64(int64(r-i)))
		term.Quo(term, x.SetInt64(int64(i+1)))
		// C(T, r-1) -> C(T-m, r-1), one step C(T-1, s) = C(T, s) (T-s) / T at a time
		top := j - i*m + r - 1
		for s := 0; s < m; s++ {
			term.Mul(term, x.SetInt64(int64(top-s-(r-1))))
			term.Quo(term, x.SetInt64(int64(top-s)))
		}
	}
	sum.Mul(sum, x.SetInt64(int64(L)))
	return sum.Quo(sum, x.SetInt64(int64(r)))
}
