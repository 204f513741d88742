//go:build e2e

package e2e

// End-to-end tests of reft.torch (issue 5): examples/torch_ddp.py, PyTorch
// DDP over gloo on four nodes, loses a rank; a second step of the same
// allocation restores every rank from its node's store through the Python
// client and ends with the bits of an uninterrupted run without reft.

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// torchFlags keep the run small: 3 layers of width 64, every step saved
// and logged so the relaunch can be compared step by step.
var torchFlags = []string{"--size", "64", "--save-every", "1", "--log-every", "1", "--seed", "3"}

// torchTask is the command every task runs: the Debian interpreter (it has
// python3-torch) with the checkout's client on its path. The nodes see the
// checkout; the test user cannot write it, so no bytecode is written.
func torchTask(flags ...string) []string {
	return append([]string{"env", "PYTHONPATH=" + filepath.Join(repo, "client", "python"), "PYTHONDONTWRITEBYTECODE=1",
		"/usr/bin/python3", filepath.Join(repo, "examples", "torch_ddp.py")}, flags...)
}

// torchRun checks a finished run's output and returns its hash.
func torchRun(t *testing.T, what string, r result) string {
	t.Helper()
	m := hashRe.FindAllStringSubmatch(r.Stdout, -1)
	if len(m) != 1 {
		t.Fatalf("%s: %d final-params-sha256 lines, want 1:\n%s", what, len(m), r)
	}
	return m[0][1]
}

// agentCommitRe matches an agent's debug line for a committed generation.
var agentCommitRe = regexp.MustCompile(`"event":"committed","rank":(\d+),"step":(\d+),`)

// newestCommitted reads the agents' logs of job (enableReft's log dir) and
// returns the newest step each rank committed.
func newestCommitted(t *testing.T, job string) map[int]int64 {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(clusterDir, "log", "reft", job, "*.jsonl"))
	newest := map[int]int64{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range agentCommitRe.FindAllStringSubmatch(string(b), -1) {
			r, _ := strconv.Atoi(m[1])
			s, _ := strconv.ParseInt(m[2], 10, 64)
			if cur, ok := newest[r]; !ok || s > cur {
				newest[r] = s
			}
		}
	}
	return newest
}

// torchCrashResume: the reference run (its own job, no reft), then an
// allocation with --reft=arc where the first step loses rank failRank at
// failStep and a relaunch with the same flags restores and finishes.
func torchCrashResume(t *testing.T, steps, failStep int64, failRank int, flags ...string) {
	enableReft(t)
	flags = append(append(append([]string{}, torchFlags...), "--steps", strconv.FormatInt(steps, 10)), flags...)
	layout := []string{"-N4", "-n4"}

	ref := mustRun(t, 3*time.Minute, alice, append(append([]string{"srun", "-K1"}, layout...), torchTask(flags...)...)...)
	refHash := torchRun(t, "uninterrupted run", ref)
	if n := strings.Count(ref.Stdout, "snapshots off: REFT_AGENT_SOCKET is not set"); n != 1 {
		t.Errorf("the run without --reft says %d times that snapshots are off, want once:\n%s", n, ref)
	}
	refLoss := lossLines(ref.Stdout)
	if int64(len(refLoss)) != steps {
		t.Fatalf("the uninterrupted run logged %d losses, want %d:\n%s", len(refLoss), steps, ref)
	}
	t.Logf("uninterrupted, without reft: final-params-sha256 %s", refHash)

	job := allocate(t, append([]string{"--reft=arc"}, layout...)...)
	fail := []string{"--fail-at", strconv.FormatInt(failStep, 10) + ":" + strconv.Itoa(failRank)}
	step := append(append([]string{"srun", "--jobid=" + job, "--reft=arc", "-K1"}, layout...),
		torchTask(append(append([]string{}, flags...), fail...)...)...)

	// 1. The rank kills itself; -K1 ends the step.
	crashed := run(t, 3*time.Minute, alice, step...)
	if crashed.Code == 0 {
		t.Fatalf("the step with %s succeeded:\n%s", strings.Join(fail, " "), crashed)
	}
	want := "torch_ddp: rank " + strconv.Itoa(failRank) + ": --fail-at " + fail[1] + ": SIGKILL"
	if !strings.Contains(crashed.Stderr, want) {
		t.Fatalf("no %q from rank %d:\n%s", want, failRank, crashed)
	}
	if hashRe.MatchString(crashed.Stdout) || resumedRe.MatchString(crashed.Stdout) {
		t.Fatalf("the crashed step resumed or finished:\n%s", crashed)
	}
	if strings.Contains(crashed.Stdout, "snapshots off") {
		t.Fatalf("the --reft=arc step ran without snapshots:\n%s", crashed)
	}
	for n, l := range lossLines(crashed.Stdout) {
		if l != refLoss[n] {
			t.Errorf("crashed step, step %d: %q, uninterrupted %q", n, l, refLoss[n])
		}
	}
	// No survivor may finish a step without the dead rank's gradients: a
	// snapshot of such a step would hold a partial sum, and would put that
	// rank out of reach of the others' generations.
	newest := newestCommitted(t, job)
	if len(newest) != 4 {
		t.Fatalf("the agents' logs show commits of %d ranks, want 4: %v", len(newest), newest)
	}
	for r, s := range newest {
		if s >= failStep {
			t.Errorf("rank %d committed step %d, but rank %d died at the start of step %d", r, s, failRank, failStep)
		}
	}
	t.Logf("newest committed step per rank when the step died: %v", newest)

	// 2. Relaunched by hand in the same allocation: every rank restores
	// from its node's store, and the run finishes.
	resumed, from := relaunch(t, job, step, failRank, failStep)
	got := lossLines(resumed.Stdout)
	if l := lossRe.FindStringSubmatch(resumed.Stdout); l == nil || l[1] != strconv.FormatInt(from+1, 10) {
		t.Errorf("the relaunch's first step is %v, want %d (the one after the restored step)", l, from+1)
	}
	for n, l := range refLoss {
		if n > from && got[n] != l {
			t.Errorf("relaunch, step %d: %q, uninterrupted %q", n, got[n], l)
		}
	}
	if h := torchRun(t, "relaunch", resumed); h != refHash {
		t.Fatalf("final-params-sha256 after the resume %s, uninterrupted %s:\n%s", h, refHash, resumed)
	}
	t.Logf("relaunch: final-params-sha256 %s, as uninterrupted", refHash)
}

// TestTorchDDPResumeAdamW: AdamW (moments and step tensors restored), rank
// 2 killed at step 5 of 10.
func TestTorchDDPResumeAdamW(t *testing.T) {
	torchCrashResume(t, 10, 5, 2, "--optimizer", "adamw")
}

// TestTorchDDPResumeMomentum: SGD with momentum, rank 1 killed at step 4
// of 8.
func TestTorchDDPResumeMomentum(t *testing.T) {
	torchCrashResume(t, 8, 4, 1, "--optimizer", "momentum")
}

// TestTorchDDPSnapshotsChangeNothing: an uninterrupted run with snapshots
// every step ends with the bits of one without reft, and the agent holds
// the last steps afterwards (the relaunch of a finished run restores the
// last step and trains no more).
func TestTorchDDPSnapshotsChangeNothing(t *testing.T) {
	enableReft(t)
	flags := append(append([]string{}, torchFlags...), "--steps", "6", "--optimizer", "adam")
	layout := []string{"-N4", "-n4"}
	ref := torchRun(t, "without reft", mustRun(t, 3*time.Minute, alice,
		append(append([]string{"srun", "-K1"}, layout...), torchTask(flags...)...)...))

	job := allocate(t, append([]string{"--reft=arc"}, layout...)...)
	step := append(append([]string{"srun", "--jobid=" + job, "--reft=arc", "-K1"}, layout...), torchTask(flags...)...)
	with := mustRun(t, 3*time.Minute, alice, step...)
	if h := torchRun(t, "with reft", with); h != ref {
		t.Fatalf("final-params-sha256 with snapshots %s, without %s", h, ref)
	}
	if strings.Contains(with.Stdout, "snapshots off") || resumedRe.MatchString(with.Stdout) {
		t.Fatalf("the first --reft=arc step ran without snapshots or resumed:\n%s", with)
	}
	again := mustRun(t, 3*time.Minute, alice, step...)
	if m := resumedRe.FindStringSubmatch(again.Stdout); m == nil || m[1] != "6" {
		t.Fatalf("the relaunch of a finished run did not resume from step 6:\n%s", again)
	}
	if n := len(regexp.MustCompile(`(?m)^step \d+ loss`).FindAllString(again.Stdout, -1)); n != 0 {
		t.Errorf("the relaunch of a finished run trained %d more steps", n)
	}
	if h := torchRun(t, "relaunch", again); h != ref {
		t.Fatalf("final-params-sha256 of the restored state %s, want %s", h, ref)
	}
	t.Logf("final-params-sha256 %s with and without snapshots, and after restoring step 6", ref)
}
