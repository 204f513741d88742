package plan

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"gonum.org/v1/gonum/stat/distuv"
)

// Simulation is a Monte Carlo check of the survival model: every node draws
// its own Weibull times to hardware, software and agent failure, sharding
// groups are laid out over nodes as a real job would place them, and each
// trial records when in-memory state is first lost (reft) and when the job
// first fails at all (checkpointing alone). Failed nodes are not replaced,
// as in REFT section 5.
type Simulation struct {
	Nodes       int
	SGSize      int
	GPUsPerNode int
	Layout      string // spread: SG members on distinct nodes; packed: on consecutive GPUs
	Shape       float64
	HWRate      float64 // per node per day^c
	SWRate      float64
	AgentRate   float64
	Tolerance   int
	Trials      int
	Seed        uint64
	Workers     int // 0: one per CPU
}

// MaxSimNodes bounds --nodes so a run stays within seconds and memory.
const MaxSimNodes = 16384

// chunk is the number of trials that share one random stream; fixed so the
// result depends on the seed alone, not on the number of workers.
const chunk = 32

func (s Simulation) validate() error {
	switch {
	case s.Nodes < 1 || s.Nodes > MaxSimNodes:
		return fmt.Errorf("--nodes must lie in [1, %d]; got %d", MaxSimNodes, s.Nodes)
	case s.SGSize < 2:
		return fmt.Errorf("--sg-size must be >= 2 (an SG of one member has no peer to hold its redundancy); got %d", s.SGSize)
	case s.GPUsPerNode < 1:
		return fmt.Errorf("--gpus-per-node must be >= 1; got %d", s.GPUsPerNode)
	case s.Tolerance < 0 || s.Tolerance >= s.SGSize:
		return fmt.Errorf("tolerance %d must lie in [0, --sg-size-1 = %d]", s.Tolerance, s.SGSize-1)
	case !(s.Shape > 0) || math.IsInf(s.Shape, 0):
		return fmt.Errorf("--shape must be > 0; got %g", s.Shape)
	case !(s.HWRate >= 0) || !(s.SWRate >= 0) || !(s.AgentRate >= 0):
		return fmt.Errorf("--hw-rate, --sw-rate and --agent-rate must be >= 0; got %g, %g, %g", s.HWRate, s.SWRate, s.AgentRate)
	case s.Trials < 10:
		return fmt.Errorf("--trials must be >= 10 for a meaningful interval; got %d", s.Trials)
	}
	switch s.Layout {
	case "spread":
		if s.Nodes%s.SGSize != 0 {
			return fmt.Errorf("--nodes (%d) must be a multiple of --sg-size (%d) for --layout spread, where each SG spans sg-size distinct nodes", s.Nodes, s.SGSize)
		}
	case "packed":
		if (s.Nodes*s.GPUsPerNode)%s.SGSize != 0 {
			return fmt.Errorf("nodes*gpus-per-node (%d) must be a multiple of --sg-size (%d) for --layout packed", s.Nodes*s.GPUsPerNode, s.SGSize)
		}
	default:
		return fmt.Errorf("--layout must be spread or packed; got %q", s.Layout)
	}
	return nil
}

// groups lists each distinct sharding group as the nodes its members sit
// on, a node repeated once per member it hosts. SGs with the same members
// share their fate, so one entry stands for all of them.
func (s Simulation) groups() [][]int32 {
	var out [][]int32
	if s.Layout == "spread" {
		// Megatron order puts the G tensor-parallel ranks of one node side
		// by side, so the G SGs of a pipeline stage span the same sg-size
		// nodes: one distinct group per sg-size nodes.
		for g := 0; g < s.Nodes/s.SGSize; g++ {
			m := make([]int32, s.SGSize)
			for i := range m {
				m[i] = int32(g*s.SGSize + i)
			}
			out = append(out, m)
		}
		return out
	}
	seen := map[string]bool{}
	devices := s.Nodes * s.GPUsPerNode
	for first := 0; first < devices; first += s.SGSize {
		m := make([]int32, s.SGSize)
		var key strings.Builder
		for i := range m {
			m[i] = int32((first + i) / s.GPUsPerNode)
			key.WriteString(strconv.Itoa(int(m[i])))
			key.WriteByte(',')
		}
		if !seen[key.String()] {
			seen[key.String()] = true
			out = append(out, m)
		}
	}
	return out
}

// Estimate is a simulated probability with its confidence interval.
type Estimate struct {
	P, Low, High float64
}

// clopperPearson is the exact binomial interval for k successes in n
// trials at confidence conf. Its coverage never falls below conf, even for
// the tiny probabilities of a far tail, where Wilson's and the normal
// approximation's do.
func clopperPearson(k, n int, conf float64) Estimate {
	a := (1 - conf) / 2
	e := Estimate{P: float64(k) / float64(n), Low: 0, High: 1}
	if k > 0 {
		e.Low = distuv.Beta{Alpha: float64(k), Beta: float64(n - k + 1)}.Quantile(a)
	}
	if k < n {
		e.High = distuv.Beta{Alpha: float64(k + 1), Beta: float64(n - k)}.Quantile(1 - a)
	}
	return e
}

// SimResult holds, per trial, the day of first loss, sorted.
type SimResult struct {
	Reft       []float64 // day in-memory state is first lost with reft
	Checkpoint []float64 // day of the first failure of any kind
	Groups     int       // distinct sharding groups simulated
}

// Run draws the trials. Each node's Weibull time is drawn through its
// cumulative hazard: a node fails when λ t^c passes an Exp(1) draw E, so
// t^c = E/λ. Order and minima survive the monotone map t = (t^c)^(1/c), so
// all comparisons happen on t^c and only the result is converted.
func (s Simulation) Run() SimResult {
	gs := s.groups()
	res := SimResult{
		Reft:       make([]float64, s.Trials),
		Checkpoint: make([]float64, s.Trials),
		Groups:     len(gs),
	}
	workers := s.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	chunks := (s.Trials + chunk - 1) / chunk
	next := make(chan int, chunks)
	for c := 0; c < chunks; c++ {
		next <- c
	}
	close(next)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := make([]float64, s.Nodes)
			kth := make([]float64, s.Tolerance+1)
			for c := range next {
				rng := rand.New(rand.NewChaCha8(streamSeed(s.Seed, uint64(c))))
				for t := c * chunk; t < min((c+1)*chunk, s.Trials); t++ {
					r, ck := s.trial(rng, gs, x, kth)
					res.Reft[t], res.Checkpoint[t] = r, ck
				}
			}
		}()
	}
	wg.Wait()
	slices.Sort(res.Reft)
	slices.Sort(res.Checkpoint)
	return res
}

// streamSeed keys chunk c's generator by (seed, c). ChaCha8 streams under
// distinct keys are independent, which neighbouring PCG states are not
// guaranteed to be.
func streamSeed(seed, c uint64) [32]byte {
	var k [32]byte
	binary.LittleEndian.PutUint64(k[0:], seed)
	binary.LittleEndian.PutUint64(k[8:], c)
	copy(k[16:], "reft plan simula")
	return k
}

// inv returns 1/λ, or +Inf for a rate of zero (that failure never happens).
func inv(rate float64) float64 {
	if rate == 0 {
		return math.Inf(1)
	}
	return 1 / rate
}

func (s Simulation) trial(rng *rand.Rand, gs [][]int32, x, kth []float64) (reft, ck float64) {
	ih, is, ia := inv(s.HWRate), inv(s.SWRate), inv(s.AgentRate)
	ck, agent := math.Inf(1), math.Inf(1)
	for i := range x {
		x[i] = rng.ExpFloat64() * ih
		ck = min(ck, x[i], rng.ExpFloat64()*is)
		if s.AgentRate > 0 {
			agent = min(agent, rng.ExpFloat64()*ia)
		}
	}
	reft = agent
	k := len(kth)
	for _, g := range gs {
		// The SG is lost at its (tolerance+1)-th member loss: keep the k
		// smallest member times in kth, sorted, by insertion.
		n := 0
		for _, node := range g {
			v := x[node]
			if n == k && v >= kth[k-1] {
				continue
			}
			j := min(n, k-1)
			for j > 0 && kth[j-1] > v {
				kth[j] = kth[j-1]
				j--
			}
			kth[j] = v
			if n < k {
				n++
			}
		}
		reft = min(reft, kth[k-1])
	}
	inv := 1 / s.Shape
	return math.Pow(reft, inv), math.Pow(ck, inv)
}

// survivedPast counts the sorted loss days that lie beyond t.
func survivedPast(sorted []float64, t float64) int {
	i, _ := slices.BinarySearchFunc(sorted, t, func(a, b float64) int {
		if a <= b {
			return -1
		}
		return 1
	})
	return len(sorted) - i
}

// At estimates the probability of surviving past day t.
func At(sorted []float64, t, conf float64) Estimate {
	return clopperPearson(survivedPast(sorted, t), len(sorted), conf)
}

// DaysAbove is the simulated time the survival stays at or above p. Its
// interval is the distribution-free one for a quantile: the number of
// trials lost before the true time is Binomial(n, 1-p), so order statistics
// l and u with P(l <= B < u) >= conf bracket it.
func DaysAbove(sorted []float64, p, conf float64) Estimate {
	n := len(sorted)
	q := 1 - p
	b := distuv.Binomial{N: float64(n), P: q}
	a := (1 - conf) / 2
	// smallest j in [0, n] with CDF(j) >= target
	search := func(target float64) int {
		return sort.Search(n+1, func(j int) bool { return b.CDF(float64(j)) >= target })
	}
	l := search(a)       // P(B <= l-1) < a, so B >= l with probability > 1-a
	u := search(1-a) + 1 // P(B <= u-1) >= 1-a
	e := Estimate{P: sorted[min(n-1, int(math.Floor(q*float64(n))))], Low: 0, High: math.Inf(1)}
	if l >= 1 {
		e.Low = sorted[l-1]
	}
	if u <= n {
		e.High = sorted[u-1]
	}
	return e
}

// Analytic gives the closed-form model for the simulated layout, or ok =
// false where the layout has no closed form here. Spread is Eq. 5 with
// nodes as units. Packed with SGs spanning whole nodes is Eq. 5 over nodes
// with the tolerance counted in whole nodes.
func (s Simulation) Analytic() (Survival, bool) {
	base := Survival{
		Units: s.Nodes, SGSize: s.SGSize, Shape: s.Shape, HWRate: s.HWRate,
		SWRate: s.SWRate, AgentRate: s.AgentRate, Tolerance: s.Tolerance,
	}
	if s.Layout == "spread" {
		return base, true
	}
	g := s.GPUsPerNode
	switch {
	case g%s.SGSize == 0:
		// Every SG sits on one node: one node loss takes all its members.
		base.SGSize, base.Tolerance = 1, 0
		return base, true
	case s.SGSize%g == 0:
		base.SGSize, base.Tolerance = s.SGSize/g, s.Tolerance/g
		return base, true
	}
	return Survival{}, false
}
