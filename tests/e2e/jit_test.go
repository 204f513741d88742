//go:build e2e

package e2e

// End-to-end tests of the JIT flush (docs/ARCHITECTURE.md, "JIT flush"):
// reft-train snapshots only every 5 steps, a failure hits at step 13, and
// the surviving ranks, which hold the consistent state of their last
// finished step, save it at once, so the relaunch resumes there and not at
// step 10.

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// jitSaveRe is the client's line for a JIT save (reft-train prefixes it
// with "reft: rank N: ").
var jitSaveRe = regexp.MustCompile(`(?m)^reft: rank (\d+): JIT save of step (\d+) committed in ([0-9.]+) ms \((.*)\)$`)

// jitHeldRe is the client's line for a JIT flush that found the step it
// holds already committed (a save step that finished just before the
// notice): the flush is complete without a new save.
var jitHeldRe = regexp.MustCompile(`(?m)^reft: rank (\d+): JIT flush (?:after|at) .*: step (\d+) is already saved$`)

// jitSaves maps rank to the step its JIT save committed, from a step's
// output; or to the step its flush found already saved; or, for a flush
// that stepped back (stepBackRe), to the newer of its two steps.
func jitSaves(out string) map[int]int64 {
	got := map[int]int64{}
	for _, l := range []struct {
		re   *regexp.Regexp
		step int // the submatch of the step
	}{{jitHeldRe, 2}, {jitSaveRe, 2}, {stepBackRe, 3}} {
		for _, m := range l.re.FindAllStringSubmatch(out, -1) {
			r, _ := strconv.Atoi(m[1])
			s, _ := strconv.ParseInt(m[l.step], 10, 64)
			got[r] = s
		}
	}
	return got
}

// eventTime is an agent event's time.
func eventTime(e map[string]any) time.Time {
	at, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(e["time"]))
	return at
}

// TestJITNodeLoss: --reft=arc, DP=4 on n1-n4, --save-every 5, steps padded
// to 400 ms, reft-train --undo; n2 dies once rank 0 has logged step 13.
// The survivors' agents lose n2's agent and notify their ranks, which are
// blocked in the next step's gradient all-reduce holding the state of the
// step rank 0 logged (or the one after, if the kill landed late): they
// save it at once, and their saves carry n2's shard (rep@arc). A kill
// inside an all-reduce leaves some survivors a step ahead of the others
// (seen: flushes of 19 and 20, which share no step newer than the last
// periodic save): --undo's step-back makes each flush save the step before
// its own too, so they agree on the older at worst (TestStraddleNodeLoss
// holds them there on purpose). The relaunch with rank 1 on the spare n5
// resumes from the step rank 0 logged or later, not from step 10, with the
// bits of an uninterrupted run.
func TestJITNodeLoss(t *testing.T) {
	c := nodeLossCase{spec: "arc,spares=1", dp: 4, kill: []string{"n2"}, killAt: 13, steps: 30, every: 5,
		flags: []string{"--save-every", "5", "--min-step", "400ms", "--undo"}}
	r := nodeLoss(t, c)

	// The survivors' JIT saves, from their own lines.
	saves := jitSaves(r.first.Stderr)
	t.Logf("job %s: JIT saves by rank: %v", r.job, saves)
	var flushed int64 = -1
	for _, rank := range []int{0, 2, 3} {
		s, ok := saves[rank]
		if !ok {
			t.Errorf("surviving rank %d logged no JIT save, nor a flush that found its step saved:\n%s", rank, r.first.Stderr)
			continue
		}
		if s < r.lastLogged {
			t.Errorf("rank %d's JIT save is of step %d; rank 0 had logged step %d, so every rank held at least that", rank, s, r.lastLogged)
		}
		if flushed >= 0 && s != flushed {
			t.Logf("ranks flushed different steps (%d and %d): the kill landed inside an all-reduce", flushed, s)
		}
		flushed = max(flushed, s)
	}
	if _, ok := saves[1]; ok {
		t.Errorf("rank 1, on the killed node, logged a JIT save")
	}

	// The agents' account: a notice for n2 on every surviving node, and how
	// long after the kill it came.
	for _, n := range []string{"n1", "n3", "n4"} {
		evs := agentEvents(t, r.job, n)["peer_failure_notice"]
		if len(evs) != 1 || evs[0]["peer_node"] != "n2" {
			t.Errorf("%s: peer_failure_notice events %v, want one for n2", n, evs)
			continue
		}
		at := eventTime(evs[0])
		var commit time.Time
		for _, e := range agentEvents(t, r.job, n)["committed"] {
			if s, _ := e["step"].(float64); int64(s) == saves[slices.Index(r.nodes, n)] && eventTime(e).After(at) {
				commit = eventTime(e)
			}
		}
		msg := fmt.Sprintf("%s: notice %.2f s after the kill returned (cause %v)", n, at.Sub(r.killedAt).Seconds(), evs[0]["cause"])
		if !commit.IsZero() {
			msg += fmt.Sprintf(", JIT generation committed %.3f s after the notice", commit.Sub(at).Seconds())
		}
		t.Log(msg)
	}

	// The relaunch resumed from the flushed step: no work lost but the step
	// in progress.
	from, ok := checkResumed(t, r.job, r.resumed, r.what, r.lastLogged, r.newest, 0)
	if !ok {
		r.logRestores(t)
		t.FailNow()
	}
	if from <= 10 {
		t.Errorf("resumed from step %d: the JIT saves (%v) were not used", from, saves)
	}
	r.checkRestores(t, from, []string{"restore_peer", "decode"}, "")
}

// TestJITRankFailure: --reft=arc, DP=4, --save-every 5; rank 1 SIGKILLs
// itself at the start of step 13 (--fail-at 13:1). srun -K1 tears the
// step down with SIGTERM to the other ranks, blocked in step 13's
// all-reduce holding step 12: their signal flush saves step 12 before they
// die, and the relaunch on the same nodes resumes there, rank 1's shard
// coming from its ring predecessor's ARC copy.
func TestJITRankFailure(t *testing.T) {
	enableReft(t)
	flags := append(append(append([]string{}, trainFlags...), reftTrainFlags...),
		"--steps", "24", "--dp", "4", "--save-every", "5")
	ref := referenceRun(t, 4, flags)
	nodes := clusterNodes[:4]
	job := allocate(t, "--reft=arc", "-N4", "-w", strings.Join(nodes, ","))
	t.Cleanup(func() { cleanStores(t, job, nodes) })
	dir := sharedDir(t, alice)
	step := placedStep(job, "arc", writeHostfile(t, dir, "hostfile", nodes), nodes, nil, append(flags, "--fail-at", "13:1"))

	var first result
	for attempt := 1; ; attempt++ {
		first = run(t, 3*time.Minute, alice, step...)
		if !strings.Contains(first.Stdout+first.Stderr, mpiInitCrash) || attempt == 3 {
			break
		}
		t.Logf("job %s: a rank crashed in MPI_Init (OpenMPI flake under load); running the step again", job)
	}
	if first.Code == 0 || !strings.Contains(first.Stderr, "--fail-at 13:1: SIGKILL") {
		t.Fatalf("job %s: the first step did not fail at step 13:\n%s", job, first)
	}
	saves := jitSaves(first.Stderr)
	t.Logf("job %s: JIT saves by rank after rank 1's death: %v", job, saves)
	for _, rank := range []int{0, 2, 3} {
		if saves[rank] != 12 {
			t.Errorf("rank %d: JIT save of step %d, want 12:\n%s", rank, saves[rank], first.Stderr)
		}
	}
	for _, m := range jitSaveRe.FindAllStringSubmatch(first.Stderr, -1) {
		t.Logf("rank %s saved step %s in %s ms (%s)", m[1], m[2], m[3], m[4])
	}

	second := run(t, 3*time.Minute, alice, step...)
	if second.Code != 0 {
		t.Fatalf("job %s: the relaunch failed:\n%s", job, second)
	}
	if h := hashRe.FindStringSubmatch(second.Stdout); h == nil || h[1] != ref.hash {
		t.Fatalf("job %s: final-params-sha256 %v after the relaunch, uninterrupted %s:\n%s", job, h, ref.hash, second)
	}
	m := resumedRe.FindStringSubmatch(second.Stdout)
	if m == nil || m[1] != "12" {
		t.Fatalf("job %s: relaunch %v, want 'resumed from step 12' (the JIT flush), not 10 (--save-every 5):\n%s", job, m, second)
	}
	t.Logf("job %s: the relaunch resumed from step 12 and ended with the uninterrupted run's final-params-sha256", job)
}

// cleanStores removes job's node-local stores on nodes (they outlive the
// job by design; the nodes' tmpfs is small).
func cleanStores(t *testing.T, job string, nodes []string) {
	t.Helper()
	u := mustRun(t, time.Minute, alice, "id", "-u").Stdout
	run(t, time.Minute, alice, "srun", "--jobid="+job, "--overlap", "--reft=off", "-w", strings.Join(nodes, ","), "-N"+strconv.Itoa(len(nodes)),
		"--ntasks-per-node=1", "rm", "-rf", reftStoreRoot+"/"+strings.TrimSpace(u)+"/"+job)
}

// holdRe is reft-train's and torch_ddp.py's line for a rank held inside
// its update (--hold-in-update).
var holdRe = regexp.MustCompile(`(?m)^(?:reft-train|torch_ddp): hold-in-update: rank (\d+) holds in step (\d+)'s update before tensor (\d+)`)

// TestEvery0NodeLossInUpdate: issue 20's every=0 mode. --reft=arc,every=0,
// DP=4 on n1-n4 with a spare, reft-train --undo: no snapshot on the step
// path (the client turns each save into a progress heartbeat). Every rank
// stops inside step 8's optimizer update with two of its tensors applied
// (--hold-in-update 8:2, first step only: an update that a failure keeps
// from ending), and n2 dies then. Each survivor's agent reports n2 lost;
// its JIT flush interrupts the update, which is undone bit for bit, and
// saves step 7, carrying its ring successor's shard (rep@arc), so rank 1's
// replacement on n5 restores step 7 from the peers. One step (8) is lost
// and the run ends with the bits of an uninterrupted run.
func TestEvery0NodeLossInUpdate(t *testing.T) {
	const spec, held = "arc,every=0,spares=1", 8
	c := nodeLossCase{spec: spec, dp: 4, kill: []string{"n2"}, steps: 20, flags: []string{"--undo"},
		firstFlags: []string{"--hold-in-update", fmt.Sprintf("%d:2", held)},
		ready:      func(_, stderr string) bool { return len(holdRe.FindAllString(stderr, -1)) == 4 }}
	r := nodeLoss(t, c)

	for _, m := range holdRe.FindAllStringSubmatch(r.first.Stderr, -1) {
		if m[2] != strconv.Itoa(held) || m[3] != "2" {
			t.Errorf("rank %s held in step %s before tensor %s, want step %d before tensor 2", m[1], m[2], m[3], held)
		}
	}
	for _, want := range []string{"every=0: no snapshot on the step path", fmt.Sprintf("undo: step %d's update was interrupted", held)} {
		if !strings.Contains(r.first.Stdout, want) {
			t.Errorf("job %s: rank 0 did not log %q:\n%s", r.job, want, r.first.Stdout)
		}
	}
	if n := strings.Count(r.first.Stderr, "every=0 ("+spec+"): no snapshot on the step path"); n != 4 {
		t.Errorf("job %s: %d ranks said that Save keeps nothing under every=0, want 4 (once each):\n%s", r.job, n, r.first.Stderr)
	}
	if r.lastLogged != held-1 {
		t.Errorf("job %s: rank 0 logged step %d before the kill, want %d (the step before the held update)", r.job, r.lastLogged, held-1)
	}

	// The survivors flushed the undone state, step 7, and nothing was
	// committed before: every=0 kept no snapshot on the step path. The
	// first survivor to abort MPI kills the others wherever they are, so
	// one may die before its flush commits (CI, session 15): the restore
	// of step 7 then comes from the others' copies (each arc save carries
	// its ring successor's shard), which the resume below checks.
	saves := jitSaves(r.first.Stderr)
	t.Logf("job %s: JIT saves by rank: %v", r.job, saves)
	flushed := 0
	for _, rank := range []int{0, 2, 3} {
		s, ok := saves[rank]
		if ok && s != held-1 {
			t.Errorf("job %s: surviving rank %d's JIT save: step %d, want %d:\n%s", r.job, rank, s, held-1, r.first.Stderr)
		}
		if ok {
			flushed++
		}
	}
	if flushed == 0 {
		t.Errorf("job %s: no surviving rank logged a JIT save of step %d:\n%s", r.job, held-1, r.first.Stderr)
	}
	if _, ok := saves[1]; ok {
		t.Errorf("job %s: rank 1, on the killed node, logged a JIT save", r.job)
	}
	// Inside the update every survivor had passed step 8's all-reduce: no
	// JIT step-back is needed (docs/UNDO.md), and none is tried aloud.
	if strings.Contains(r.first.Stderr, "not stepped back") {
		t.Errorf("job %s: a survivor logged a step-back that was not needed:\n%s", r.job, r.first.Stderr)
	}
	for _, n := range []string{"n1", "n3", "n4"} {
		for _, e := range agentEvents(t, r.job, n)["committed"] {
			if s, _ := e["step"].(float64); int64(s) != held-1 {
				t.Errorf("job %s: %s's agent committed step %v; under every=0 only the JIT flush's step %d", r.job, n, e["step"], held-1)
			}
		}
	}

	// The relaunch resumed from the flushed step: one step lost.
	m := resumedRe.FindStringSubmatch(r.resumed.Stdout)
	if m == nil || m[1] != strconv.Itoa(held-1) {
		r.logRestores(t)
		t.Fatalf("job %s: relaunch %v, want 'resumed from step %d':\n%s", r.job, m, held-1, r.resumed)
	}
	t.Logf("job %s: resumed from step %d after n2 died inside step %d's update: 1 step lost, final hash as uninterrupted", r.job, held-1, held)
	r.checkRestores(t, held-1, []string{"restore_peer", "decode"}, "")
}

// torchJITSaveRe is the Python client's line for a JIT save (without the
// rank: the Session logs it as is).
var torchJITSaveRe = regexp.MustCompile(`(?m)^reft: JIT save of step (\d+) committed in [0-9.]+ ms \((.*)\)$`)

// TestEvery0NodeLossInUpdateTorch: TestEvery0NodeLossInUpdate with the
// PyTorch trainer. --reft=arc,every=0, DP=4 (examples/torch_ddp.py, DDP over
// gloo, AdamW, Checkpointer(undo=True) through --undo) on n1-n4 with a
// spare: Checkpointer.save sends heartbeats only. Every rank stops inside
// step 8's optimizer.step() with two parameter tensors applied
// (--hold-in-update 8:2, reft.undo.UpdateUndo.hold, first step only), and
// n2 dies then. Each survivor's JIT flush (the agent's notice, or srun's
// SIGTERM, whichever comes first) interrupts the step, which undoes the two
// tensors bit for bit, and saves step 7 with its ring successor's shard;
// rank 1's replacement on n5 restores step 7 from the peers. One step (8)
// is lost, and the final parameters are an uninterrupted run's.
func TestEvery0NodeLossInUpdateTorch(t *testing.T) {
	const spec, held = "arc,every=0,spares=1", 8
	c := nodeLossCase{spec: spec, dp: 4, kill: []string{"n2"}, steps: 20, torch: true, flags: []string{"--undo"},
		firstFlags: []string{"--hold-in-update", fmt.Sprintf("%d:2", held)},
		ready:      func(_, stderr string) bool { return len(holdRe.FindAllString(stderr, -1)) == 4 }}
	r := nodeLoss(t, c)

	ranks := map[string]bool{}
	for _, m := range holdRe.FindAllStringSubmatch(r.first.Stderr, -1) {
		ranks[m[1]] = true
		if m[2] != strconv.Itoa(held) || m[3] != "2" {
			t.Errorf("rank %s held in step %s before tensor %s, want step %d before tensor 2", m[1], m[2], m[3], held)
		}
	}
	if len(ranks) != 4 {
		t.Errorf("job %s: ranks %v held, want 0-3 once each:\n%s", r.job, ranks, r.first.Stderr)
	}
	if n := strings.Count(r.first.Stderr, "every=0 ("+spec+"): no snapshot on the step path"); n != 4 {
		t.Errorf("job %s: %d ranks said that save() keeps nothing under every=0, want 4 (once each):\n%s", r.job, n, r.first.Stderr)
	}
	// The three survivors undid the two applied tensors (the Checkpointer's
	// warning); rank 1 died held.
	if n := strings.Count(r.first.Stderr, "undid the update of 2 parameter tensors"); n != 3 {
		t.Errorf("job %s: %d ranks undid step %d's two applied tensors, want 3 (the survivors):\n%s", r.job, n, held, r.first.Stderr)
	}
	if r.lastLogged != held-1 {
		t.Errorf("job %s: rank 0 logged step %d before the kill, want %d (the step before the held update)", r.job, r.lastLogged, held-1)
	}

	// One JIT save per survivor, each of step 7 (the Python client's lines
	// carry no rank: the agents' events below say whose).
	saves := torchJITSaveRe.FindAllStringSubmatch(r.first.Stderr, -1)
	for _, m := range saves {
		t.Logf("job %s: JIT save of step %s (%s)", r.job, m[1], m[2])
		if m[1] != strconv.Itoa(held-1) {
			t.Errorf("job %s: a JIT save of step %s, want only %d", r.job, m[1], held-1)
		}
	}
	if len(saves) != 3 {
		t.Errorf("job %s: %d JIT saves, want 3 (one per survivor):\n%s", r.job, len(saves), r.first.Stderr)
	}
	// Every survivor's agent committed its rank's step 7 and nothing else:
	// every=0 kept no snapshot on the step path.
	for rank, n := range r.nodes {
		if n == "n2" {
			continue
		}
		own := false
		for _, e := range agentEvents(t, r.job, n)["committed"] {
			if s, _ := e["step"].(float64); int64(s) != held-1 {
				t.Errorf("job %s: %s's agent committed step %v; under every=0 only the JIT flush's step %d", r.job, n, e["step"], held-1)
			}
			if rr, ok := e["rank"].(float64); ok && int(rr) == rank {
				own = true
			}
		}
		if !own {
			t.Errorf("job %s: %s's agent logged no commit of rank %d's step %d", r.job, n, rank, held-1)
		}
	}

	// The relaunch resumed from the flushed step: one step lost (nodeLoss
	// checked the final hash and the losses against the uninterrupted run).
	m := resumedRe.FindStringSubmatch(r.resumed.Stdout)
	if m == nil || m[1] != strconv.Itoa(held-1) {
		r.logRestores(t)
		t.Fatalf("job %s: relaunch %v, want 'resumed from step %d':\n%s", r.job, m, held-1, r.resumed)
	}
	if l := lossRe.FindStringSubmatch(r.resumed.Stdout); l == nil || l[1] != strconv.Itoa(held) {
		t.Errorf("job %s: the relaunch's first step is %v, want %d", r.job, l, held)
	}
	if strings.Contains(r.resumed.Stderr, "hold-in-update: rank") {
		t.Errorf("job %s: the relaunch held (it has no --hold-in-update):\n%s", r.job, r.resumed.Stderr)
	}
	t.Logf("job %s: resumed from step %d after n2 died inside step %d's optimizer.step(): 1 step lost, final hash as uninterrupted", r.job, held-1, held)
	r.checkRestores(t, held-1, []string{"restore_peer", "decode"}, "")
}

// straddleRe is reft-train's line for a rank held after the gradient
// all-reduce (--hold-before-update) or one that finished the held step.
var straddleRe = regexp.MustCompile(`(?m)^reft-train: hold-before-update: rank (\d+) (holds after|finished) step (\d+)`)

// stepBackRe is the client's line for a JIT flush that stepped back.
var stepBackRe = regexp.MustCompile(`(?m)^reft: rank (\d+): JIT save of steps (\d+) and (\d+) \(step \d+'s update undone, saved, redone\)`)

// TestStraddleNodeLoss: survivors on either side of a step boundary
// (docs/UNDO.md). --reft=arc,every=0, DP=4 on n1-n4 with a spare,
// reft-train --undo. Ranks 2 and 3 stay after step 8's gradient all-reduce,
// before their update (--hold-before-update 8:2,3, first step only: ranks
// still blocked in an all-reduce that the others finished), holding step
// 7; ranks 0 and 1 finish step 8; n2 (rank 1) dies then. Without the
// step-back, rank 0 would flush 8 (shards 0 and 1), ranks 2 and 3 step 7
// (shards 2, 3 and 0): neither step has every shard, and the relaunch
// would start over. With it, rank 0 saves 7 and 8, ranks 2 and 3 save 6
// and 7, and the relaunch (rank 1 on the spare) resumes from 7 with the
// bits of an uninterrupted run.
func TestStraddleNodeLoss(t *testing.T) {
	const spec, held = "arc,every=0,spares=1", 8
	c := nodeLossCase{spec: spec, dp: 4, kill: []string{"n2"}, steps: 20, flags: []string{"--undo"},
		firstFlags: []string{"--hold-before-update", fmt.Sprintf("%d:2,3", held)},
		ready:      func(_, stderr string) bool { return len(straddleRe.FindAllString(stderr, -1)) == 4 }}
	r := nodeLoss(t, c)

	for _, m := range straddleRe.FindAllStringSubmatch(r.first.Stderr, -1) {
		want := "finished"
		if m[1] == "2" || m[1] == "3" {
			want = "holds after"
		}
		if m[2] != want || m[3] != strconv.Itoa(held) {
			t.Errorf("job %s: rank %s %s step %s, want %q step %d", r.job, m[1], m[2], m[3], want, held)
		}
	}
	backs := map[string][2]string{}
	for _, m := range stepBackRe.FindAllStringSubmatch(r.first.Stderr, -1) {
		backs[m[1]] = [2]string{m[2], m[3]}
	}
	t.Logf("job %s: JIT step-back saves by rank: %v", r.job, backs)
	for rank, want := range map[string][2]string{"0": {"7", "8"}, "2": {"6", "7"}, "3": {"6", "7"}} {
		if backs[rank] != want {
			t.Errorf("job %s: rank %s's JIT flush saved steps %v, want %v:\n%s", r.job, rank, backs[rank], want, r.first.Stderr)
		}
	}
	if _, ok := backs["1"]; ok {
		t.Errorf("job %s: rank 1, on the killed node, logged a JIT save", r.job)
	}
	m := resumedRe.FindStringSubmatch(r.resumed.Stdout)
	if m == nil || m[1] != strconv.Itoa(held-1) {
		r.logRestores(t)
		t.Fatalf("job %s: relaunch %v, want 'resumed from step %d':\n%s", r.job, m, held-1, r.resumed)
	}
	t.Logf("job %s: resumed from step %d after n2 died with the survivors on either side of step %d: 1 step lost, final hash as uninterrupted", r.job, held-1, held)
	r.checkRestores(t, held-1, []string{"restore_peer", "decode"}, "")
}
