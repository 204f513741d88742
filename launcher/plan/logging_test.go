package plan

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// threeFlags is logplan's worked example as flags: 3 nodes of 1, 2, 3 s,
// 100 bytes each way, 100 bytes/s, T = 1, a 5 s step, cap 300 bytes.
// Node 1 cannot hold both its logs; logging only 1|2 gives [0-1] [2] with
// R(𝒢) = 2/3*5 + 1/3*3 = 13/3 s a step, 13/6 s for the 0.5 steps lost,
// against 2.5 s for a full restart. Group [0-1] replays 5*0.5 = 2.5 s, no
// faster than the restart, so its stages keep peer copies/checkpoints.
var threeFlags = []string{"--stage-seconds", "1,2,3", "--fwd-bytes", "100,100", "--bandwidth", "100",
	"--interval", "1", "--node-cap", "300", "--step-seconds", "5"}

const threeJSON = `{"stage_seconds": [1, 2, 3], "forward_bytes": [100, 100], "bandwidth_bytes_per_second": 100,
 "snapshot_interval_steps": 1, "node_cap_bytes": 300, "step_seconds": 5}`

func TestLoggingJSON(t *testing.T) {
	code, out, errs := run(append([]string{"logging", "--json"}, threeFlags...)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var got loggingJSON
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	want := loggingJSON{Algorithm: "optimal", Stages: 3, DP: 1, IntervalSteps: 1, KeptIntervals: 2, NodeCapBytes: opt(300),
		Groups: []groupJSON{
			{First: 0, Last: 1, ReplayStepSecs: 5, ExpectedRecovery: 2.5, RatioToFull: 1},
			{First: 2, Last: 2, ReplayStepSecs: 3, ExpectedRecovery: 1.5, RatioToFull: 0.6}},
		LoggedBoundaries: []string{"1|2"}, LostSteps: 0.5, ExpectedRecovery: 13.0 / 6, FullRestart: 2.5, Ratio: 13.0 / 15,
		ReftTrainFlags: "--log-messages bubble --log-groups 0-1,2"}
	prot := got.StagesProtection
	got.StagesProtection = nil
	if math.Abs(got.ExpectedRecovery-want.ExpectedRecovery) < 1e-12 && math.Abs(got.Ratio-want.Ratio) < 1e-12 {
		got.ExpectedRecovery, got.Ratio = want.ExpectedRecovery, want.Ratio
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
	wantProt := []struct {
		bytes float64
		prot  string
	}{{0, "peer copies/checkpoints"}, {200, "peer copies/checkpoints"}, {200, "logs (group boundaries 1|2)"}}
	if len(prot) != len(wantProt) {
		t.Fatalf("protection %+v", prot)
	}
	for i, w := range wantProt {
		if prot[i].Stage != i || prot[i].LogBytes != w.bytes || prot[i].Protection != w.prot || prot[i].Why == "" {
			t.Errorf("stage %d: %+v, want %v bytes and %q", i, prot[i], w.bytes, w.prot)
		}
	}
}

// TestLoggingInputFile: the same measurements from a file give the same
// report as the flags.
func TestLoggingInputFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "m.json")
	if err := os.WriteFile(file, []byte(threeJSON), 0o600); err != nil {
		t.Fatal(err)
	}
	_, fromFlags, _ := run(append([]string{"logging", "--json"}, threeFlags...)...)
	code, fromFile, errs := run("logging", "--json", "--input", file)
	if code != 0 || fromFile != fromFlags {
		t.Errorf("exit %d (%s); from the file:\n%s\nfrom the flags:\n%s", code, errs, fromFile, fromFlags)
	}
}

func TestLoggingText(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"worked example", threeFlags, []string{
			"groups [0-1] [2]; logged boundaries: 1|2",
			"[0-1]  5 s              2.5 s              2.5 s         1.00",
			"2      200 B       logs (group boundaries 1|2)",
			"2.167 s, against 2.5 s for a full restart from the last snapshot (ratio 0.87)"}},
		{"no cap", []string{"--stage-seconds", "1,2,3", "--fwd-bytes", "100,100", "--bandwidth", "100",
			"--interval", "1", "--node-cap", "unlimited", "--step-seconds", "5"}, []string{
			"node log cap unlimited", "groups [0] [1] [2]; logged boundaries: 0|1, 1|2", "reft-train (one stage per node): --log-messages bubble --log-groups 0,1,2", "1      400 B       logs (group boundaries 0|1, 1|2)"}},
		{"cap 0", []string{"--stage-seconds", "1,2,3", "--fwd-bytes", "100,100", "--bandwidth", "100",
			"--interval", "1", "--node-cap", "0", "--step-seconds", "5"}, []string{
			"groups [0-2]; logged boundaries: none", "0      0 B         peer copies/checkpoints"}},
		{"replicas", append([]string{"--dp", "2"}, threeFlags...), []string{
			"0      0 B         replicas (DP)", "With dp=2 every stage has data-parallel replicas"}},
		{"greedy", append([]string{"--algorithm", "swift-greedy"}, threeFlags...), []string{
			"algorithm swift-greedy", "groups [0-1] [2]"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errs := run(append([]string{"logging"}, tc.args...)...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errs)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}

func TestLoggingRefuses(t *testing.T) {
	file := filepath.Join(t.TempDir(), "m.json")
	if err := os.WriteFile(file, []byte(strings.Replace(threeJSON, `"snapshot_interval_steps": 1`, `"snapshot_interval_steps": 0`, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	dp0 := filepath.Join(t.TempDir(), "dp0.json")
	if err := os.WriteFile(dp0, []byte(strings.Replace(threeJSON, `"step_seconds": 5`, `"step_seconds": 5, "dp": 0`, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	with := func(flag, value string) []string {
		out := []string{"logging"}
		for i := 0; i < len(threeFlags); i += 2 {
			if threeFlags[i] != flag {
				out = append(out, threeFlags[i], threeFlags[i+1])
			}
		}
		if value != "" {
			out = append(out, flag, value)
		}
		return out
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no stages", with("--stage-seconds", ""), "--stage-seconds is required"},
		{"bad seconds", with("--stage-seconds", "1,x,3"), `--stage-seconds item 1 ("x"): not a number of seconds`},
		{"zero seconds", with("--stage-seconds", "1,0,3"), "--stage-seconds: stage 1's compute time is 0"},
		{"bytes count", with("--fwd-bytes", "100"), "--fwd-bytes: 1 forward message sizes for 3 stages: give one per boundary, 2"},
		{"bad bytes", with("--fwd-bytes", "100,lots"), `--fwd-bytes item 1 ("lots")`},
		{"bwd count", with("--bwd-bytes", "1,2,3"), "--bwd-bytes: 3 backward message sizes"},
		{"no bandwidth", with("--bandwidth", ""), "--bandwidth is required"},
		{"bad bandwidth", with("--bandwidth", "fast"), `--bandwidth: bad size "fast"`},
		{"no interval", with("--interval", ""), "--interval: snapshot interval 0"},
		{"no cap", with("--node-cap", ""), "--node-cap is required"},
		{"bad cap", with("--node-cap", "-5"), "--node-cap: bad size"},
		{"no step", with("--step-seconds", ""), "--step-seconds: step time 0"},
		{"bad dp", append(with("--dp", "0"), "--dp", "0"), "--dp: dp 0, pp 3"},
		{"algorithm", append(with("", ""), "--algorithm", "best"), `--algorithm: algorithm "best"`},
		{"plot", append(with("", ""), "--plot", "x.png"), "--plot: the logging plan has no curves"},
		{"both", []string{"logging", "--input", file, "--interval", "3"}, "--input and --interval: give the measurements in the file or as flags, not both"},
		{"file field", []string{"logging", "--input", file}, "--input " + file + ": snapshot_interval_steps: snapshot interval 0"},
		{"file dp 0", []string{"logging", "--input", dp0}, "--input " + dp0 + ": dp: dp 0, pp 3"},
		{"no file", []string{"logging", "--input", file + ".absent"}, "--input: open"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errs := run(tc.args...)
			if code != 2 || !strings.Contains(errs, tc.want) {
				t.Errorf("exit %d, stderr %q; want 2 and %q", code, errs, tc.want)
			}
		})
	}
}

func TestDecodeLoggingInput(t *testing.T) {
	tests := []struct {
		name, data, want string // want: "" to accept
		nodeCap          float64
		dp               int
	}{
		{"example", threeJSON, "", 300, 1},
		{"unlimited, dp", strings.Replace(threeJSON, `"node_cap_bytes": 300`, `"node_cap_bytes": "unlimited", "dp": 4`, 1), "", math.Inf(1), 4},
		{"cap missing", strings.Replace(threeJSON, `"node_cap_bytes": 300,`, ``, 1), "node_cap_bytes is required", 0, 0},
		{"cap word", strings.Replace(threeJSON, `300`, `"lots"`, 1), `node_cap_bytes "lots": a number of bytes, or the string "unlimited"`, 0, 0},
		{"cap list", strings.Replace(threeJSON, `300`, `[1]`, 1), "node_cap_bytes [1]: a number", 0, 0},
		{"unknown key", strings.Replace(threeJSON, `"step_seconds"`, `"step_secs"`, 1), `unknown field "step_secs"`, 0, 0},
		{"two objects", threeJSON + "{}", "more than one JSON value", 0, 0},
		{"not an object", "[1]", "the file is one JSON object", 0, 0},
		{"empty", "", "EOF", 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in, dp, err := decodeLoggingInput([]byte(tc.data))
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("error %v, want %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if in.NodeCap != tc.nodeCap || dp != tc.dp || !reflect.DeepEqual(in.BackwardBytes, in.ForwardBytes) || in.Interval != 1 {
				t.Errorf("got %+v dp %d, want cap %v dp %d and backward = forward", in, dp, tc.nodeCap, tc.dp)
			}
		})
	}
}
