//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestReftRunBeyondTolerance: -N5 --no-kill, DP=3 on n1-n3 with two
// spares; n2 and n3 (ranks 1 and 2, neighbours on the ARC ring) die at
// once, beyond what arc tolerates. reft run excludes both and relaunches
// with the spares in their places.
//   - Under arc the group lost a shard and its only copy: the ranks restore
//     the newest step every rank persisted, and the recovery log, `reft
//     log` and the agents say why memory could not serve it.
//   - Under arc+aec the parity rebuilds what arc lost: the job resumes
//     from memory, at most one step lost.
//
// Either way the job completes with the uninterrupted run's bits.
func TestReftRunBeyondTolerance(t *testing.T) {
	cases := []struct {
		name    string
		spec    string
		persist bool
		restore string // the restore event the spares' ranks must show
	}{
		{"arc falls back to the persistent tier", "arc,spares=2,persist=5", true, "restore_persistent"},
		{"arc+aec survives in memory", "arc+aec,spares=2", false, "decode"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			enableReft(t)
			flags := append(append(append([]string{}, trainFlags...), reftTrainFlags...), dp3Flags...)
			flags = append(flags, "--dp", "3", "--steps", "60")
			refHash := referenceRun(t, 3, flags).hash
			spec := tc.spec
			if tc.persist {
				spec += ",persist_dir=" + sharedDir(t, alice)
			}
			job, dir := untilNoInitCrash(t, func() (string, string) {
				for _, n := range clusterNodes {
					reviveIfDead(t, n)
				}
				job, dir := reftRunJobWith(t, "-N5 --no-kill --reft="+spec+" --requeue", flags...)
				waitOutput(t, dir, job, "\nstep 13 loss")
				killNodes(t, "n2", "n3")
				waitJobEnd(t, job, 5*time.Minute)
				return job, dir
			})
			out := completedSame(t, dir, job, refHash)

			ev := recoveryEvents(t, job)
			names := eventNames(ev)
			t.Logf("job %s: recovery events %v", job, names)
			// Both nodes excluded, the spares in their places (srun may
			// report both at once, or the second when the first relaunch
			// trips on it).
			var excluded, spares []string
			for _, e := range eventsNamed(ev, "node_excluded") {
				excluded, spares = append(excluded, e.Node), append(spares, e.Replacement)
			}
			slices.Sort(excluded)
			slices.Sort(spares)
			if !slices.Equal(excluded, []string{"n2", "n3"}) || !slices.Equal(spares, []string{"n4", "n5"}) {
				t.Errorf("node_excluded for %v replaced by %v: want n2 and n3 by n4 and n5", excluded, spares)
			}
			rel := eventsNamed(ev, "step_relaunched")
			if len(rel) == 0 {
				t.Fatalf("no step_relaunched: %v", names)
			}
			last := rel[len(rel)-1]
			if len(last.Nodes) != 3 || last.Nodes[0] != "n1" || !slices.Contains(last.Nodes, "n4") || !slices.Contains(last.Nodes, "n5") {
				t.Errorf("the last relaunch ran on %v: want n1 and the spares n4, n5", last.Nodes)
			}
			failures := eventsNamed(ev, "failure_detected")
			resumed := eventsNamed(ev, "resumed")
			if len(failures) == 0 || len(resumed) != 1 || names[len(names)-1] != "completed" {
				t.Fatalf("events %v: want failures, one resumed, completed", names)
			}
			// What was committed: the agents' answer at the failure, else
			// what rank 0 logged (step L logged: every rank committed L-1).
			committed := failures[0].Generation
			if committed < 0 {
				for _, m := range lossRe.FindAllStringSubmatch(out, -1) {
					if n, _ := strconv.ParseInt(m[1], 10, 64); n > committed && !strings.Contains(out[:strings.Index(out, m[0])], "resumed from step") {
						committed = n - 1
					}
				}
			}
			from := resumed[0].Generation
			var restores []recoveryEvent
			for _, e := range ev {
				if e.Step == last.Step && slices.Contains([]string{"restore_local", "restore_peer", "decode", "restore_persistent"}, e.Event) {
					restores = append(restores, e)
				}
			}
			var onSpares []string
			for _, e := range restores {
				if e.Generation != from {
					t.Errorf("%s restored step %d, the job resumed from %d", e.Node, e.Generation, from)
				}
				if e.Node == "n4" || e.Node == "n5" {
					onSpares = append(onSpares, e.Event)
				}
			}
			if !slices.Contains(onSpares, tc.restore) {
				t.Errorf("the spares' restores %v: want %s", onSpares, tc.restore)
			}
			conf := clusterDir + "/etc/reft-e2e.toml"
			lg := mustRun(t, time.Minute, alice, bin("reft"), "log", "--config", conf, job).Stdout
			c := jobComment(t, job)
			t.Logf("job %s: %d step(s) committed at the failure, resumed from step %d, %.1f s after it; Comment: %s", job, committed, from, resumed[0].DurationS, c)
			// The two verdicts race: either may come first.
			if !strings.Contains(c, "nodes n2,n3 lost, replaced by n4,n5") && !strings.Contains(c, "nodes n3,n2 lost, replaced by n4,n5") &&
				!strings.Contains(c, "2 failures") {
				t.Errorf("Comment %q does not name the lost nodes", c)
			}
			if !strings.Contains(c, "resumed from step "+strconv.FormatInt(from, 10)) {
				t.Errorf("Comment %q: want it to say the job resumed from step %d", c, from)
			}
			if tc.persist {
				// The newest persisted step: a multiple of 5, at most two
				// intervals behind what was committed.
				if from%5 != 0 || from > committed+1 || from < committed-10 {
					t.Errorf("resumed from step %d with step %d committed: want the newest persisted step (every 5)", from, committed)
				}
				const why = "memory could not serve it: SG (pp=0,tp=0) lost ranks 1 and 2 "
				for _, e := range restores {
					if e.Event != "restore_persistent" || !strings.HasPrefix(e.Cause, why) || !strings.Contains(e.Cause, "arc tolerates 1 failure per group") {
						t.Errorf("restore event %+v: want restore_persistent with the reason (%q...)", e, why)
					}
				}
				if !strings.Contains(lg, "from the persistent directory") || !strings.Contains(lg, why) {
					t.Errorf("reft log does not explain the persistent restore:\n%s", lg)
				}
			} else if from < committed-1 {
				t.Errorf("resumed from step %d with step %d committed: more than one step lost", from, committed)
			}
		})
	}
}

// TestReftRunFailedStepLeavesSlurm: n2 dies and, at once, the step's tasks
// on the other nodes die too (as a trainer's ranks do when a collective
// loses a peer), long before anyone has called n2 lost. reft run gives n2
// back to Slurm and relaunches with the spare. The failed step must still
// leave Slurm: slurmctld (22.05) ends a step only on the last node's
// completion report, and counts a node removed from the job as complete
// without ending it; had the survivors reported first, the step would stay
// RUNNING with its CPUs for the job's life, and the batch script's cleanup
// srun (no --overlap) would wait forever. The SPANK plugin holds each
// survivor's report until n2 is out of the job, and says so in slurmd's
// log.
func TestReftRunFailedStepLeavesSlurm(t *testing.T) {
	enableReft(t)
	reviveIfDead(t, "n2")
	dir := sharedDir(t, alice)
	// First launch: each task records its pid and sleeps; the relaunch
	// (after the test wrote "relaunch") exits 0 at once.
	command := fmt.Sprintf(`sh -c 'test -e %[1]s/relaunch && exit 0; echo $$ > %[1]s/pid.$SLURMD_NODENAME.tmp && mv %[1]s/pid.$SLURMD_NODENAME.tmp %[1]s/pid.$SLURMD_NODENAME; exec sleep 600'`, dir)
	job, outDir := reftRunCmd(t, "-N5 --no-kill --reft=arc,spares=1 --requeue", command)
	pids := map[string]int{}
	deadline := time.Now().Add(2 * time.Minute)
	for len(pids) < 4 {
		for _, n := range []string{"n1", "n2", "n3", "n4"} {
			if b, err := os.ReadFile(filepath.Join(dir, "pid."+n)); err == nil {
				if p, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
					pids[n] = p
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the step's tasks did not start on n1-n4 (pids %v)\n%s", pids, jobDiag(t, job))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := os.WriteFile(filepath.Join(dir, "relaunch"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// The survivors' tasks die the moment n2's does (the test's own
	// processes, by their recorded pids), while kill-node is still at work.
	t.Cleanup(func() { reviveIfDead(t, "n2") })
	killed := make(chan error, 1)
	go func() {
		killed <- exec.Command(repo+"/tests/cluster/cluster", "kill-node", "n2").Run()
	}()
	for running(pids["n2"]) {
		time.Sleep(time.Millisecond)
	}
	for _, n := range []string{"n1", "n3", "n4"} {
		if err := syscall.Kill(pids[n], syscall.SIGKILL); err != nil {
			t.Errorf("killing the task on %s (pid %d): %v", n, pids[n], err)
		}
	}
	if err := <-killed; err != nil {
		t.Fatalf("kill-node n2: %v", err)
	}
	if st := waitJobEnd(t, job, 3*time.Minute); st != "COMPLETED" {
		t.Fatalf("job %s ended %s:\n%s", job, st, jobOutput(t, outDir, job))
	}
	if o := jobOutput(t, outDir, job); !strings.Contains(o, "reft run exit 0\n") {
		t.Fatalf("job %s: reft run did not exit 0:\n%s", job, o)
	}
	ev := recoveryEvents(t, job)
	if f := eventsNamed(ev, "failure_detected"); len(f) != 1 || f[0].Node != "n2" || f[0].Kind != "node" {
		t.Errorf("failure_detected %+v: want n2's node failure", f)
	}
	// Every survivor held its report until n2 had left the job.
	held := fmt.Sprintf("[%s.0] reft: step %s.0: held the step's end", job, job)
	for _, n := range []string{"n1", "n3", "n4"} {
		b, err := os.ReadFile(filepath.Join(clusterDir, "log", "slurmd-"+n+".log"))
		if err != nil {
			t.Fatal(err)
		}
		i := strings.Index(string(b), held)
		if i < 0 {
			t.Errorf("slurmd log of %s: no %q", n, held)
			continue
		}
		line, _, _ := strings.Cut(string(b[i:]), "\n")
		if !strings.Contains(line, "until lost node(s) n2 left the job") {
			t.Errorf("slurmd log of %s: %s", n, line)
		}
		t.Logf("%s: %s", n, line)
	}
}

// running says whether pid is a live process (not gone, not a zombie
// waiting to be reaped).
func running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}
