package logplan

import (
	"errors"
	"math"
	"math/rand"
	"reflect"
	"strings"
	"testing"
)

// three is the worked example of the hand-checked cases: 3 nodes of 1, 2
// and 3 s per step, 100 bytes each way at each boundary, B = 100 bytes/s
// (a boundary's transfers take (100+100)/100 = 2 s), T = 1 step, a full
// step 5 s. One logged direction costs 100*1*KeptIntervals = 200 bytes, so
// with every boundary logged node 0 holds 200, node 1 400 (boundary 0's
// gradients and boundary 1's activations), node 2 200.
func three(cap float64) Input {
	return Input{StageSeconds: []float64{1, 2, 3}, ForwardBytes: []float64{100, 100}, BackwardBytes: []float64{100, 100},
		Bandwidth: 100, Interval: 1, NodeCap: cap, StepSeconds: 5}
}

// four is the case where SWIFT's greedy misses the optimum: 4 nodes of 1,
// 1.5, 1.5, 1 s, 1 byte each way, B = 1, T = 1, cap 2. One logged
// direction costs 2 bytes; logging everything puts 4 on nodes 1 and 2.
//
// Greedy: ΔM is 4 for every merge. ΔR(0|1) = 2/4*(1+1.5+2) - 2.5/4 =
// 1.625, ΔR(1|2) = 2/4*(1.5+1.5+2) - 3/4 = 1.75, ΔR(2|3) = 1.625: it
// merges 0|1 (lowest boundary of the tie). Node 2 still holds 4; 1|2 now
// costs 3/4*8 - 2/4*4.5 - 1.5/4 = 3.375, 2|3 1.625: it merges 2|3. Groups
// [0 1] [2 3], R(𝒢) = 2/4*4.5 + 2/4*4.5 = 4.5, expected 4.5*T/2 = 2.25 s.
//
// Optimal: [0] [1 2] [3] fits (each node holds one 2-byte log) and costs
// 1/4*1 + 2/4*(1.5+1.5+2) + 1/4*1 = 3, expected 1.5 s. The greedy does not
// see that merging 1|2 relieves two nodes at once.
func four() Input {
	return Input{StageSeconds: []float64{1, 1.5, 1.5, 1}, ForwardBytes: []float64{1, 1, 1}, BackwardBytes: []float64{1, 1, 1},
		Bandwidth: 1, Interval: 1, NodeCap: 2, StepSeconds: 3}
}

func TestChoose(t *testing.T) {
	inf := math.Inf(1)
	tests := []struct {
		name      string
		in        Input
		algo      Algorithm
		groups    []Group
		nodeBytes []float64
		replay    []float64
		expected  float64
		full      float64
	}{
		// No cap: every boundary logged, R(𝒢) = (1+2+3)/3 = 2 s per lost
		// step, T/2 = 0.5 steps lost: 1 s; a full restart 5*0.5 = 2.5 s.
		{"unlimited", three(inf), Optimal, []Group{{0, 0}, {1, 1}, {2, 2}},
			[]float64{200, 400, 200}, []float64{1, 2, 3}, 1, 2.5},
		{"unlimited greedy", three(inf), Greedy, []Group{{0, 0}, {1, 1}, {2, 2}},
			[]float64{200, 400, 200}, []float64{1, 2, 3}, 1, 2.5},
		// Cap 300: node 1 cannot hold both logs. Logging only 0|1 gives
		// [0] [1 2]: 1/3*1 + 2/3*(2+3+2) = 5; only 1|2 gives [0 1] [2]:
		// 2/3*(1+2+2) + 1/3*3 = 13/3, the least. Expected 13/6 s.
		{"cap 300", three(300), Optimal, []Group{{0, 1}, {2, 2}},
			[]float64{0, 200, 200}, []float64{5, 3}, 13.0 / 6, 2.5},
		// The greedy agrees: ΔR(0|1) = 2/3*5 - 1/3 - 2/3 = 7/3 is below
		// ΔR(1|2) = 2/3*7 - 2/3 - 1 = 3, for the same ΔM.
		{"cap 300 greedy", three(300), Greedy, []Group{{0, 1}, {2, 2}},
			[]float64{0, 200, 200}, []float64{5, 3}, 13.0 / 6, 2.5},
		// Cap 0: one group, nothing logged; R = 1+2+3+2+2 = 10, 5 s.
		{"cap 0", three(0), Optimal, []Group{{0, 2}}, []float64{0, 0, 0}, []float64{10}, 5, 2.5},
		{"cap 0 greedy", three(0), Greedy, []Group{{0, 2}}, []float64{0, 0, 0}, []float64{10}, 5, 2.5},
		// One stage: no boundary; R = 1, T = 10: 5 steps lost, 5 s.
		{"single stage", Input{StageSeconds: []float64{1}, Bandwidth: 1, Interval: 10, NodeCap: 0, StepSeconds: 1},
			Optimal, []Group{{0, 0}}, []float64{0}, []float64{1}, 5, 5},
		{"greedy misses", four(), Greedy, []Group{{0, 1}, {2, 3}}, []float64{0, 2, 2, 0}, []float64{4.5, 4.5}, 2.25, 1.5},
		{"optimal finds", four(), Optimal, []Group{{0, 0}, {1, 2}, {3, 3}}, []float64{2, 2, 2, 2}, []float64{1, 5, 1}, 1.5, 1.5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Choose(tc.in, tc.algo)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(p.Groups, tc.groups) {
				t.Errorf("groups %v, want %v", p.Groups, tc.groups)
			}
			if !close(p.NodeLogBytes, tc.nodeBytes) || !close(p.ReplaySeconds, tc.replay) {
				t.Errorf("node bytes %v replay %v, want %v %v", p.NodeLogBytes, p.ReplaySeconds, tc.nodeBytes, tc.replay)
			}
			if !close([]float64{p.Expected, p.FullRestart}, []float64{tc.expected, tc.full}) {
				t.Errorf("expected %g full %g, want %g %g", p.Expected, p.FullRestart, tc.expected, tc.full)
			}
			for b, l := range p.Logged {
				if edge := groupEnds(p.Groups, b); l != edge {
					t.Errorf("boundary %d logged=%v, but it is a group edge: %v", b, l, edge)
				}
			}
		})
	}
}

func groupEnds(gs []Group, b int) bool {
	for _, g := range gs {
		if g.Last == b {
			return true
		}
	}
	return false
}

func close(got, want []float64) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if math.Abs(got[i]-want[i]) > 1e-9*math.Max(1, math.Abs(want[i])) {
			return false
		}
	}
	return true
}

func TestChooseRefuses(t *testing.T) {
	mod := func(f func(*Input)) Input { in := three(1000); f(&in); return in }
	tests := []struct {
		name  string
		in    Input
		algo  Algorithm
		want  string
		field string // the FieldError's field; "" for other errors
	}{
		{"no stages", mod(func(in *Input) { in.StageSeconds = nil }), Optimal, "no stages", FieldStageSeconds},
		{"too many stages", mod(func(in *Input) { in.StageSeconds = make([]float64, MaxStages+1) }), Optimal, "4097 stages, more than 4096", FieldStageSeconds},
		{"zero time", mod(func(in *Input) { in.StageSeconds[1] = 0 }), Optimal, "stage 1's compute time is 0", FieldStageSeconds},
		{"negative time", mod(func(in *Input) { in.StageSeconds[0] = -1 }), Optimal, "stage 0's compute time is -1", FieldStageSeconds},
		{"NaN time", mod(func(in *Input) { in.StageSeconds[2] = math.NaN() }), Optimal, "stage 2's compute time is NaN", FieldStageSeconds},
		{"too few forward", mod(func(in *Input) { in.ForwardBytes = in.ForwardBytes[:1] }), Optimal, "1 forward message sizes for 3 stages: give one per boundary, 2", FieldForwardBytes},
		{"too many backward", mod(func(in *Input) { in.BackwardBytes = append(in.BackwardBytes, 1) }), Optimal, "3 backward message sizes", FieldBackwardBytes},
		{"zero bytes", mod(func(in *Input) { in.BackwardBytes[1] = 0 }), Optimal, "backward bytes at boundary 1|2 are 0", FieldBackwardBytes},
		{"infinite bytes", mod(func(in *Input) { in.ForwardBytes[0] = math.Inf(1) }), Optimal, "forward bytes at boundary 0|1 are +Inf", FieldForwardBytes},
		{"no bandwidth", mod(func(in *Input) { in.Bandwidth = 0 }), Optimal, "bandwidth 0", FieldBandwidth},
		{"no interval", mod(func(in *Input) { in.Interval = 0 }), Optimal, "snapshot interval 0", FieldInterval},
		{"negative cap", mod(func(in *Input) { in.NodeCap = -1 }), Optimal, "node log cap -1", FieldNodeCap},
		{"NaN cap", mod(func(in *Input) { in.NodeCap = math.NaN() }), Optimal, "node log cap NaN", FieldNodeCap},
		{"no step time", mod(func(in *Input) { in.StepSeconds = 0 }), Optimal, "step time 0", FieldStepSeconds},
		{"overflowing step", mod(func(in *Input) { in.StepSeconds, in.Interval = math.MaxFloat64, 4 }), Optimal, "step time 1.7976931348623157e+308 over 4 steps overflows", FieldStepSeconds},
		{"overflowing stages", mod(func(in *Input) { in.StageSeconds[0], in.StageSeconds[1] = math.MaxFloat64, math.MaxFloat64 }), Optimal, "compute times overflow", FieldStageSeconds},
		{"overflowing transfer", mod(func(in *Input) { in.Bandwidth = 1e-320 }), Optimal, "transfer times (bytes / bandwidth) overflow", FieldBandwidth},
		{"overflowing log", mod(func(in *Input) { in.ForwardBytes[1], in.Bandwidth = 1e308, 1e300 }), Optimal, "the log of boundary 1|2 over 1 steps overflows", FieldForwardBytes},
		{"unknown algorithm", three(1000), "best", `algorithm "best": use "optimal"`, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Choose(tc.in, tc.algo)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
			var fe *FieldError
			if got := errors.As(err, &fe); got != (tc.field != "") || got && fe.Field != tc.field {
				t.Errorf("error %#v, want a FieldError for %q", err, tc.field)
			}
		})
	}
}

// TestOptimalIsExact compares Optimal with every grouping of small random
// pipelines (a fixed seed, so a failure reproduces): the DP's plan fits
// and costs the least of all that fit. The greedy's plan fits and costs
// no less.
func TestOptimalIsExact(t *testing.T) {
	rng := rand.New(rand.NewSource(20))
	for trial := 0; trial < 400; trial++ {
		n := 1 + rng.Intn(7)
		in := Input{StageSeconds: make([]float64, n), Bandwidth: 1 + 9*rng.Float64(), Interval: 1 + rng.Intn(5), StepSeconds: 1}
		for i := range in.StageSeconds {
			in.StageSeconds[i] = 0.1 + rng.Float64()
		}
		for i := 0; i < n-1; i++ {
			in.ForwardBytes = append(in.ForwardBytes, 1+rng.Float64()*10)
			in.BackwardBytes = append(in.BackwardBytes, 1+rng.Float64()*10)
		}
		in.NodeCap = rng.Float64() * 100
		brute := math.Inf(1)
		for mask := 0; mask < 1<<(n-1); mask++ {
			logged := make([]bool, n-1)
			for b := range logged {
				logged[b] = mask&(1<<b) != 0
			}
			if p := newModel(in).planFor(logged); fitsCap(p, in.NodeCap) && p.Expected < brute {
				brute = p.Expected
			}
		}
		opt, err := Choose(in, Optimal)
		if err != nil {
			t.Fatal(err)
		}
		gr, err := Choose(in, Greedy)
		if err != nil {
			t.Fatal(err)
		}
		if !fitsCap(opt, in.NodeCap) || !fitsCap(gr, in.NodeCap) {
			t.Fatalf("trial %d: a plan exceeds the cap %g: optimal %v greedy %v", trial, in.NodeCap, opt.NodeLogBytes, gr.NodeLogBytes)
		}
		if math.Abs(opt.Expected-brute) > 1e-9*brute {
			t.Fatalf("trial %d: optimal %g, exhaustive search %g (%+v)", trial, opt.Expected, brute, in)
		}
		if gr.Expected < brute*(1-1e-9) {
			t.Fatalf("trial %d: greedy %g beats the exhaustive minimum %g", trial, gr.Expected, brute)
		}
	}
}

func fitsCap(p Plan, cap float64) bool {
	for _, b := range p.NodeLogBytes {
		if b > cap {
			return false
		}
	}
	return true
}

// TestMaxStages plans the largest pipeline Validate accepts with both
// algorithms: the plans fit the cap, and the optimum is no worse.
func TestMaxStages(t *testing.T) {
	rng := rand.New(rand.NewSource(4096))
	in := Input{StageSeconds: make([]float64, MaxStages), Bandwidth: 1e10, Interval: 10, StepSeconds: 1}
	for i := range in.StageSeconds {
		in.StageSeconds[i] = 0.01 + 0.1*rng.Float64()
		if i > 0 {
			in.ForwardBytes = append(in.ForwardBytes, float64((1+rng.Intn(64))<<20))
			in.BackwardBytes = append(in.BackwardBytes, float64((1+rng.Intn(64))<<20))
		}
	}
	in.NodeCap = 1 << 30 // holds about one direction's log: many merges
	opt, err := Choose(in, Optimal)
	if err != nil {
		t.Fatal(err)
	}
	gr, err := Choose(in, Greedy)
	if err != nil {
		t.Fatal(err)
	}
	if !fitsCap(opt, in.NodeCap) || !fitsCap(gr, in.NodeCap) {
		t.Fatal("a plan exceeds the cap")
	}
	if len(gr.Groups) == MaxStages || len(gr.Groups) == 1 {
		t.Fatalf("the greedy made %d groups: the cap did not force merges", len(gr.Groups))
	}
	if opt.Expected > gr.Expected*(1+1e-9) {
		t.Errorf("optimal %g worse than greedy %g", opt.Expected, gr.Expected)
	}
}
