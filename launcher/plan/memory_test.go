package plan

import (
	"math"
	"strings"
	"testing"
)

func mustMode(t *testing.T, spec string) Mode {
	t.Helper()
	m, err := ParseMode(spec)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestMemoryREFTSizes checks each mode against REFT section 4.2's sizes for
// a slice of state S shared by an SG of m: own shard S/m; ARC doubles it
// (2 S/m); AEC adds S/(m(m-1)); AOR adds the optimizer part of a shard.
func TestMemoryREFTSizes(t *testing.T) {
	const params = 8e9
	base := Memory{Params: params, Optimizer: "adam", DP: 4, PP: 2, TP: 2, GPUsPerNode: 4,
		ParamBytes: 2, Generations: 1, NodeRAMGiB: 1024}
	slice := params / 4 // per (pp, tp)
	S := slice * 14     // bf16 weights + fp32 master, m, v
	m := 4.0
	tests := []struct {
		mode string
		red  float64
	}{
		{"off", 0},
		{"arc", S / m},
		{"arc:2", 2 * S / m},
		{"aec", S / (m * (m - 1))},
		{"aec:2", 2 * S / (m * (m - 2))},
		{"aor", slice * 12 / m},
		{"arc+aec", S/m + S/(m*(m-1))},
	}
	for _, tc := range tests {
		mm := base
		mm.Mode = mustMode(t, tc.mode)
		if err := mm.validate(); err != nil {
			t.Fatalf("%s: %v", tc.mode, err)
		}
		r := mm.Plan()
		if math.Abs(r.OwnPerRank-S/m) > 1 {
			t.Errorf("%s: own %g, want S/m = %g", tc.mode, r.OwnPerRank, S/m)
		}
		if math.Abs(r.RedunPerRank-tc.red) > 1 {
			t.Errorf("%s: redundancy %g, want %g", tc.mode, r.RedunPerRank, tc.red)
		}
		if want := 4 * (S/m + tc.red); math.Abs(r.Node-want) > 1 {
			t.Errorf("%s: node %g, want %g", tc.mode, r.Node, want)
		}
	}
}

func TestMemoryBound(t *testing.T) {
	tests := []struct {
		name      string
		mm        Memory
		wantRatio float64
		within    bool
	}{
		// Two generations of an ARC-protected shard, 4 S/m, against the
		// node's unsharded state S: 4/m <= 3 for any m >= 2.
		{"arc dp=2", Memory{DP: 2, Mode: Mode{Spec: "arc", Components: []Component{{"arc", 1}}}}, 2, true},
		{"arc dp=8", Memory{DP: 8, Mode: Mode{Spec: "arc", Components: []Component{{"arc", 1}}}}, 0.5, true},
		// ZeRO-1 shrinks the GPUs' optimizer state, not the snapshot:
		// 4*14/2 / (2 + 12/2) = 3.5x, above REFT's bound.
		{"arc dp=2 zero1", Memory{DP: 2, ZeRO1: true, Mode: Mode{Spec: "arc", Components: []Component{{"arc", 1}}}}, 3.5, false},
		{"aec dp=2 zero1", Memory{DP: 2, ZeRO1: true, Mode: Mode{Spec: "aec", Components: []Component{{"aec", 1}}}}, 3.5, false},
		{"aec dp=8 zero1", Memory{DP: 8, ZeRO1: true, Mode: Mode{Spec: "aec", Components: []Component{{"aec", 1}}}}, 2 * (14.0/8 + 14.0/56) / (2 + 12.0/8), true},
	}
	for _, tc := range tests {
		mm := tc.mm
		mm.Params, mm.Optimizer, mm.PP, mm.TP, mm.GPUsPerNode = 7e9, "adam", 1, 8, 8
		mm.ParamBytes, mm.Generations, mm.NodeRAMGiB = 2, 2, 1024
		if err := mm.validate(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		r := mm.Plan()
		if math.Abs(r.Ratio-tc.wantRatio) > 1e-9 || r.WithinBound != tc.within {
			t.Errorf("%s: ratio %.4f within=%v, want %.4f within=%v", tc.name, r.Ratio, r.WithinBound, tc.wantRatio, tc.within)
		}
		if want := r.Node / (1024 << 30); math.Abs(r.RAMShare-want) > 1e-12 {
			t.Errorf("%s: RAM share %g, want %g", tc.name, r.RAMShare, want)
		}
	}
}

func TestMemoryValidate(t *testing.T) {
	ok := Memory{Params: 7e9, Optimizer: "adam", DP: 4, PP: 1, TP: 2, GPUsPerNode: 8,
		Mode: Mode{Spec: "arc", Components: []Component{{"arc", 1}}}, ParamBytes: 2, Generations: 2, NodeRAMGiB: 1024}
	tests := []struct {
		edit func(*Memory)
		want string
	}{
		{func(m *Memory) { m.Optimizer = "lion" }, "--optimizer must be adam or sgd"},
		{func(m *Memory) { m.TP = 3 }, "not a multiple of --gpus-per-node"},
		{func(m *Memory) { m.DP, m.TP = 1, 8 }, "a group of n members survives at most n-1"},
		{func(m *Memory) { m.Generations = 0 }, "--generations must be >= 1"},
		{func(m *Memory) { m.Params = 0 }, "--params must be > 0"},
	}
	for _, tc := range tests {
		mm := ok
		tc.edit(&mm)
		if err := mm.validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error = %v, want one containing %q", err, tc.want)
		}
	}
}

func TestParseCount(t *testing.T) {
	tests := []struct {
		in   string
		want float64
		err  bool
	}{
		{"7e9", 7e9, false},
		{"7B", 7e9, false},
		{"175b", 175e9, false},
		{"1.3T", 1.3e12, false},
		{"350M", 350e6, false},
		{"7,000,000,000", 7e9, false},
		{"seven", 0, true},
		{"-1B", 0, true},
	}
	for _, tc := range tests {
		got, err := parseCount(tc.in)
		if (err != nil) != tc.err || (!tc.err && math.Abs(got-tc.want) > 1e-3*tc.want) {
			t.Errorf("parseCount(%q) = %g, %v; want %g, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}
