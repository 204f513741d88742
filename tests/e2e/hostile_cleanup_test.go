//go:build e2e

package e2e

// Issue 14, findings 2 and 6 on the real cluster: a job's snapshot store
// leaves the node with the job (completed, failed, cancelled, node lost),
// and stays only when Slurm requeues the job; root's removal (the job
// epilog, `reft gc`) survives what a hostile user plants in his own store.

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// cleanupStoreRoot is tmpfs_root in the e2e reft.toml.
const cleanupStoreRoot = "/dev/shm/reft"

// cleanupStores lists the job directories under the store root on node, as
// "<uid>/<job>", by a root step there (a node's /dev/shm is its own).
func cleanupStores(t *testing.T, node string) []string {
	t.Helper()
	r := mustRun(t, 2*time.Minute, root, "srun", "-N1", "-w", node, "-t", "2", "sh", "-c",
		"cd "+cleanupStoreRoot+" 2>/dev/null && for d in */*; do [ -e \"$d\" ] || [ -L \"$d\" ] && echo \"$d\"; done; true")
	return lines(r.Stdout)
}

// cleanupHasStore says whether node holds a store of job for user.
func cleanupHasStore(t *testing.T, node, user, job string) bool {
	return slices.Contains(cleanupStores(t, node), fmt.Sprintf("%d/%s", uidOf(t, user), job))
}

// cleanupEpilogLines are the plugin's epilog lines about job in node's
// slurmd log.
func cleanupEpilogLines(t *testing.T, node, job string) []string {
	t.Helper()
	var out []string
	for _, l := range lines(cluster(t, "logs", node, "400")) {
		if strings.Contains(l, "reft: job "+job+" epilog") {
			out = append(out, l)
		}
	}
	return out
}

// cleanupWaitOutput waits until the job's output holds want.
func cleanupWaitOutput(t *testing.T, dir, job, want string, timeout time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(300 * time.Millisecond) {
		b, _ := os.ReadFile(filepath.Join(dir, "slurm-"+job+".out"))
		if strings.Contains(string(b), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s printed no %q within %v:\n%s", job, want, timeout, b)
		}
	}
}

// cleanupWaitGone waits until slurmctld no longer shows the job as
// running or completing (its epilogs have run on every node).
//
// A job that is not meant to be requeued is not settled while it reads
// PENDING: a job that ended within a second of its submission has left
// squeue's list while slurmdbd may still hold only its submission, which
// sacct shows as PENDING (seen once on the Debian 12 lane: "job ended
// PENDING, want COMPLETED", 0.3 s after sbatch).
func cleanupWaitSettled(t *testing.T, job string, timeout time.Duration, requeued bool) string {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(500 * time.Millisecond) {
		st := jobState(t, job)
		if st != "" && st != "RUNNING" && st != "COMPLETING" && st != "CONFIGURING" && (requeued || !strings.HasPrefix(st, "PENDING")) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s still %q after %v", job, st, timeout)
		}
	}
}

// cleanupNotDrained fails when a node is drained or down.
func cleanupNotDrained(t *testing.T, nodes ...string) {
	t.Helper()
	for _, n := range nodes {
		st := strings.TrimSpace(mustRun(t, 30*time.Second, root, "sinfo", "-h", "-n", n, "-o", "%T").Stdout)
		if strings.Contains(st, "drain") || strings.Contains(st, "down") || strings.Contains(st, "fail") {
			t.Errorf("node %s is %s after the test: %s", n, st, mustRun(t, 30*time.Second, root, "scontrol", "show", "node", n).Stdout)
		}
	}
}

// cleanupLoadPlugin installs the plugin for the test and restarts the
// nodes' slurmds, which read plugstack.conf only at their start: only a
// slurmd that loaded the plugin runs its job epilog. When the test ends
// the nodes get slurmds without it again, as the other tests expect.
func cleanupLoadPlugin(t *testing.T, nodes ...string) {
	t.Helper()
	tool := filepath.Join(repo, "tests", "cluster", "cluster")
	restart := func() {
		for _, n := range nodes {
			// A process of a job that just ended may still be on its way
			// out (uninterruptible for a moment on a loaded host), which
			// kill-node reports: try again shortly.
			for try := 1; slurmdUp(t, n); try++ {
				r := run(t, 3*time.Minute, root, tool, "kill-node", n)
				if r.Code == 0 {
					break
				}
				if try == 3 {
					t.Fatalf("kill-node %s:\n%s", n, r)
				}
				time.Sleep(3 * time.Second)
			}
			cluster(t, "revive", n)
		}
	}
	// Registered before enableReft's, so it runs after the line is gone.
	t.Cleanup(func() {
		disableReft(t)
		restart()
	})
	enableReft(t)
	restart()
}

// TestCleanupJobEnd: after a job ends on its nodes, whichever way, no store
// of it is left on any surviving node, unless Slurm requeued it.
func TestCleanupJobEnd(t *testing.T) {
	cleanupLoadPlugin(t, "n1", "n2", "n3", "n4")
	type endCase struct {
		name   string
		args   []string
		tail   string                         // the script after its reft step printed READY
		end    func(t *testing.T, job string) // ends the job, or nil (it ends by itself)
		nodes  []string
		lost   string // a node the case kills (its store goes with it)
		keep   bool   // the store stays (requeued)
		states []string
	}
	cases := []endCase{
		{name: "completed", tail: "exit 0", nodes: []string{"n1", "n2"}, states: []string{"COMPLETED"}},
		{name: "failed", tail: "exit 3", nodes: []string{"n1", "n2"}, states: []string{"FAILED"}},
		{name: "cancelled", tail: "sleep 300", nodes: []string{"n1", "n2"}, states: []string{"CANCELLED"},
			end: func(t *testing.T, job string) { mustRun(t, time.Minute, alice, "scancel", job) }},
		{name: "node lost", tail: "sleep 300", nodes: []string{"n3", "n4"}, lost: "n4", args: []string{"--no-requeue"},
			states: []string{"NODE_FAIL", "FAILED", "CANCELLED"},
			end:    func(t *testing.T, job string) { killNodes(t, "n4") }},
		{name: "requeued", tail: "sleep 300", nodes: []string{"n1", "n2"}, args: []string{"--requeue"}, keep: true,
			states: []string{"PENDING", "REQUEUED"},
			end:    func(t *testing.T, job string) { mustRun(t, time.Minute, root, "scontrol", "requeue", job) }},
		// Its second run ends for good: Restarts=1 now, and the epilog
		// must tell that from a requeue (accounting has two runs).
		{name: "requeued, then its next run completes", nodes: []string{"n1", "n2"}, args: []string{"--requeue"},
			tail:   `[ "${SLURM_RESTART_COUNT:-0}" = 0 ] && sleep 300; echo DONE$SLURM_RESTART_COUNT; exit 0`,
			states: []string{"COMPLETED"},
			end: func(t *testing.T, job string) {
				mustRun(t, time.Minute, root, "scontrol", "requeue", job)
				for deadline := time.Now().Add(time.Minute); jobState(t, job) != "PENDING"; time.Sleep(300 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("job %s not pending after its requeue: %s", job, jobState(t, job))
					}
				}
				// The first run's epilog keeps the store on both nodes; only
				// then may the next run start there (a node refuses a run
				// whose credential it revoked moments ago).
				for _, n := range []string{"n1", "n2"} {
					for deadline := time.Now().Add(time.Minute); !slices.ContainsFunc(cleanupEpilogLines(t, n, job),
						func(l string) bool { return strings.Contains(l, "store kept") }); time.Sleep(500 * time.Millisecond) {
						if time.Now().After(deadline) {
							t.Fatalf("%s: no epilog kept the requeued job's store: %q", n, cleanupEpilogLines(t, n, job))
						}
					}
				}
				time.Sleep(3 * time.Second)
				// Slurm delays a requeued job's start (BeginTime); now.
				mustRun(t, time.Minute, root, "scontrol", "update", "jobid="+job, "StartTime=now")
				for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(300 * time.Millisecond) {
					if st := jobState(t, job); st != "PENDING" && st != "CONFIGURING" && st != "RUNNING" && st != "COMPLETING" {
						return
					}
					if time.Now().After(deadline) {
						t.Fatalf("the requeued job %s did not run again", job)
					}
				}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := sharedDir(t, alice)
			hello := writeHelloPy(t, dir)
			script := fmt.Sprintf("#!/bin/sh\nsrun python3 %s || exit 9\necho READY\n%s\n", hello, tc.tail)
			args := append([]string{"--reft=arc", "-N2", "-w", strings.Join(tc.nodes, ","), "-t", "5"}, tc.args...)
			job := sbatchIn(t, dir, script, args...)
			cleanupWaitOutput(t, dir, job, "READY", 2*time.Minute)
			if tc.end != nil {
				tc.end(t, job)
			}
			st := cleanupWaitSettled(t, job, 3*time.Minute, slices.ContainsFunc(tc.states, func(s string) bool { return s == "PENDING" }))
			if !slices.ContainsFunc(tc.states, func(s string) bool { return strings.HasPrefix(st, s) }) {
				t.Fatalf("job %s ended %s, want one of %v", job, st, tc.states)
			}
			for _, n := range tc.nodes {
				if n == tc.lost {
					continue
				}
				has := cleanupHasStore(t, n, alice, job)
				if has != tc.keep {
					t.Errorf("%s: store of job %s on the node = %v, want %v; epilog said: %q", n, job, has, tc.keep, cleanupEpilogLines(t, n, job))
				}
			}
			if tc.keep {
				// The requeued job never runs again here: cancel it and let
				// root's `reft gc` free what the epilog kept for it.
				mustRun(t, time.Minute, root, "scancel", job)
				cleanupWaitSettled(t, job, time.Minute, false)
				for _, n := range tc.nodes {
					r := mustRun(t, 2*time.Minute, root, "srun", "-N1", "-w", n, "-t", "2", bin("reft"), "gc", "--config", writeReftConf(t))
					if cleanupHasStore(t, n, alice, job) {
						t.Errorf("%s: reft gc left the cancelled job's store:\n%s", n, r)
					}
				}
			}
			if tc.lost != "" {
				reviveIfDead(t, tc.lost)
			}
			cleanupNotDrained(t, tc.nodes...)
		})
	}
}

// cleanupTree hashes every file below dir on node (as root), to show that
// nothing of it changed.
func cleanupTree(t *testing.T, node, dir string) string {
	t.Helper()
	r := mustRun(t, 2*time.Minute, root, "srun", "-N1", "-w", node, "-t", "2", "sh", "-c",
		"cd "+dir+" && find . -print0 | sort -z | xargs -0 ls -ld --time-style=+%s && find . -type f -print0 | sort -z | xargs -0 -r sha256sum")
	return fmt.Sprintf("%x", sha256.Sum256([]byte(r.Stdout))) + "\n" + r.Stdout
}

// TestCleanupHostileStore: reft-bob plants symlinks and FIFOs in his own
// store, aimed at files outside reft, at alice's store and at root's
// opening of the lock; then his job ends (root's epilog removes his store)
// and root runs `reft gc` on the node. Nothing outside bob's own files is
// touched, alice's running job keeps her store bit for bit, nothing
// blocks, and the node is not drained.
func TestCleanupHostileStore(t *testing.T) {
	const node = "n5"
	cleanupLoadPlugin(t, node)
	aliceUID, bobUID := uidOf(t, alice), uidOf(t, bob)

	// Canaries outside reft: root's files bob must not be able to remove
	// through root, one on the host's shared disk and one in the node's
	// /dev/shm, and a FIFO that would block whoever opens it.
	scratch := sharedDir(t, root)
	hostCanary := filepath.Join(scratch, "canary")
	if err := os.WriteFile(hostCanary, []byte("root's file"), 0o644); err != nil {
		t.Fatal(err)
	}
	const shmCanary = "/dev/shm/reft-e2e-canary"
	const shmFifo = "/dev/shm/reft-e2e-fifo"
	mustRun(t, time.Minute, root, "srun", "-N1", "-w", node, "-t", "2", "sh", "-c",
		fmt.Sprintf("echo root > %s && chmod 644 %s && rm -f %s && mkfifo -m 666 %s", shmCanary, shmCanary, shmFifo, shmFifo))
	t.Cleanup(func() {
		command(t.Context(), root, "srun", "-N1", "-w", node, "-t", "2", "rm", "-f", shmCanary, shmFifo).Run()
	})

	// Alice's job runs on the node with its agent and store.
	adir := sharedDir(t, alice)
	ahello := writeHelloPy(t, adir)
	ajob := sbatchIn(t, adir, fmt.Sprintf("#!/bin/sh\nsrun python3 %s || exit 9\necho READY\nsleep 300\n", ahello),
		"--reft=arc", "-N1", "-w", node, "-t", "5")
	cleanupWaitOutput(t, adir, ajob, "READY", 2*time.Minute)
	aliceStore := fmt.Sprintf("%s/%d/%s", cleanupStoreRoot, aliceUID, ajob)
	before := cleanupTree(t, node, aliceStore)

	// Bob's job: a reft step makes his store, then he plants in it (and in
	// a directory named after a job Slurm never had, for `reft gc`).
	bdir := sharedDir(t, bob)
	bhello := writeHelloPy(t, bdir)
	plant := func(dir string) string {
		return fmt.Sprintf(`mkdir -p %[1]s/r0/state %[1]s/r1/state
ln -sfn %[2]s %[1]s/r0/state/arena-0
ln -sfn %[3]s %[1]s/r0/state/arena-1
ln -sfn %[4]s/r0/state/arena-0 %[1]s/r0/state/arena-2
ln -sfn %[4]s %[1]s/r1/state/arena-0
ln -sfn %[5]s %[1]s/r1/state/arena-1
ln -sfn /etc %[1]s/r2
rm -f %[1]s/.lock && mkfifo %[1]s/.lock
`, dir, hostCanary, shmCanary, aliceStore, shmFifo)
	}
	bobStore := fmt.Sprintf("%s/%d/$SLURM_JOB_ID", cleanupStoreRoot, bobUID)
	bogus := fmt.Sprintf("%s/%d/999999", cleanupStoreRoot, bobUID)
	bscript := "#!/bin/sh\nsrun python3 " + bhello + " || exit 9\n" +
		"srun sh -c '" + strings.ReplaceAll(plant(bobStore)+plant(bogus)+"ln -sfn "+shmFifo+" "+bogus+"/.lock\n", "'", `'\''`) + "' || exit 8\necho PLANTED\n"
	bjob := sbatch(t, bob, bscript, "--reft=arc", "-N1", "-w", node, "-t", "5")
	if st := waitJob(t, bjob, 3*time.Minute); !strings.HasPrefix(st, "COMPLETED") {
		t.Fatalf("bob's job %s: %s", bjob, st)
	}
	cleanupWaitSettled(t, bjob, time.Minute, false)
	if cleanupHasStore(t, node, bob, bjob) {
		t.Errorf("the epilog left bob's store of job %s: %q", bjob, cleanupEpilogLines(t, node, bjob))
	}
	epilog := cleanupEpilogLines(t, node, bjob)
	if !slices.ContainsFunc(epilog, func(l string) bool { return strings.Contains(l, "left alone") }) {
		t.Errorf("the epilog of bob's job did not say what it left alone: %q", epilog)
	}

	// Root's reft gc over bob's bogus job directory; it must not hang on
	// the FIFO .lock and must leave alice's running job alone.
	r := run(t, 2*time.Minute, root, "srun", "-N1", "-w", node, "-t", "2", bin("reft"), "gc", "-v", "--config", writeReftConf(t))
	t.Logf("reft gc:\n%s", r)
	if cleanupHasStore(t, node, bob, "999999") {
		t.Errorf("reft gc left bob's planted directory:\n%s", r)
	}
	if !strings.Contains(r.Stderr, "left alone") {
		t.Errorf("reft gc did not say what it left alone:\n%s", r)
	}

	// Nothing outside bob's files changed.
	if b, err := os.ReadFile(hostCanary); err != nil || string(b) != "root's file" {
		t.Errorf("host canary: %q, %v", b, err)
	}
	chk := mustRun(t, time.Minute, root, "srun", "-N1", "-w", node, "-t", "2", "sh", "-c",
		fmt.Sprintf("cat %s && test -p %s && echo fifo-ok", shmCanary, shmFifo))
	if !strings.Contains(chk.Stdout, "root") || !strings.Contains(chk.Stdout, "fifo-ok") {
		t.Errorf("node canaries:\n%s", chk)
	}
	if after := cleanupTree(t, node, aliceStore); after != before {
		t.Errorf("alice's store changed:\nbefore %s\nafter %s", before, after)
	}
	if st := jobState(t, ajob); st != "RUNNING" {
		t.Errorf("alice's job %s is %s, want RUNNING", ajob, st)
	}
	mustRun(t, time.Minute, alice, "scancel", ajob)
	cleanupWaitSettled(t, ajob, time.Minute, false)
	if cleanupHasStore(t, node, alice, ajob) {
		t.Errorf("alice's store of job %s outlived her cancelled job: %q", ajob, cleanupEpilogLines(t, node, ajob))
	}
	cleanupNotDrained(t, node)
}
