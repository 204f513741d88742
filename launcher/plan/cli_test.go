package plan

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
)

func run(args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = Main(args, &o, &e)
	return code, o.String(), e.String()
}

// TestJSONKeys runs each subcommand as a user would and reads the named
// keys back, with the papers' figures where the issue names them.
func TestJSONKeys(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want map[string]float64 // key -> expected value, NaN: present only
		tol  float64
	}{
		{"survival fig8", []string{"survival", "--json"},
			map[string]float64{"reft_days": 16.18, "checkpoint_days": 0.408}, 0.005},
		{"survival arc+aec", []string{"survival", "--json", "--mode", "arc+aec"},
			map[string]float64{"reft_days": math.NaN(), "checkpoint_days": 0.408, "tolerance": 2}, 0.005},
		{"placement K=2", []string{"placement", "--nodes", "16", "--replicas", "2", "--failures", "2", "--json"},
			map[string]float64{"recovery_probability": 0.9333, "ring_probability": 0.8667}, 0.0001},
		{"placement K=3", []string{"placement", "--nodes", "16", "--replicas", "2", "--failures", "3", "--json"},
			map[string]float64{"recovery_probability": 0.8, "ring_probability": math.NaN()}, 0.0001},
		{"interval 1024", []string{"interval", "--gpus", "1024", "--failures-per-gpu-day", "2e-3", "--checkpoint-seconds", "5", "--restart-seconds", "9.9", "--json"},
			map[string]float64{"per_hour": 5.54, "wasted_fraction": 0.0154}, 0.001},
		{"interval with step", []string{"interval", "--gpus", "1024", "--checkpoint-seconds", "5", "--restart-seconds", "9.9", "--step-seconds", "2", "--json"},
			map[string]float64{"per_hour": 5.54, "wasted_fraction": 0.0154, "reft_wasted_fraction": 0.000282}, 0.001},
		{"memory", []string{"memory", "--params", "7B", "--dp", "4", "--tp", "8", "--json"},
			map[string]float64{"ratio_to_state": 1, "node_bytes": math.NaN(), "ram_share": math.NaN()}, 1e-9},
		{"simulate", []string{"simulate", "--nodes", "600", "--sg-size", "6", "--hw-rate", "1e-3", "--trials", "500", "--json"},
			map[string]float64{"nodes": 600, "trials": 500, "seconds": math.NaN()}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errs := run(tc.args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errs)
			}
			var got map[string]any
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("not JSON: %v\n%s", err, out)
			}
			for k, want := range tc.want {
				v, ok := got[k].(float64)
				if !ok {
					t.Errorf("key %q missing or not a number: %v", k, got[k])
					continue
				}
				if !math.IsNaN(want) && math.Abs(v-want) > tc.tol*math.Max(1, math.Abs(want)) {
					t.Errorf("%s = %g, want %g", k, v, want)
				}
			}
		})
	}
}

func TestJSONOmitsReftWithoutStep(t *testing.T) {
	_, out, _ := run("interval", "--gpus", "4", "--checkpoint-seconds", "5", "--restart-seconds", "9.9", "--json")
	if strings.Contains(out, "reft_wasted_fraction") {
		t.Errorf("reft_wasted_fraction present without --step-seconds:\n%s", out)
	}
}

func TestSimulateJSONInside(t *testing.T) {
	_, out, errs := run("simulate", "--nodes", "600", "--hw-rate", "1e-3", "--trials", "2000", "--confidence", "0.999", "--json")
	var got struct {
		Reft struct {
			Analytic *float64 `json:"analytic"`
			Inside   *bool    `json:"analytic_inside_ci"`
		} `json:"reft"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v: %s %s", err, out, errs)
	}
	if got.Reft.Analytic == nil || got.Reft.Inside == nil || !*got.Reft.Inside {
		t.Errorf("analytic reft survival not reported inside the interval:\n%s", out)
	}
}

func TestTables(t *testing.T) {
	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"survival"}, []string{"with reft", "checkpoint only", "with reft 16.2 days, checkpoint only 0.408 days"}},
		{[]string{"placement", "--failures", "3"}, []string{"group placement, 8 groups of 2", "80.0 %", "62.9 %"}},
		{[]string{"placement", "--nodes", "17", "--replicas", "2", "--failures", "2"}, []string{"mixed placement, 7 groups of 2 and a ring of 3"}},
		{[]string{"interval", "--gpus", "8192", "--checkpoint-seconds", "5", "--restart-seconds", "9.9", "--step-seconds", "1"},
			[]string{"15.7 per hour", "4.54 %", "4.35 %", "reft loss per failure"}},
		{[]string{"memory", "--params", "7B", "--dp", "2", "--tp", "8", "--zero1"}, []string{"3.50x", "Above REFT's \"at most 3x\" bound"}},
		{[]string{"simulate", "--nodes", "120", "--trials", "200"}, []string{"120 nodes, 20 distinct sharding groups", "reft days above 0.9"}},
		{[]string{"simulate", "--nodes", "120", "--trials", "200", "--layout", "packed", "--sg-size", "3", "--gpus-per-node", "4"}, []string{"No closed form"}},
	}
	for _, tc := range tests {
		code, out, errs := run(tc.args...)
		if code != 0 {
			t.Errorf("%v: exit %d: %s", tc.args, code, errs)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("%v: output lacks %q:\n%s", tc.args, w, out)
			}
		}
	}
}

func TestBadFlags(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{}, "usage: reft plan"},
		{[]string{"nope"}, `unknown subcommand "nope"`},
		{[]string{"survival", "--sg-size", "1"}, "--sg-size must be >= 2 (an SG of one member has no peer to hold its redundancy); got 1"},
		{[]string{"survival", "--threshold", "1.5"}, "--threshold must lie strictly between 0 and 1"},
		{[]string{"survival", "--mode", "arc+aec:2", "--sg-size", "3", "--devices", "3"}, "tolerates 3 losses per sharding group but --sg-size is 3"},
		{[]string{"survival", "--mode", "raid5"}, `unknown scheme "raid5"`},
		{[]string{"survival", "--devices", "ten"}, `invalid value "ten" for flag -devices`},
		{[]string{"survival", "extra"}, `unexpected argument "extra"`},
		{[]string{"survival", "--plot", "out.pdf"}, "must end in .png or .svg"},
		{[]string{"placement", "--replicas", "0"}, "--replicas must be >= 1"},
		{[]string{"interval", "--gpus", "4", "--checkpoint-seconds", "5"}, "--restart-seconds is required"},
		{[]string{"interval", "--checkpoint-seconds", "5", "--restart-seconds", "1"}, "--gpus must be >= 1"},
		{[]string{"memory", "--dp", "4"}, "--params is required"},
		{[]string{"memory", "--params", "7B"}, "--dp is required"},
		{[]string{"memory", "--params", "7B", "--dp", "4", "--tp", "2", "--optimizer", "lion"}, "--optimizer must be adam or sgd"},
		{[]string{"simulate", "--nodes", "20000"}, "--nodes must lie in [1, 16384]"},
		{[]string{"simulate", "--confidence", "1"}, "--confidence must lie strictly between 0 and 1"},
	}
	for _, tc := range tests {
		code, _, errs := run(tc.args...)
		if code != 2 || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 and %q", tc.args, code, errs, tc.want)
		}
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"--help"}, {"survival", "-h"}, {"simulate", "--help"}} {
		code, out, errs := run(args...)
		if code != 0 || !strings.Contains(out+errs, "-") {
			t.Errorf("%v: exit %d", args, code)
		}
	}
	_, _, errs := run("survival", "-h")
	if !strings.Contains(errs, "-sg-size") {
		t.Errorf("survival -h does not list --sg-size:\n%s", errs)
	}
}

// TestJSONNoFailures: with every rate zero no loss is ever drawn; the days
// are infinite, which JSON cannot carry, so they come back as null.
func TestJSONNoFailures(t *testing.T) {
	for _, args := range [][]string{
		{"survival", "--hw-rate", "0", "--sw-rate", "0", "--json"},
		{"simulate", "--nodes", "60", "--hw-rate", "0", "--sw-rate", "0", "--trials", "50", "--json"},
	} {
		code, out, errs := run(args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errs)
		}
		var got map[string]any
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("%v: not JSON: %v", args, err)
		}
		rd := got["reft_days"]
		if m, ok := rd.(map[string]any); ok {
			rd = m["simulated"]
		}
		if rd != nil {
			t.Errorf("%v: reft_days = %v, want null", args, rd)
		}
	}
}
