//go:build e2e

package e2e

// End-to-end test of message logging and stage-local replay (issue 20,
// SWIFT section 5; docs/LOGGING.md): a pipeline stage lost with its node
// replays from its neighbours' message logs while the other stages keep
// their newer state.

import (
	"regexp"
	"slices"
	"strconv"
	"testing"
)

var (
	replayRe = regexp.MustCompile(`(?m)^REPLAY stage (\d+) from (\d+) to (\d+) steps (\d+) seconds (\S+)$`)
	goesOnRe = regexp.MustCompile(`(?m)^replay: rank\(s\) .* the job goes on from step \d+.*$`)
)

// TestLoggingReplayNodeLoss: reft-train --pp 4 (dp 1, a stage per node on
// n1-n4, n5 the spare) with --log-messages=bubble and --undo, a snapshot every 4
// steps and every snapshot persisted to the shared directory (SWIFT's
// checkpoint: with dp 1 a stage's snapshot has no DP peer to hold a copy,
// so only the persistent tier outlives its node); n3, stage 2, dies once
// rank 0 has logged step 10. The relaunch puts stage 2 on n5, where it
// restores its newest persisted snapshot, while the survivors restore
// their JIT flush of the step they held; stage 2 alone replays the
// steps between from its neighbours' logs, kept by the survivors'
// agents across the relaunch, and the run ends bit-identical to an
// uninterrupted one. Where the kill lands after the last stage finished
// one step more than the others (it can, once the lost stage sent it
// every activation), --undo's JIT step-back made it save the step before
// as well, and the job goes on from there: no survivor replays. The replay's time is reported against what a full
// restart from stage 2's snapshot would recompute: the same steps, on
// every stage, at the relaunch's mean step time.
func TestLoggingReplayNodeLoss(t *testing.T) {
	c := nodeLossCase{spec: "arc,spares=1,persist=4,persist_dir=" + sharedDir(t, alice), dp: 1, pp: 4, kill: []string{"n3"},
		killAt: 10, steps: 24, every: 4, flags: []string{"--save-every", "4"}, reftFlags: []string{"--log-messages", "bubble", "--undo"}}
	r := nodeLoss(t, c)

	replays := replayRe.FindAllStringSubmatch(r.resumed.Stdout, -1)
	if len(replays) == 0 {
		t.Fatalf("job %s: the relaunch printed no REPLAY line:\n%s", r.job, r.resumed)
	}
	var lost []string
	var to int64
	for _, m := range replays {
		stage, _ := strconv.Atoi(m[1])
		from, _ := strconv.ParseInt(m[2], 10, 64)
		to, _ = strconv.ParseInt(m[3], 10, 64)
		n, _ := strconv.ParseInt(m[4], 10, 64)
		secs, _ := strconv.ParseFloat(m[5], 64)
		if stage == 2 {
			lost = m
			if from%c.every != 0 || from > r.lastLogged {
				t.Errorf("job %s: stage 2 replayed from step %d: not one of its snapshots (every %d) before the kill at step %d", r.job, from, c.every, r.lastLogged)
			}
			if to < r.lastLogged {
				t.Errorf("job %s: stage 2 replayed up to step %d, but rank 0 had logged step %d, which every stage finished", r.job, to, r.lastLogged)
			}
			if mm := meanStepRe.FindStringSubmatch(r.resumed.Stdout); mm != nil {
				ms, _ := strconv.ParseFloat(mm[1], 64)
				full := float64(n) * ms / 1e3
				t.Logf("job %s: stage 2 replayed steps %d..%d (%d) in %.3f s; a full restart from step %d recomputes them on every stage: %d x %.1f ms = %.3f s; replay / full restart = %.2f",
					r.job, from+1, to, n, secs, from, n, ms, full, secs/full)
			}
			continue
		}
		t.Errorf("job %s: surviving stage %d replayed steps %d..%d: only the lost stage should (where the survivors' flushes straddled "+
			"a step boundary, the ones ahead should have stepped back)", r.job, stage, from+1, to)
	}
	if m := goesOnRe.FindString(r.resumed.Stdout); m != "" {
		t.Logf("job %s: the survivors' flushes straddled a step boundary: %s", r.job, m)
	}
	if lost == nil {
		t.Errorf("job %s: no REPLAY line for stage 2, the lost stage:\n%s", r.job, r.resumed.Stdout)
	}
	// Every rank's restore: stage 2's from the persistent tier on n5.
	r.logRestores(t)
	if ev := r.restores(t)[2]; !slices.ContainsFunc(ev, func(e restoreEvent) bool { return e.event == "restore_persistent" }) {
		t.Errorf("job %s: stage 2's restore on its new node: %+v, want restore_persistent", r.job, ev)
	}
}
