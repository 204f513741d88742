package persist

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/spank/spec"
)

// commit is one rank committing one step at a fake time (seconds since t0).
type commit struct {
	rank int
	step int64
	at   float64
}

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func at(sec float64) time.Time { return t0.Add(time.Duration(sec * float64(time.Second))) }

// steady is ranks committing steps from..to, one step every stepSec
// seconds, each rank a little after the previous one.
func steady(ranks []int, from, to, every int64, stepSec float64) []commit {
	var out []commit
	for s := from; s <= to; s += every {
		for i, r := range ranks {
			out = append(out, commit{r, s, float64(s)*stepSec + float64(i)*0.01})
		}
	}
	return out
}

func mustPolicy(t *testing.T, v string) spec.Persist {
	t.Helper()
	s, err := spec.Parse("arc,persist=" + v)
	if err != nil {
		t.Fatal(err)
	}
	return s.Persist
}

func TestIntervalPolicies(t *testing.T) {
	// f such that 1/c* = 64 s for N = 4 nodes and o = 2 s:
	// N f / (2 o) = 1/64^2  =>  f = 2 o 86400 / (N 64^2) per node-day.
	const fFor64s = 2 * 2 * 86400.0 / (4 * 64 * 64)
	type write struct {
		step       int64
		d          time.Duration
		ok, failed bool
		at         float64
	}
	tests := []struct {
		name    string
		persist string
		f       float64
		world   int
		commits []commit
		writes  []write // the outcome of persisting step, reported after its commits
		want    map[int][]int64
		period  int64
		logs    []string // each must appear exactly once
	}{
		{
			name: "steps", persist: "4", commits: steady([]int{0, 1}, 1, 10, 1, 1),
			want: map[int][]int64{0: {4, 8}, 1: {4, 8}}, period: 4,
			logs: []string{"every 4 steps (persist=4 in --reft)"},
		},
		{
			name: "steps, snapshots every 3 steps", persist: "4", commits: steady([]int{0}, 3, 18, 3, 1),
			want: map[int][]int64{0: {6, 9, 12, 18}}, period: 4,
		},
		{
			name: "steps, a restore goes back", persist: "4",
			commits: append(steady([]int{0}, 1, 6, 1, 1), steady([]int{0}, 3, 9, 1, 1)...),
			want:    map[int][]int64{0: {4, 4, 8}}, period: 4,
		},
		{
			name: "duration", persist: "10s", commits: steady([]int{0, 1}, 5, 40, 1, 1),
			// 10 s at 1 s per step: 10 steps, rounded to 8
			want: map[int][]int64{0: {5, 8, 16, 24, 32, 40}, 1: {5, 8, 16, 24, 32, 40}}, period: 8,
			logs: []string{"the first generation now", "persistent checkpoints every 8 steps: persist=10s at 1s per step"},
		},
		{
			name: "duration shorter than a step", persist: "1s", commits: steady([]int{0}, 1, 4, 1, 30),
			want: map[int][]int64{0: {1, 2, 3, 4}}, period: 1,
		},
		{
			name: "auto", persist: "auto", f: fFor64s, world: 8, commits: steady([]int{0, 1}, 1, 200, 1, 1),
			writes: []write{{step: 1, d: 2 * time.Second, ok: true, at: 1.5}},
			want:   map[int][]int64{0: {1, 64, 128, 192}, 1: {1, 64, 128, 192}}, period: 64,
			logs: []string{"persistent checkpoints at the JIT optimum (persist=auto)", "to measure o",
				"every 64 steps: JIT optimum 1/c* = 1m4s (c* = sqrt(N f / (2 o)), N = 4 nodes (world 8 / 2 ranks here)"},
		},
		{
			name: "auto, slower writes", persist: "auto", f: fFor64s, world: 8, commits: steady([]int{0, 1}, 1, 200, 1, 1),
			// o 4x as long: 1/c* twice as long
			writes: []write{{step: 1, d: 8 * time.Second, ok: true, at: 1.5}},
			want:   map[int][]int64{0: {1, 128}, 1: {1, 128}}, period: 128,
		},
		{
			name: "auto, first write fails", persist: "auto", f: fFor64s, world: 4, commits: steady([]int{0}, 1, 700, 1, 1),
			writes: []write{{step: 1, failed: true, at: 1.5}, {step: 302, d: 2 * time.Second, ok: true, at: 302.5}},
			// retried with the first commit 5 minutes after the failure
			want: map[int][]int64{0: {1, 302, 320, 384, 448, 512, 576, 640}}, period: 64,
		},
		{
			name: "auto, first step already persisted", persist: "auto", f: fFor64s, world: 4, commits: steady([]int{0}, 1, 200, 1, 1),
			writes: []write{{step: 1, at: 1.5}, {step: 2, d: 2 * time.Second, ok: true, at: 2.5}},
			// nothing measured: the next commit is the first write
			want: map[int][]int64{0: {1, 2, 64, 128, 192}}, period: 64,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			iv := NewInterval(mustPolicy(t, tc.persist), tc.f, zerolog.New(&logs))
			ranks := map[int]bool{}
			for _, c := range tc.commits {
				ranks[c.rank] = true
			}
			for r := range ranks {
				iv.Registered(r, tc.world)
			}
			got := map[int][]int64{}
			writes := slices.Clone(tc.writes)
			for _, c := range tc.commits {
				for len(writes) > 0 && writes[0].at <= c.at {
					w := writes[0]
					writes = writes[1:]
					iv.Wrote(w.step, w.d, w.ok, w.failed, at(w.at))
				}
				if iv.Commit(c.rank, c.step, at(c.at)) {
					got[c.rank] = append(got[c.rank], c.step)
				}
			}
			for r := range ranks {
				if !slices.Equal(got[r], tc.want[r]) {
					t.Errorf("rank %d: persisted steps %v, want %v", r, got[r], tc.want[r])
				}
			}
			if iv.Period() != tc.period {
				t.Errorf("period %d, want %d", iv.Period(), tc.period)
			}
			for _, l := range tc.logs {
				if n := strings.Count(logs.String(), l); n != 1 {
					t.Errorf("log has %q %d times, want once:\n%s", l, n, logs.String())
				}
			}
		})
	}
}

// The period follows the measured step time only when it moves more than
// a factor of two from the period, and says so once per change.
func TestIntervalHysteresis(t *testing.T) {
	var logs bytes.Buffer
	iv := NewInterval(mustPolicy(t, "64s"), 0, zerolog.New(&logs))
	sec := 0.0
	run := func(from, to int64, stepSec float64) {
		for s := from; s <= to; s++ {
			sec += stepSec
			iv.Commit(0, s, at(sec))
		}
	}
	run(1, 100, 1) // 64 steps
	if iv.Period() != 64 {
		t.Fatalf("period %d after 1 s steps, want 64", iv.Period())
	}
	run(101, 200, 1.5) // mean 1.25 s: ideal 51 steps, within a factor of two
	if iv.Period() != 64 {
		t.Fatalf("period %d after a small change, want 64 kept", iv.Period())
	}
	run(201, 3000, 5) // the mean drifts towards 5 s: ideal 13 steps
	if iv.Period() != 16 {
		t.Fatalf("period %d after steps got 5x slower, want 16", iv.Period())
	}
	var periods []int64
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var e struct {
			Steps int64 `json:"interval_steps"`
		}
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatal(err)
		}
		if e.Steps > 0 {
			periods = append(periods, e.Steps)
		}
	}
	if !slices.Equal(periods, []int64{64, 32, 16}) {
		t.Fatalf("interval lines %v, want one per change: 64, 32, 16\n%s", periods, logs.String())
	}
	if !strings.Contains(logs.String(), "persistent checkpoint interval changed from 32 to 16 steps") {
		t.Fatalf("no change line:\n%s", logs.String())
	}
}
