//go:build e2e

package e2e

// End-to-end test of the node-local snapshot store (issue 4): a snapshot
// in one node's /dev/shm survives the job's processes being killed, and is
// gone after the node is lost.

import (
	"bufio"
	"context"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// storeRoot is this test's own store root on the node, apart from the
// plugin's, so the two never meet.
const storeRoot = "/dev/shm/reft-store-e2e"

// buildShared builds a package of this repository into a directory every
// node and user can read, and returns the binary's path.
func buildShared(t *testing.T, dir, pkg, name string) string {
	t.Helper()
	out := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = repo
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}

var committedRe = regexp.MustCompile(`^committed step (\d+) job (\d+) on (\S+) in (\S+)$`)

// TestStoreSurvivesKilledJobNotNodeLoss: srun writes a committed snapshot
// on n5 and holds it; scancel -s KILL kills the step; a new srun on n5
// restores it with every checksum verified; reft gc --dry-run would remove
// it (its job is over); after kill-node and revive of n5 it is gone.
func TestStoreSurvivesKilledJobNotNodeLoss(t *testing.T) {
	const node, step, size = "n5", "3", "67108864"
	t.Cleanup(func() { reviveIfDead(t, node) })
	dir := sharedDir(t, root)
	sw := buildShared(t, dir, "./tests/storewriter", "storewriter")
	reft := buildShared(t, dir, "./cmd/reft", "reft")
	u, err := user.Lookup(alice)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)

	// 1. Write and commit, then hold the store like an agent would.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	writer := command(ctx, alice, "srun", "-N1", "-n1", "-w", node, "--job-name=reft-store-e2e",
		sw, "write", "--root", storeRoot, "--step", step, "--size", size)
	stdout, err := writer.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	writer.Stderr = &stderr
	if err := writer.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	committed := make(chan []string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := committedRe.FindStringSubmatch(strings.TrimSpace(sc.Text())); m != nil {
				committed <- m
			}
		}
		done <- writer.Wait()
	}()
	var m []string
	select {
	case m = <-committed:
	case err := <-done:
		t.Fatalf("writer ended before committing: %v\n%s", err, stderr.String())
	case <-time.After(2 * time.Minute):
		t.Fatalf("writer did not commit within 2 minutes\n%s", stderr.String())
	}
	job, host, jobDir := m[2], m[3], m[4]
	if host != node || jobDir != filepath.Join(storeRoot, u.Uid, job) {
		t.Fatalf("writer committed on %s into %s; want %s and %s/%d/%s", host, jobDir, node, storeRoot, uid, job)
	}
	t.Cleanup(func() { run(t, time.Minute, alice, "srun", "-N1", "-w", node, "rm", "-rf", jobDir) })

	// 2. Kill the job's processes.
	mustRun(t, time.Minute, root, "scancel", "--signal=KILL", job)
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatalf("srun of job %s still running a minute after scancel --signal=KILL", job)
	}
	st := waitJob(t, job, time.Minute)
	t.Logf("job %s ended %s", job, st)

	// 3. A new job on the same node restores it. Open would fail if the
	// writer still held the store's lock, so this also proves it died.
	r := mustRun(t, 2*time.Minute, alice, "srun", "-N1", "-n1", "-w", node,
		sw, "restore", "--root", storeRoot, "--job", job, "--step", step, "--size", size)
	if want := "restored step " + step + " job " + job + " on " + node + ": 3 buffers verified"; !strings.Contains(r.Stdout, want) {
		t.Fatalf("restore on %s: want %q\n%s", node, want, r)
	}
	t.Log(strings.TrimSpace(r.Stdout))

	// 4. Slurm says the job is over, so gc would remove it; dry run only.
	r = mustRun(t, 2*time.Minute, alice, "srun", "-N1", "-n1", "-w", node, reft, "gc", "--dry-run", "--root", storeRoot)
	if !strings.Contains(r.Stdout, "would remove "+jobDir+" (") {
		t.Fatalf("reft gc --dry-run on %s does not list %s:\n%s", node, jobDir, r)
	}
	t.Log(strings.TrimSpace(r.Stdout))
	if r := mustRun(t, time.Minute, alice, "srun", "-N1", "-n1", "-w", node, sw, "check", "--root", storeRoot, "--job", job); !strings.Contains(r.Stdout, "present on "+node) {
		t.Fatalf("the dry run removed the snapshot:\n%s", r)
	}

	// 5. Node loss takes the snapshot with it.
	cluster(t, "kill-node", node)
	cluster(t, "revive", node)
	r = mustRun(t, 2*time.Minute, alice, "srun", "-N1", "-n1", "-w", node, sw, "check", "--root", storeRoot, "--job", job)
	if !strings.Contains(r.Stdout, "absent on "+node) {
		t.Fatalf("snapshot of job %s still on %s after kill-node and revive:\n%s", job, node, r)
	}
	t.Log(strings.TrimSpace(r.Stdout))
}
