//go:build e2e

package e2e

// End-to-end tests of reft-train with reft snapshots (issue 5): a rank is
// killed, a second step of the same allocation restores every rank from its
// node's store, and training ends with the bits of an uninterrupted run.

import (
	"fmt"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// reftTrainFlags: trainFlags with every step saved and logged, so the
// resumed run's losses can be compared step by step.
var reftTrainFlags = []string{"--log-every", "1", "--save-every", "1"}

var (
	resumedRe = regexp.MustCompile(`(?m)^resumed from step (\d+)$`)
	lossRe    = regexp.MustCompile(`(?m)^step (\d+) loss \S+$`)
	grantedRe = regexp.MustCompile(`Granted job allocation (\d+)`)
)

// reftStoreRoot is reftConf's tmpfs_root: a job's stores are
// <root>/<uid>/<job> on each node.
const reftStoreRoot = "/dev/shm/reft"

// snapshotsOffLine is how reft-train says that it runs without reft.
const snapshotsOffLine = "snapshots off: REFT_AGENT_SOCKET is not set"

// allocate makes an allocation with salloc --no-shell as alice and returns
// its job id; it is cancelled when the test ends. Steps run in it with
// srun --jobid, so they share the job's agents and node-local stores.
func allocate(t *testing.T, args ...string) string {
	t.Helper()
	return allocateAs(t, alice, args...)
}

// lossLines maps step to rank 0's "step N loss X" line.
func lossLines(stdout string) map[int64]string {
	out := map[int64]string{}
	for _, m := range lossRe.FindAllStringSubmatch(stdout, -1) {
		n, _ := strconv.ParseInt(m[1], 10, 64)
		out[n] = m[0]
	}
	return out
}

// crashResume trains with --fail-at STEP:RANK in an allocation of nodes
// with --reft=arc: the first step loses that rank; a second step with the
// same flags restores from the node-local stores, redoes at most one step
// of work, and ends with the final-params-sha256 and losses of an
// uninterrupted run without reft.
func crashResume(t *testing.T, nodes, ranks int, failStep int64, failRank int, flags ...string) {
	enableReft(t)
	flags = append(append(append([]string{}, trainFlags...), reftTrainFlags...), flags...)
	layout := []string{"-N" + strconv.Itoa(nodes), "-n" + strconv.Itoa(ranks)}

	// The reference: its own job, reft not asked for, so no snapshots.
	ref := mustRun(t, 3*time.Minute, alice, append(append([]string{"srun", "--mpi=pmix"}, layout...), append([]string{bin("reft-train")}, flags...)...)...)
	refHash := hashRe.FindStringSubmatch(ref.Stdout)
	if refHash == nil {
		t.Fatalf("the uninterrupted run printed no final-params-sha256:\n%s", ref)
	}
	if n := strings.Count(ref.Stdout+ref.Stderr, snapshotsOffLine); n != 1 {
		t.Errorf("the run without --reft says %d times that snapshots are off, want once:\n%s", n, ref)
	}
	refLoss := lossLines(ref.Stdout)

	job := allocate(t, append([]string{"--reft=arc"}, layout...)...)
	// The stores outlive the job by design (reft gc removes them later);
	// remove this job's now, before the allocation goes, so that the
	// nodes' small tmpfs does not fill up over many runs.
	u, err := user.Lookup(alice)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		run(t, time.Minute, alice, append(append([]string{"srun", "--jobid=" + job}, layout...),
			"rm", "-rf", filepath.Join(reftStoreRoot, u.Uid, job))...)
	})
	fail := []string{"--fail-at", strconv.FormatInt(failStep, 10) + ":" + strconv.Itoa(failRank)}
	step := append(append([]string{"srun", "--jobid=" + job, "--reft=arc", "-K1", "--mpi=pmix"}, layout...),
		append(append([]string{bin("reft-train")}, flags...), fail...)...)

	// 1. The rank kills itself; -K1 ends the step.
	crashed := run(t, 3*time.Minute, alice, step...)
	if crashed.Code == 0 {
		t.Fatalf("the step with %s succeeded:\n%s", strings.Join(fail, " "), crashed)
	}
	failRe := regexp.MustCompile(`rank ` + strconv.Itoa(failRank) + `: --fail-at (\d+):` + strconv.Itoa(failRank) + `: SIGKILL`)
	m := failRe.FindStringSubmatch(crashed.Stderr)
	if m == nil {
		t.Fatalf("no fail-at message from rank %d:\n%s", failRank, crashed)
	}
	failedAt, _ := strconv.ParseInt(m[1], 10, 64)
	if hashRe.MatchString(crashed.Stdout) || resumedRe.MatchString(crashed.Stdout) {
		t.Fatalf("the crashed step resumed or finished:\n%s", crashed)
	}
	if strings.Contains(crashed.Stdout+crashed.Stderr, snapshotsOffLine) {
		t.Fatalf("the --reft=arc step ran without snapshots:\n%s", crashed)
	}
	// What rank 0 logged before the failure matches the reference.
	for n, l := range lossLines(crashed.Stdout) {
		if l != refLoss[n] {
			t.Errorf("crashed step, step %d: %q, uninterrupted %q", n, l, refLoss[n])
		}
	}

	// 2. Relaunched by hand in the same allocation: restores and finishes.
	resumed, from := relaunch(t, job, step, failRank, failedAt)
	got := lossLines(resumed.Stdout)
	first := int64(-1)
	if l := lossRe.FindStringSubmatch(resumed.Stdout); l != nil {
		first, _ = strconv.ParseInt(l[1], 10, 64)
	}
	if first != from+1 {
		t.Errorf("the relaunch's first step is %d, want %d (the one after the restored step)", first, from+1)
	}
	for n, l := range refLoss {
		if n > from && got[n] != l {
			t.Errorf("relaunch, step %d: %q, uninterrupted %q", n, got[n], l)
		}
	}
	h := hashRe.FindStringSubmatch(resumed.Stdout)
	if h == nil || h[1] != refHash[1] {
		t.Fatalf("final-params-sha256 after the resume %v, uninterrupted %s:\n%s", h, refHash[1], resumed)
	}
	t.Logf("final-params-sha256 %s, as uninterrupted", h[1])
}

// relaunch runs the step again by hand in the same allocation; it must log
// "resumed from step N" once, with at most one step of work redone after a
// rank died at the start of step failedAt (steps 1..failedAt-1 were done; a
// save in flight when it died may be lost, not more). It returns the run
// and N.
func relaunch(t *testing.T, job string, step []string, failRank int, failedAt int64) (result, int64) {
	t.Helper()
	resumed := mustRun(t, 3*time.Minute, alice, step...)
	from, ok := checkResumed(t, job, resumed, fmt.Sprintf("rank %d killed at the start of step %d", failRank, failedAt), failedAt-1, failedAt-1, 1)
	if !ok {
		t.FailNow()
	}
	return resumed, from
}

// checkResumed checks a relaunch's output: exactly one "resumed from step
// N" line, with at most maxRedone steps of committed work redone and
// nothing restored that was never committed: lastDone is the newest step
// every rank had committed when the failure (what) hit, newest the newest
// step any rank had (>= lastDone), so N must lie in
// [lastDone-maxRedone, newest]. It reports with t.Errorf and returns N; ok
// is false when there is no single such line.
func checkResumed(t *testing.T, job string, r result, what string, lastDone, newest, maxRedone int64) (from int64, ok bool) {
	t.Helper()
	rm := resumedRe.FindAllStringSubmatch(r.Stdout, -1)
	if len(rm) != 1 {
		t.Errorf("%d 'resumed from step' lines in the relaunch, want 1:\n%s", len(rm), r)
		return -1, false
	}
	from, _ = strconv.ParseInt(rm[0][1], 10, 64)
	redone := max(lastDone-from, 0)
	t.Logf("job %s: %s; relaunch resumed from step %d: %d step(s) of work redone", job, what, from, redone)
	if from < lastDone-maxRedone || from > newest {
		t.Errorf("resumed from step %d after %s: want step %d to %d (at most %d step(s) of committed work redone, no step newer than any rank committed)",
			from, what, lastDone-maxRedone, newest, maxRedone)
	}
	return from, true
}

// TestTrainerReftResumeDP: four data-parallel ranks on four nodes, rank 2
// killed at step 7.
func TestTrainerReftResumeDP(t *testing.T) {
	crashResume(t, 4, 4, 7, 2, "--dp", "4")
}

// TestTrainerReftResumeZero1: ZeRO-1 AdamW, whose optimizer shards are
// registered Sharded: rank 1's shard exists only in its node's store.
func TestTrainerReftResumeZero1(t *testing.T) {
	crashResume(t, 4, 4, 7, 1, "--dp", "4", "--zero1", "--optimizer", "adamw")
}

// TestTrainerReftResumePipeline: dp 2 x pp 2, a last-stage rank killed;
// without idle-window hints, so every save is copied as soon as it starts.
func TestTrainerReftResumePipeline(t *testing.T) {
	crashResume(t, 4, 4, 7, 3, "--dp", "2", "--pp", "2", "--hints=false")
}
