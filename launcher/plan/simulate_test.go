package plan

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

// simConf is the confidence of each interval below. About 30 intervals are
// checked, so 0.999 each keeps the chance that any one misses by bad luck
// near 3 % (Bonferroni); the seeds are fixed, so a run is reproducible.
const simConf = 0.999

var seedOffset uint64

func TestSimulateMatchesAnalytic(t *testing.T) {
	tests := []struct {
		name string
		sim  Simulation
	}{
		{"fig8 shape, arc, 600 nodes", Simulation{Nodes: 600, SGSize: 6, Layout: "spread", Shape: 1.3, HWRate: 1e-3, SWRate: 1e-4, Tolerance: 1}},
		{"aec:2, constant rate", Simulation{Nodes: 512, SGSize: 8, Layout: "spread", Shape: 1.0, HWRate: 2e-3, SWRate: 2e-4, Tolerance: 2}},
		{"arc+aec, wear-out", Simulation{Nodes: 1024, SGSize: 4, Layout: "spread", Shape: 2.0, HWRate: 1e-4, SWRate: 1e-5, Tolerance: 2}},
		{"arc with agent failures", Simulation{Nodes: 300, SGSize: 3, Layout: "spread", Shape: 1.5, HWRate: 1e-3, SWRate: 1e-4, AgentRate: 1e-4, Tolerance: 1}},
		{"off", Simulation{Nodes: 200, SGSize: 4, Layout: "spread", Shape: 1.3, HWRate: 1e-3, SWRate: 1e-3, Tolerance: 0}},
		{"packed, SG inside a node", Simulation{Nodes: 256, SGSize: 4, GPUsPerNode: 8, Layout: "packed", Shape: 1.3, HWRate: 1e-3, SWRate: 1e-4, Tolerance: 1}},
		{"packed, SG over 3 nodes", Simulation{Nodes: 240, SGSize: 6, GPUsPerNode: 2, Layout: "packed", Shape: 1.3, HWRate: 1e-3, SWRate: 1e-4, Tolerance: 3}},
		{"16384 nodes", Simulation{Nodes: 16384, SGSize: 8, Layout: "spread", Shape: 1.3, HWRate: 1e-4, SWRate: 1e-5, Tolerance: 1, Trials: 600}},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.sim
			if s.GPUsPerNode == 0 {
				s.GPUsPerNode = 8
			}
			if s.Trials == 0 {
				s.Trials = 3000
			}
			s.Seed = uint64(100+i) + seedOffset
			if err := s.validate(); err != nil {
				t.Fatal(err)
			}
			an, ok := s.Analytic()
			if !ok {
				t.Fatal("no analytic model for this layout")
			}
			res := s.Run()
			// Compare at two horizons: where reft is at 0.9 and where it is
			// near 0.5, which is where a wrong model shows most.
			for _, p := range []float64{0.9, 0.5} {
				day := an.ReftDays(p)
				check(t, fmt.Sprintf("reft at %.3g days", day), an.Reft(day), At(res.Reft, day, simConf))
			}
			day := an.CheckpointDays(0.5)
			check(t, fmt.Sprintf("checkpoint at %.3g days", day), an.Checkpoint(day), At(res.Checkpoint, day, simConf))
			check(t, "reft days above 0.9", an.ReftDays(0.9), DaysAbove(res.Reft, 0.9, simConf))
		})
	}
}

func check(t *testing.T, what string, analytic float64, e Estimate) {
	t.Helper()
	if !(analytic >= e.Low && analytic <= e.High) {
		t.Errorf("%s: analytic %.5g outside simulated [%.5g, %.5g] (estimate %.5g)", what, analytic, e.Low, e.High, e.P)
	}
}

// TestSimulateDiscriminates shows the intervals are tight enough to reject
// a model that is off by one tolerated loss, so the test above has teeth.
func TestSimulateDiscriminates(t *testing.T) {
	s := Simulation{Nodes: 600, SGSize: 6, GPUsPerNode: 8, Layout: "spread", Shape: 1.3, HWRate: 1e-3, SWRate: 1e-4, Tolerance: 2, Trials: 3000, Seed: 7}
	res := s.Run()
	right, _ := s.Analytic()
	wrong := right
	wrong.Tolerance = 1
	day := right.ReftDays(0.5)
	e := At(res.Reft, day, simConf)
	if a := right.Reft(day); a < e.Low || a > e.High {
		t.Fatalf("the right model %.4f is outside [%.4f, %.4f]", a, e.Low, e.High)
	}
	if a := wrong.Reft(day); a >= e.Low && a <= e.High {
		t.Errorf("tolerance 1 instead of 2 gives %.4f, inside [%.4f, %.4f]; the check cannot tell them apart", a, e.Low, e.High)
	}
}

func TestSimulateDeterministic(t *testing.T) {
	s := Simulation{Nodes: 120, SGSize: 6, GPUsPerNode: 8, Layout: "spread", Shape: 1.3, HWRate: 1e-3, SWRate: 1e-4, Tolerance: 1, Trials: 500, Seed: 42}
	s.Workers = 1
	a := s.Run()
	s.Workers = 5
	b := s.Run()
	if !slices.Equal(a.Reft, b.Reft) || !slices.Equal(a.Checkpoint, b.Checkpoint) {
		t.Error("the same seed gave different trials with 1 and 5 workers")
	}
	s.Seed = 43
	if c := s.Run(); slices.Equal(a.Reft, c.Reft) {
		t.Error("seeds 42 and 43 gave identical trials")
	}
}

func TestSimulateGroups(t *testing.T) {
	tests := []struct {
		name   string
		sim    Simulation
		groups int
		first  []int32
	}{
		{"spread", Simulation{Nodes: 12, SGSize: 4, GPUsPerNode: 8, Layout: "spread"}, 3, []int32{0, 1, 2, 3}},
		{"packed within a node", Simulation{Nodes: 4, SGSize: 4, GPUsPerNode: 8, Layout: "packed"}, 4, []int32{0, 0, 0, 0}},
		{"packed across nodes", Simulation{Nodes: 6, SGSize: 3, GPUsPerNode: 2, Layout: "packed"}, 4, []int32{0, 0, 1}},
	}
	for _, tc := range tests {
		gs := tc.sim.groups()
		if len(gs) != tc.groups || !slices.Equal(gs[0], tc.first) {
			t.Errorf("%s: %d groups, first %v; want %d, first %v", tc.name, len(gs), gs[0], tc.groups, tc.first)
		}
	}
}

func TestClopperPearson(t *testing.T) {
	tests := []struct {
		k, n      int
		low, high float64
	}{
		// Reference values from the exact beta quantiles (R: binom.test).
		{0, 10, 0, 0.3084971},
		{5, 10, 0.1870860, 0.8129140},
		{10, 10, 0.6915029, 1},
	}
	for _, tc := range tests {
		e := clopperPearson(tc.k, tc.n, 0.95)
		if math.Abs(e.Low-tc.low) > 1e-6 || math.Abs(e.High-tc.high) > 1e-6 {
			t.Errorf("k=%d n=%d: [%.7f, %.7f], want [%.7f, %.7f]", tc.k, tc.n, e.Low, e.High, tc.low, tc.high)
		}
	}
}

func TestSimulateValidate(t *testing.T) {
	ok := Simulation{Nodes: 12, SGSize: 4, GPUsPerNode: 8, Layout: "spread", Shape: 1.3, HWRate: 1e-4, Tolerance: 1, Trials: 100}
	tests := []struct {
		edit func(*Simulation)
		want string
	}{
		{func(s *Simulation) { s.Nodes = 20000 }, "--nodes must lie in [1, 16384]"},
		{func(s *Simulation) { s.SGSize = 1 }, "--sg-size must be >= 2"},
		{func(s *Simulation) { s.Nodes = 13 }, "multiple of --sg-size"},
		{func(s *Simulation) { s.Layout = "random" }, "--layout must be spread or packed"},
		{func(s *Simulation) { s.Trials = 5 }, "--trials must be >= 10"},
	}
	for _, tc := range tests {
		s := ok
		tc.edit(&s)
		if err := s.validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error = %v, want one containing %q", err, tc.want)
		}
	}
}

// BenchmarkSimulate16384 times the CLI's default run at the largest size:
// 16384 nodes in SGs of 8, 10000 trials.
func BenchmarkSimulate16384(b *testing.B) {
	s := Simulation{Nodes: 16384, SGSize: 8, GPUsPerNode: 8, Layout: "spread", Shape: 1.3, HWRate: 1e-4, SWRate: 1e-5, Tolerance: 1, Trials: 10000, Seed: 1}
	for b.Loop() {
		s.Run()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(s.Trials), "ns/trial")
}
