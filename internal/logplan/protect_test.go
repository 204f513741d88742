package logplan

import (
	"math"
	"strings"
	"testing"
)

func TestProtect(t *testing.T) {
	plan := func(in Input) Plan {
		p, err := Choose(in, Optimal)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name   string
		dp, pp int
		plan   Plan
		want   []string // per stage, StageProtection.String()
	}{
		// Replicas win whatever the plan says.
		{"dp 2", 2, 3, plan(three(math.Inf(1))), []string{"replicas (DP)", "replicas (DP)", "replicas (DP)"}},
		{"dp 2 plan ignored", 2, 5, Plan{}, []string{"replicas (DP)", "replicas (DP)", "replicas (DP)", "replicas (DP)", "replicas (DP)"}},
		// Every boundary logged; each stage's replay (1, 2, 3 s a step,
		// 0.5 steps lost) beats the 2.5 s full restart.
		{"all logged", 1, 3, plan(three(math.Inf(1))), []string{
			"logs (group boundaries 0|1)", "logs (group boundaries 0|1, 1|2)", "logs (group boundaries 1|2)"}},
		// [0 1] [2]: group 0 replays 5 s a step, 2.5 s: no faster than the
		// full restart's 2.5 s, so checkpoints; stage 2 (1.5 s) logs.
		{"not worth it", 1, 3, plan(three(300)), []string{
			"peer copies/checkpoints", "peer copies/checkpoints", "logs (group boundaries 1|2)"}},
		{"cap 0", 1, 3, plan(three(0)), []string{
			"peer copies/checkpoints", "peer copies/checkpoints", "peer copies/checkpoints"}},
		{"single stage", 1, 1, plan(Input{StageSeconds: []float64{1}, Bandwidth: 1, Interval: 1, StepSeconds: 1}),
			[]string{"peer copies/checkpoints"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Protect(tc.dp, tc.pp, tc.plan)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("%d stages, want %d", len(got), len(tc.want))
			}
			for i, sp := range got {
				if sp.Stage != i || sp.String() != tc.want[i] || sp.Why == "" {
					t.Errorf("stage %d: %d %q (why %q), want %q", i, sp.Stage, sp.String(), sp.Why, tc.want[i])
				}
			}
		})
	}
}

func TestProtectRefuses(t *testing.T) {
	p, err := Choose(three(0), Optimal)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		dp, pp int
		want   string
	}{
		{"dp 0", 0, 3, "dp 0, pp 3: both degrees must be >= 1"},
		{"pp 0", 2, 0, "dp 2, pp 0"},
		{"pp mismatch", 1, 4, "the logging plan covers 3 stages, the job has pp=4"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Protect(tc.dp, tc.pp, p)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
