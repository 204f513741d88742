//go:build e2e

package e2e

import (
	"slices"
	"strconv"
	"strings"
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
			out := jobOutput(t, dir, job)
			if st := waitJobEnd(t, job, time.Minute); st != "COMPLETED" || !strings.Contains(out, "reft run exit 0\n") {
				t.Fatalf("job %s ended %s:\n%s", job, st, out)
			}
			if h := hashRe.FindAllStringSubmatch(out, -1); len(h) != 1 || h[0][1] != refHash {
				t.Fatalf("final-params-sha256 %v, uninterrupted %s:\n%s", h, refHash, out)
			}

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
			committed := failures[0].Generation
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
			if !strings.Contains(c, "nodes n2,n3 lost") && !strings.Contains(c, "2 failures") {
				t.Errorf("Comment %q does not name the lost nodes", c)
			}
			if !strings.Contains(c, "resumed from step "+strconv.FormatInt(from, 10)) {
				t.Errorf("Comment %q: want it to say the job resumed from step %d", c, from)
			}
			if tc.persist {
				// The newest persisted step: a multiple of 5, at most two
				// intervals behind what was committed.
				if from%5 != 0 || from > committed || from < committed-10 {
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
