//go:build e2e

package e2e

// End-to-end tests of reft run (issue 7): a batch job runs reft-train under
// `reft run`; a rank, or a node's agent, dies during training; reft run
// classifies the failure, relaunches the step on the same nodes, the ranks
// restore from their nodes' stores, and the job completes with the bits of
// an uninterrupted run. The recovery log, the job's Comment (through sacct)
// and `reft log` tell the story.

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/reft-hpc/reft/launcher/recoverylog"
)

// recoveryEvent is the part of a recovery.jsonl line the tests read.
type recoveryEvent struct {
	Time        time.Time `json:"time"`
	Job         string    `json:"job"`
	Step        string    `json:"step"`
	Relaunch    int       `json:"relaunch"`
	Restart     int       `json:"restart"`
	Node        string    `json:"node"`
	Event       string    `json:"event"`
	Spec        string    `json:"spec"`
	Generation  int64     `json:"generation"`
	Bytes       int64     `json:"bytes"`
	DurationS   float64   `json:"duration_s"`
	Cause       string    `json:"cause"`
	Kind        string    `json:"kind"`
	Nodes       []string  `json:"nodes"`
	Ranks       []int     `json:"ranks"`
	Replacement string    `json:"replacement"`
	LostSteps   *int64    `json:"lost_steps"`
	ExitCode    *int      `json:"exit_code"`
	DetectedBy  string    `json:"detected_by"`
	DetectionS  *float64  `json:"detection_s"`

	Phases *recoverylog.Phases `json:"phases"`
}

// agentsFailures lists the failure_detected events the job's agents logged
// (agent/detect: the coordinator's, one per failure), from every node's log.
func agentsFailures(t *testing.T, job string, nodes ...string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, n := range nodes {
		out = append(out, agentEvents(t, job, n)["failure_detected"]...)
	}
	return out
}

// recoveryEvents is job's recovery log without its straggler reports:
// the failure and recovery story the tests check event by event. A
// straggler report is an observation that nothing acts on, and on this
// 2-core machine an uneven rank is common enough to land anywhere in the
// story (a CI run: TestReftRunNodeLossSpareTorch's PyTorch ranks); each
// dropped one is logged. TestReftStatusStraggler reads them with
// allRecoveryEvents.
func recoveryEvents(t *testing.T, job string) []recoveryEvent {
	t.Helper()
	var out []recoveryEvent
	for _, e := range allRecoveryEvents(t, job) {
		if e.Event == "straggler" {
			t.Logf("job %s: a straggler report, not part of the story under test: %s", job, e.Cause)
			continue
		}
		out = append(out, e)
	}
	return out
}

// allRecoveryEvents is job's recovery log, every line checked for the
// common fields.
func allRecoveryEvents(t *testing.T, job string) []recoveryEvent {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(clusterDir, "log", "reft", job, "recovery.jsonl"))
	if err != nil {
		t.Fatalf("recovery log of job %s: %v", job, err)
	}
	var out []recoveryEvent
	for _, l := range lines(string(b)) {
		var e recoveryEvent
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("recovery log line %q: %v", l, err)
		}
		for _, f := range []string{`"job"`, `"step"`, `"restart"`, `"node"`, `"event"`, `"spec"`, `"generation"`, `"bytes"`, `"duration_s"`, `"cause"`} {
			if !strings.Contains(l, f+":") {
				t.Errorf("recovery log line without %s: %s", f, l)
			}
		}
		out = append(out, e)
	}
	return out
}

func eventNames(ev []recoveryEvent) []string {
	var out []string
	for _, e := range ev {
		out = append(out, e.Event)
	}
	return out
}

func eventsNamed(ev []recoveryEvent, name string) []recoveryEvent {
	var out []recoveryEvent
	for _, e := range ev {
		if e.Event == name {
			out = append(out, e)
		}
	}
	return out
}

// reftRunJob is a batch job (four nodes, --reft=arc) that runs reft-train
// under reft run, then removes its node-local stores (they outlive jobs by
// design; the nodes' tmpfs is small).
func reftRunJob(t *testing.T, trainArgs ...string) (job, dir string) {
	t.Helper()
	return reftRunJobWith(t, "-N4 --reft=arc --requeue", trainArgs...)
}

// reftRunJobWith is reftRunJob with other #SBATCH options.
func reftRunJobWith(t *testing.T, sbatchOpts string, trainArgs ...string) (job, dir string) {
	t.Helper()
	return reftRunCmd(t, sbatchOpts, bin("reft-train")+" "+strings.Join(trainArgs, " "))
}

// reftRunCmd is a batch job with sbatchOpts that runs command (a shell
// line) under reft run, then removes its node-local stores.
func reftRunCmd(t *testing.T, sbatchOpts, command string) (job, dir string) {
	t.Helper()
	u, err := user.Lookup(alice)
	if err != nil {
		t.Fatal(err)
	}
	dir = sharedDir(t, alice)
	conf := filepath.Join(clusterDir, "etc", "reft-e2e.toml")
	// The cleanup asks for the allocation's current node count: it shrinks
	// when a node of a --no-kill job is lost. A requeued job (reft run's
	// exit 5) keeps its stores: its next run restores from them.
	script := fmt.Sprintf(`#!/bin/bash
#SBATCH %s
%s run --config %s --backoff 500ms -- %s
rc=$?
echo "reft run exit $rc"
[ $rc = 5 ] || srun --reft=off -N "$(squeue -h -j $SLURM_JOB_ID -o %%D)" --ntasks-per-node=1 rm -rf %s
exit $rc
`, sbatchOpts, bin("reft"), conf, command, filepath.Join(reftStoreRoot, u.Uid, "$SLURM_JOB_ID"))
	return sbatchIn(t, dir, script), dir
}

// reference trains without reft in its own job (four ranks on four nodes):
// the bits to match.
func reference(t *testing.T, flags []string) string {
	t.Helper()
	return referenceRun(t, 4, flags).hash
}

// jobComment waits for accounting to show the job's Comment.
func jobComment(t *testing.T, job string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		// A resized job has two records (RESIZING, then the rest): the last
		// one with a comment.
		r := run(t, 30*time.Second, alice, "sacct", "-n", "-X", "-P", "-j", job, "-o", "JobID,State,Comment%120")
		ls := lines(r.Stdout)
		for i := len(ls) - 1; i >= 0; i-- {
			if f := strings.SplitN(ls[i], "|", 3); len(f) == 3 && f[2] != "" {
				return f[2]
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("sacct shows no Comment for job %s:\n%s", job, r)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// mpiInitCrash is how reft-train's output shows a rank that crashed in
// MPI_Init (PC 0 in cgo). OpenMPI does that about once in 25 launches on
// this host when its two cores are busy, with or without reft; reft run
// handles it as a rank failure, which would add events to the story under
// test.
const mpiInitCrash = "_Cfunc_MPI_Init"

// mpiStartSegv is how Open MPI 5's start-up crash shows on the trixie lane:
// UCX's handler (Open MPI loads UCX's libraries) reports a rank's SIGSEGV at
// 0xe0 in ob1's match callback, a peer's first message come before MPI_Init
// added MPI_COMM_WORLD, because the PMIx barrier fences under srun do not
// hold (docs/BENCHMARKS.md, test lanes: about one launch in four under
// load; the setting that avoids it breaks a relaunch after a shrink).
const mpiStartSegv = "Caught signal 11 (Segmentation fault: address not mapped to object at address 0xe0)"

// mpiCrashed reports whether out shows either lane's Open MPI start-up
// crash.
func mpiCrashed(out string) bool {
	return strings.Contains(out, mpiInitCrash) || strings.Contains(out, mpiStartSegv)
}

// untilNoInitCrash runs scenario (which submits a job and returns once it
// has ended) again when a rank crashed in MPI_Init, at most three times.
func untilNoInitCrash(t *testing.T, scenario func() (job, dir string)) (job, dir string) {
	t.Helper()
	for i := 1; ; i++ {
		job, dir = scenario()
		if out := jobOutput(t, dir, job); !mpiCrashed(out) || i == 3 {
			return job, dir
		}
		t.Logf("job %s: a rank crashed in MPI_Init (an OpenMPI flake under load, not the failure under test); running the scenario again", job)
	}
}

// checkResume checks what both tests share: the job completed, its bits
// match, and the recovery log and the Comment describe one failure of kind
// on node, a relaunch on the same nodes and every rank's local restore.
func checkResume(t *testing.T, job, dir, refHash, kind, node string) []recoveryEvent {
	t.Helper()
	if st := waitJob(t, job, 5*time.Minute); st != "COMPLETED" {
		t.Fatalf("job %s ended %s:\n%s", job, st, jobOutput(t, dir, job))
	}
	out := jobOutput(t, dir, job)
	if !strings.Contains(out, "reft run exit 0\n") {
		t.Fatalf("reft run did not exit 0:\n%s", out)
	}
	sameHash(t, out, refHash)
	if n := len(resumedRe.FindAllString(out, -1)); n != 1 {
		t.Errorf("%d 'resumed from step' lines, want 1:\n%s", n, out)
	}

	ev := recoveryEvents(t, job)
	// Under arc each rank snapshots only its shard (and its neighbour's
	// ARC copy), so every rank's restore also reads the other shards from
	// its group's agents: restore_peer, each node restoring the same step.
	want := []string{"step_launched", "failure_detected", "step_relaunched",
		"restore_peer", "restore_peer", "restore_peer", "restore_peer", "resumed", "completed"}
	if !slices.Equal(eventNames(ev), want) {
		t.Fatalf("recovery events %v, want %v\n%s", eventNames(ev), want, out)
	}
	nodes := []string{"n1", "n2", "n3", "n4"}
	launched, failed, relaunched, resumed := ev[0], ev[1], ev[2], ev[7]
	if !slices.Equal(launched.Nodes, nodes) || launched.Spec != "arc" || launched.Job != job || launched.Step != job+".0" {
		t.Errorf("step_launched %+v", launched)
	}
	if failed.Kind != kind || failed.Node != node || failed.Step != launched.Step || failed.Generation < 1 {
		t.Errorf("failure_detected %+v, want kind %s on %s", failed, kind, node)
	}
	if !slices.Equal(relaunched.Nodes, nodes) || relaunched.Relaunch != 1 || relaunched.Step == "" || relaunched.Step == launched.Step {
		t.Errorf("step_relaunched %+v: want the same nodes in a new step", relaunched)
	}
	var restored []int
	for i, e := range ev[3:7] {
		if e.Node != nodes[i] || e.Generation != resumed.Generation || e.Step != relaunched.Step || e.Bytes <= 0 {
			t.Errorf("restore_local %+v", e)
		}
		restored = append(restored, e.Ranks...)
	}
	if slices.Sort(restored); !slices.Equal(restored, []int{0, 1, 2, 3}) {
		t.Errorf("restored ranks %v, want every rank", restored)
	}
	// At most the step in flight when the failure hit is redone: from
	// reft run's account when an agent told it the committed step at the
	// failure, else from the trainer's own log.
	var lost int64
	if resumed.LostSteps != nil {
		lost = *resumed.LostSteps
		if lost > 1 || resumed.Generation != failed.Generation-lost {
			t.Errorf("resumed %+v after a failure with step %d committed", resumed, failed.Generation)
		}
	} else {
		end := len(out)
		if i := resumedRe.FindStringIndex(out); i != nil {
			end = i[0]
		}
		before := lossRe.FindAllStringSubmatch(out[:end], -1)
		if len(before) == 0 {
			t.Fatalf("no step logged before the failure:\n%s", out)
		}
		last, _ := strconv.ParseInt(before[len(before)-1][1], 10, 64)
		// A JIT flush may save a step newer than the last one logged.
		if lost = max(0, last-resumed.Generation); lost > 1 {
			t.Errorf("the trainer finished step %d before the failure and resumed from step %d: %d steps lost, want at most 1", last, resumed.Generation, lost)
		}
		t.Logf("reft run did not know the committed step at the failure (%s); lost work from the trainer's log", failed.Cause)
	}
	if m := regexp.MustCompile(`(?m)^resumed from step (\d+)$`).FindStringSubmatch(out); m == nil || m[1] != strconv.FormatInt(resumed.Generation, 10) {
		t.Errorf("the trainer says %v, the agents' restores say step %d", m, resumed.Generation)
	}
	t.Logf("job %s: %s failure on %s detected with step %d committed; relaunched %.2f s later; every rank restored step %d %.2f s after the failure (%d step(s) lost)",
		job, kind, node, failed.Generation, relaunched.DurationS, resumed.Generation, resumed.DurationS, lost)

	// The Comment, as sacct shows it.
	desc := map[string]string{"rank": `rank \d+ on ` + node, "agent": "agent on " + node}[kind]
	commentRe := regexp.MustCompile(`^reft: 1 failure \(` + desc + `\), resumed from step ` + strconv.FormatInt(resumed.Generation, 10) +
		` in \d+\.\d s, lost ([01] steps?|steps unknown)$`)
	if c := jobComment(t, job); !commentRe.MatchString(c) {
		t.Errorf("Comment %q does not match %s", c, commentRe)
	} else {
		t.Logf("sacct Comment: %s", c)
	}

	// reft log: the timeline joins sacct's steps with the events.
	conf := filepath.Join(clusterDir, "etc", "reft-e2e.toml")
	lg := mustRun(t, time.Minute, alice, bin("reft"), "log", "--config", conf, job)
	for _, want := range []string{
		"job " + job + ": COMPLETED",
		"slurm  step_start          step " + launched.Step + " (reft-train) started on n[1-4] (4 nodes)",
		"reft   failure_detected    failure: ",
		"reft   step_relaunched     relaunch 1 on n1,n2,n3,n4",
		"reft   resumed             resumed from step " + strconv.FormatInt(resumed.Generation, 10),
		"slurm  step_end            step " + relaunched.Step + " ended COMPLETED",
		"reft   completed           the step completed after 1 relaunch(es)",
	} {
		if !strings.Contains(lg.Stdout, want) {
			t.Errorf("reft log lacks %q:\n%s", want, lg.Stdout)
		}
	}
	if strings.Contains(lg.Stdout, "reft-probe") || strings.Contains(lg.Stdout, ".extern") {
		t.Errorf("reft log shows probe or extern steps:\n%s", lg.Stdout)
	}
	js := mustRun(t, time.Minute, alice, bin("reft"), "log", "--json", "--config", conf, job)
	var rep struct {
		Job      string `json:"job"`
		State    string `json:"state"`
		Comment  string `json:"comment"`
		Timeline []struct {
			Source   string          `json:"source"`
			Event    string          `json:"event"`
			Step     string          `json:"step"`
			Sacct    json.RawMessage `json:"sacct"`
			Recovery json.RawMessage `json:"recovery"`
		} `json:"timeline"`
	}
	if err := json.Unmarshal([]byte(js.Stdout), &rep); err != nil {
		t.Fatalf("reft log --json: %v\n%s", err, js.Stdout)
	}
	var slurmN, reftN int
	for _, e := range rep.Timeline {
		switch e.Source {
		case "slurm":
			slurmN++
		case "reft":
			reftN++
		}
	}
	if rep.Job != job || rep.State != "COMPLETED" || !commentRe.MatchString(rep.Comment) || reftN != len(ev) || slurmN < 6 {
		t.Errorf("reft log --json: job %s state %s comment %q, %d reft and %d slurm entries (want %d reft)",
			rep.Job, rep.State, rep.Comment, reftN, slurmN, len(ev))
	}
	return ev
}

// TestReftRunRankFailure: rank 2 SIGKILLs itself at step 7; reft run
// relaunches on the same nodes and every rank restores locally.
func TestReftRunRankFailure(t *testing.T) {
	enableReft(t)
	flags := append(append([]string{}, trainFlags...), reftTrainFlags...)
	refHash := reference(t, flags)
	job, dir := untilNoInitCrash(t, func() (string, string) {
		job, dir := reftRunJob(t, append(flags, "--dp", "4", "--fail-at", "7:2")...)
		waitJob(t, job, 5*time.Minute)
		return job, dir
	})
	ev := checkResume(t, job, dir, refHash, "rank", "n3")
	if f := ev[1]; !slices.Equal(f.Ranks, []int{2}) || f.Cause != "task 2 on n3: Killed" {
		t.Errorf("failure_detected %+v: want rank 2 killed on n3", f)
	}
}

// TestReftRunAgentKill: the agent of n2 is SIGKILLed during training; its
// rank's next commit fails, the step fails; the probe finds no agent on
// n2, reft run relaunches on the same nodes, the step starts a new agent
// there, which re-indexes the node's store, and every rank restores
// locally.
func TestReftRunAgentKill(t *testing.T) {
	enableReft(t)
	flags := append(append([]string{}, trainFlags...), reftTrainFlags...)
	flags = append(flags, "--steps", "150")
	refHash := reference(t, flags)
	job, dir := untilNoInitCrash(t, func() (string, string) {
		job, dir := reftRunJob(t, append(flags, "--dp", "4")...)

		// Training has begun: the agent of n2 (its pid in the job's run dir,
		// read on the node itself) dies.
		out := filepath.Join(dir, "slurm-"+job+".out")
		deadline := time.Now().Add(2 * time.Minute)
		for {
			b, _ := os.ReadFile(out)
			if strings.Contains(string(b), "\nstep 10 loss") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("job %s did not reach step 10:\n%s", job, b)
			}
			time.Sleep(100 * time.Millisecond)
		}
		lock := filepath.Join(reftRunDir, job, "agent.lock")
		r := mustRun(t, time.Minute, alice, "srun", "--jobid="+job, "--overlap", "--reft=off", "-w", "n2", "-N1", "-n1", "cat", lock)
		pid, err := strconv.Atoi(strings.TrimSpace(r.Stdout))
		if err != nil || !slices.Contains(agentPIDs(t, job)["n2"], pid) {
			t.Fatalf("%s on n2 holds %q, not the pid of n2's agent %v", lock, r.Stdout, agentPIDs(t, job))
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		t.Logf("killed the agent of n2 (pid %d)", pid)
		waitJob(t, job, 5*time.Minute)
		return job, dir
	})
	ev := checkResume(t, job, dir, refHash, "agent", "n2")
	// The agents' detector sees the lost agent (n2's slurmd answers) and
	// one coordinator publishes it; srun may see the rank's exit first, so
	// either verdict may come first, and both say agent.
	f := ev[1]
	switch f.DetectedBy {
	case "agents":
		if f.DetectionS == nil || !strings.Contains(f.Cause, "the agents' failure detector") {
			t.Errorf("failure_detected %+v: the agents' verdict without its latency or cause", f)
		}
	case "srun":
		if !strings.Contains(f.Cause, "n2: no agent answers on "+filepath.Join(reftRunDir, job, "agent.sock")) {
			t.Errorf("failure_detected cause %q", f.Cause)
		}
	default:
		t.Errorf("failure_detected %+v: detected_by %q", f, f.DetectedBy)
	}
	af := agentsFailures(t, job, "n1", "n2", "n3", "n4")
	switch {
	case len(af) == 0 && f.DetectedBy == "srun":
		// The detector watches a refusing agent over its window (it may be
		// restarting); here srun reported the rank first, and the
		// relaunch's new agent answered inside the window.
		t.Logf("the agents published no verdict: srun reported n2's rank first and n2's new agent answered within the detector's window")
	case len(af) != 1 || af[0]["failed_node"] != "n2" || af[0]["class"] != "agent":
		t.Errorf("the agents logged %v, want at most one verdict, an agent failure of n2", af)
	default:
		t.Logf("the agents' verdict: agent failure of n2 published by %v, %.0f ms after its last beat; reft run's event came from %s",
			af[0]["coordinator"], af[0]["latency_s"].(float64)*1000, f.DetectedBy)
	}
	// n2's relaunched rank was served by a new agent.
	if started := agentEvents(t, job, "n2")["agent_started"]; len(started) != 2 {
		t.Errorf("n2's agent started %d times, want 2 (the first and the relaunch's)", len(started))
	}
}

// jobProcesses lists the processes (other than Slurm's own daemons) whose
// environment names job: the step's tasks, srun, reft run.
func jobProcesses(job string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil || !slices.Contains(strings.Split(string(env), "\x00"), "SLURM_JOB_ID="+job) {
			continue
		}
		stat, _ := os.ReadFile("/proc/" + e.Name() + "/stat")
		if strings.Contains(string(stat), ") Z ") {
			continue
		}
		cmd, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		out = append(out, e.Name()+" "+strings.ReplaceAll(string(cmd), "\x00", " "))
	}
	return out
}

// TestReftRunScancel: scancel during training ends reft run (it records
// that it was stopped) and leaves no process of the job behind.
func TestReftRunScancel(t *testing.T) {
	enableReft(t)
	flags := append(append([]string{}, trainFlags...), reftTrainFlags...)
	job, dir := untilNoInitCrash(t, func() (string, string) {
		job, dir := reftRunJob(t, append(flags, "--dp", "4", "--steps", "100000")...)
		out := filepath.Join(dir, "slurm-"+job+".out")
		deadline := time.Now().Add(2 * time.Minute)
		for {
			b, _ := os.ReadFile(out)
			if strings.Contains(string(b), "\nstep 5 loss") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("job %s did not reach step 5:\n%s", job, b)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if len(jobProcesses(job)) == 0 {
			t.Fatal("found no process of the running job: the check below would prove nothing")
		}
		mustRun(t, time.Minute, alice, "scancel", job)
		if st := waitJob(t, job, 2*time.Minute); !strings.HasPrefix(st, "CANCELLED") {
			t.Fatalf("job %s ended %s", job, st)
		}
		// The script's cleanup did not run: remove the job's stores here.
		u, _ := user.Lookup(alice)
		run(t, time.Minute, alice, "srun", "-N4", "--ntasks-per-node=1", "-w", "n[1-4]", "rm", "-rf", filepath.Join(reftStoreRoot, u.Uid, job))
		return job, dir
	})
	var left []string
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if left = jobProcesses(job); len(left) == 0 {
			break
		}
	}
	if len(left) > 0 {
		t.Errorf("processes of job %s left after scancel:\n%s", job, strings.Join(left, "\n"))
	}
	ev := recoveryEvents(t, job)
	last := ev[len(ev)-1]
	if last.Event != "stopped" || last.Cause != "received terminated" || last.ExitCode == nil || *last.ExitCode != 143 {
		t.Errorf("last recovery event %+v, want stopped by SIGTERM; all: %v\n%s", last, eventNames(ev), jobOutput(t, dir, job))
	}
	if n := len(eventsNamed(ev, "failure_detected")) + len(eventsNamed(ev, "step_relaunched")); n != 0 {
		t.Errorf("reft run treated the cancel as a failure: %v", eventNames(ev))
	}
}

// waitOutput waits until a batch job's output holds want.
func waitOutput(t *testing.T, dir, job, want string) {
	t.Helper()
	out := filepath.Join(dir, "slurm-"+job+".out")
	deadline := time.Now().Add(2 * time.Minute)
	for {
		b, _ := os.ReadFile(out)
		if strings.Contains(string(b), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s did not print %q:\n%s", job, want, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitJobEnd is waitJob for jobs whose allocation may shrink: sacct then
// lists the job twice (RESIZING, then the rest of its run), so the state is
// scontrol's while it knows the job, else sacct's last record.
func waitJobEnd(t *testing.T, job string, timeout time.Duration) string {
	t.Helper()
	stateRe := regexp.MustCompile(`(?:^|\s)JobState=(\S+)`)
	deadline := time.Now().Add(timeout)
	for {
		st := ""
		if m := stateRe.FindStringSubmatch(run(t, 30*time.Second, root, "scontrol", "-o", "show", "job", job).Stdout); m != nil {
			st = m[1]
		} else if l := lines(run(t, 30*time.Second, root, "sacct", "-n", "-X", "-P", "-j", job, "-o", "State").Stdout); len(l) > 0 {
			st = strings.Fields(l[len(l)-1])[0]
		}
		if finalStates[st] {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s still %q after %v\n%s", job, st, timeout, jobDiag(t, job))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// completedSame checks that a reft run job completed (reft run exit 0)
// with the uninterrupted run's final parameters, and returns its output.
func completedSame(t *testing.T, dir, job, refHash string) string {
	t.Helper()
	out := jobOutput(t, dir, job)
	if st := waitJobEnd(t, job, time.Minute); st != "COMPLETED" || !strings.Contains(out, "reft run exit 0\n") {
		t.Fatalf("job %s ended %s:\n%s", job, st, out)
	}
	sameHash(t, out, refHash)
	return out
}

// sameHash checks that the output printed one final-params-sha256, the
// uninterrupted run's.
func sameHash(t *testing.T, out, refHash string) {
	t.Helper()
	if h := hashRe.FindAllStringSubmatch(out, -1); len(h) != 1 || h[0][1] != refHash {
		t.Fatalf("final-params-sha256 %v, uninterrupted %s:\n%s", h, refHash, out)
	}
}

// jobDiag is what a hung job shows: slurmctld's record, its steps, the
// nodes, and the job's output (from its StdOut path).
func jobDiag(t *testing.T, job string) string {
	t.Helper()
	var b strings.Builder
	sj := run(t, 30*time.Second, root, "scontrol", "show", "job", job).Stdout
	b.WriteString(sj)
	b.WriteString(run(t, 30*time.Second, root, "squeue", "-s", "-j", job, "-o", "%i %T %N %M").Stdout)
	b.WriteString(run(t, 30*time.Second, root, "sinfo", "-N", "-o", "%N %T %E").Stdout)
	if m := regexp.MustCompile(`StdOut=(\S+)`).FindStringSubmatch(sj); m != nil {
		if out, err := os.ReadFile(m[1]); err == nil {
			b.WriteString("output:\n")
			b.Write(out)
		}
	}
	b.WriteString(stepdThreads(job))
	return b.String()
}

// stepdThreads describes every slurmstepd of job (all nodes share this
// kernel): each thread's state, wait channel, system call (number, then
// the user stack and program counter) and kernel stack. A job stuck
// COMPLETING has a step daemon that does not end; this says where it
// waits.
func stepdThreads(job string) string {
	var b strings.Builder
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		cmd, err := os.ReadFile(p + "/cmdline")
		if err != nil || !strings.HasPrefix(string(cmd), "slurmstepd: ["+job+".") {
			continue
		}
		fmt.Fprintf(&b, "%s: %s\n", filepath.Base(p), strings.TrimRight(strings.ReplaceAll(string(cmd), "\x00", " "), " "))
		tasks, _ := filepath.Glob(p + "/task/[0-9]*")
		for _, tk := range tasks {
			read := func(f string) string { x, _ := os.ReadFile(tk + "/" + f); return strings.TrimSpace(string(x)) }
			stat := read("stat")
			if i := strings.LastIndexByte(stat, ')'); i >= 0 && i+3 <= len(stat) {
				stat = stat[i+2 : i+3]
			}
			fmt.Fprintf(&b, "  thread %s %s state %s wchan %s syscall %s\n", filepath.Base(tk), read("comm"), stat, read("wchan"), read("syscall"))
			if ks := read("stack"); ks != "" {
				b.WriteString("    " + strings.ReplaceAll(ks, "\n", "\n    ") + "\n")
			}
		}
	}
	if b.Len() == 0 {
		return "no slurmstepd of job " + job + " is running\n"
	}
	return "slurmstepd threads of job " + job + ":\n" + b.String()
}

func ptrVal(p *float64) any {
	if p == nil {
		return "?"
	}
	return *p
}

// killNode kills a node of the test cluster for the rest of the test.
func killNode(t *testing.T, node string) time.Time {
	t.Helper()
	t.Cleanup(func() { reviveIfDead(t, node) })
	at := time.Now()
	cluster(t, "kill-node", node)
	return at
}

// spareLoss is one run of the node-loss scenario: the job, the step at
// which n2 was killed, when, and when the relaunched step printed its
// first loss line (zero if it never did).
type spareLoss struct {
	job, dir  string
	killStep  int
	killed    time.Time
	firstStep time.Time
	first     int64 // that line's step
}

// watchFirstStep polls a batch job's output until a loss line follows the
// relaunch's "resumed from step" line, and records when it appeared (to
// the poll's 20 ms).
func watchFirstStep(dir, job string, nl *spareLoss) (stop func()) {
	out := filepath.Join(dir, "slurm-"+job+".out")
	done := make(chan struct{})
	quit := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			case <-time.After(20 * time.Millisecond):
			}
			b, _ := os.ReadFile(out)
			if i := resumedRe.FindIndex(b); i != nil {
				if m := lossRe.FindSubmatch(b[i[1]:]); m != nil {
					nl.firstStep = time.Now()
					nl.first, _ = strconv.ParseInt(string(m[1]), 10, 64)
					return
				}
			}
		}
	}()
	return func() { close(quit); <-done }
}

// runNodeLossSpare: a -N5 --no-kill job with spares=1 runs command under
// reft run; n2 is killed once the trainer logged a step drawn at random
// from [lo, hi], and the test waits for the job's end.
func runNodeLossSpare(t *testing.T, command string, lo, hi int) spareLoss {
	t.Helper()
	var nl spareLoss
	untilNoInitCrash(t, func() (string, string) {
		reviveIfDead(t, "n2")
		job, dir := reftRunCmd(t, "-N5 --no-kill --reft=arc,spares=1 --requeue", command)
		nl = spareLoss{job: job, dir: dir, killStep: lo + rand.IntN(hi-lo+1)}
		waitOutput(t, dir, job, fmt.Sprintf("\nstep %d loss", nl.killStep))
		stop := watchFirstStep(dir, job, &nl)
		nl.killed = killNode(t, "n2")
		waitJobEnd(t, job, 5*time.Minute)
		stop()
		return job, dir
	})
	return nl
}

// checkNodeLossSpare checks what every node-loss run must show: the job
// completed with the uninterrupted run's bits; reft run saw one node
// failure on n2, put the spare n5 in its slot, and resumed losing at most
// one step. It logs the recovery's figures.
func checkNodeLossSpare(t *testing.T, nl spareLoss, refHash string) []recoveryEvent {
	t.Helper()
	job, dir := nl.job, nl.dir
	out := completedSame(t, dir, job, refHash)
	ev := recoveryEvents(t, job)
	names := eventNames(ev)
	if len(names) < 5 || !slices.Equal(names[:4], []string{"step_launched", "failure_detected", "node_excluded", "step_relaunched"}) ||
		names[len(names)-1] != "completed" || len(eventsNamed(ev, "failure_detected")) != 1 {
		t.Fatalf("recovery events %v\n%s", names, out)
	}
	if f := ev[1]; f.Kind != "node" || f.Node != "n2" || !slices.Equal(f.Nodes, []string{"n2"}) ||
		f.DetectedBy != "agents" || f.DetectionS == nil || !strings.Contains(f.Cause, "the agents' failure detector") {
		t.Errorf("failure_detected %+v: want the agents' verdict, node n2", f)
	}
	// The agents' verdict comes within a second or two, long before srun's
	// (about 27 s): the relaunch restores the step committed at the failure
	// (the spare's rank from its group's agents), at most one step lost.
	// (When no agent answered reft run's probe the committed step is
	// unknown, and lost work comes from the trainer's log, below.)
	if res := eventsNamed(ev, "resumed"); len(res) != 1 || res[0].LostSteps != nil && *res[0].LostSteps > 1 {
		t.Errorf("failure_detected %+v, resumed %+v: want at most one step lost", ev[1], res)
	} else if res[0].LostSteps != nil {
		t.Logf("job %s: every rank restored step %d %.2f s after the agents' verdict (%d step(s) lost)", job, res[0].Generation, res[0].DurationS, *res[0].LostSteps)
	}
	// One coordinator (n1, the lowest-index survivor) published it.
	if af := agentsFailures(t, job, "n1", "n3", "n4", "n5"); len(af) != 1 || af[0]["failed_node"] != "n2" || af[0]["class"] != "node" || af[0]["coordinator"] != "n1" {
		t.Errorf("the agents logged %v, want one node failure of n2 from n1", af)
	}
	if x := ev[2]; x.Node != "n2" || x.Replacement != "n5" || !slices.Equal(x.Ranks, []int{1}) {
		t.Errorf("node_excluded %+v", x)
	}
	if r := ev[3]; !slices.Equal(r.Nodes, []string{"n1", "n5", "n3", "n4"}) {
		t.Errorf("step_relaunched %+v: want n5 in n2's place", r)
	}
	res := eventsNamed(ev, "resumed")
	if len(res) != 1 {
		t.Fatalf("resumed events %+v", res)
	}
	resumed := res[0]
	// Lost work: the steps the trainer finished before the failure that
	// the resume did not get back (at most the step in flight is redone).
	// From the trainer's own log, since reft run knows the newest
	// committed step only when an agent answered its probe.
	i := resumedRe.FindStringIndex(out)
	if i == nil {
		t.Fatalf("the trainer did not say it resumed:\n%s", out)
	}
	before := lossRe.FindAllStringSubmatch(out[:i[0]], -1)
	if len(before) == 0 {
		t.Fatalf("no step logged before the failure:\n%s", out)
	}
	last, _ := strconv.ParseInt(before[len(before)-1][1], 10, 64)
	lost := max(0, last-resumed.Generation) // a JIT flush may save a step newer than the last logged
	if lost > 1 {
		t.Errorf("the trainer finished step %d before the failure and resumed from step %d: %d steps lost, want at most 1", last, resumed.Generation, lost)
	}
	// reft run's count is exact by its definition (docs/RECOVERY.md): the
	// newest step any surviving rank had committed when the agents were
	// asked, minus the step restored. It differs from the log's count by
	// at most one either way, because rank 0 prints step L's loss line
	// after Save(L) has only started (the copy and the commit run in the
	// background) and after its Save(L-1) committed: so the newest
	// committed step N at the failure is L-1 (L's commit in flight when
	// the node died: the log's step L is redone, reft counts it not),
	// L, or L+1 (a faster rank committed L+1 before rank 0 printed it;
	// L+2 needs rank 0 in step L+2's allreduce, after it printed L+1).
	if resumed.LostSteps != nil {
		if n := ev[1].Generation; *resumed.LostSteps != n-resumed.Generation || n < last-1 || n > last+1 {
			t.Errorf("reft run says %d step(s) lost (step %d committed at the failure, step %d restored); the trainer logged step %d last: "+
				"want the committed step minus the restored one, and the committed step within one of the log's", *resumed.LostSteps, n, resumed.Generation, last)
		} else if d := n - last; d != 0 {
			t.Logf("reft run's lost steps (%d) and the log's (%d) differ by %d: step %d was committed when the trainer had logged step %d", *resumed.LostSteps, lost, d, n, last)
		}
	}
	if resumed.LostSteps == nil {
		t.Logf("reft run did not know the newest committed step at the failure (failure_detected: %s); lost work from the trainer's log", ev[1].Cause)
	}
	if m := resumedRe.FindStringSubmatch(out); m == nil || m[1] != strconv.FormatInt(resumed.Generation, 10) {
		t.Errorf("the trainer says %v, the agents' restores say step %d", m, resumed.Generation)
	}
	if nl.firstStep.IsZero() || nl.first != resumed.Generation+1 {
		t.Fatalf("no first step after the resume seen (saw step %d at %v), want step %d", nl.first, nl.firstStep, resumed.Generation+1)
	}
	// The figures (issue 7: kill to first step after resume <= 15 s on
	// the test cluster); reported, not asserted.
	t.Logf("job %s: n2 killed after step %d; failure detected +%.2f s (step %d committed); relaunched on n1,n5,n3,n4; "+
		"every rank restored step %d +%.2f s; first step after the resume (step %d) +%.2f s after the kill; %d step(s) lost",
		job, nl.killStep, ev[1].Time.Sub(nl.killed).Seconds(), ev[1].Generation, resumed.Generation, resumed.Time.Sub(nl.killed).Seconds(),
		nl.first, nl.firstStep.Sub(nl.killed).Seconds(), lost)
	// Where the recovery's time went (issue 21): the resumed event's
	// phases, end to end from the failure to the last restore; with every
	// clock this machine's, they add up to its duration.
	if p := resumed.Phases; p == nil {
		t.Errorf("resumed %+v: no phases", resumed)
	} else {
		sum := p.StopS + p.ProbeS + p.ReplaceS + p.BackoffS + p.LaunchS + p.RestoreS
		if math.Abs(sum-resumed.DurationS) > 0.01 {
			t.Errorf("phases %+v add up to %.3f s, the resume took %.3f s after the failure", *p, sum, resumed.DurationS)
		}
		logPhases(t, nl.killed, ev[1], resumed, nl.firstStep)
	}
	if c := jobComment(t, job); !strings.HasPrefix(c, "reft: 1 failure (node n2 lost, replaced by n5), ") {
		t.Errorf("Comment %q", c)
	} else {
		t.Logf("sacct Comment: %s", c)
	}
	return ev
}

// TestReftRunNodeLossSpare: -N5 --no-kill with spares=1; n2 dies at a
// random step of training. reft run classifies a node failure, excludes n2
// and relaunches with the spare n5 in n2's place (rank 1 moves there, the
// others stay). The spare holds no snapshot; its rank assembles its state
// from the other agents' shards and ARC copies (restore_peer), so training
// resumes near where it stopped, and the bits still match.
func TestReftRunNodeLossSpare(t *testing.T) {
	enableReft(t)
	flags := append(append([]string{}, trainFlags...), reftTrainFlags...)
	flags = append(flags, "--steps", "150")
	refHash := reference(t, flags)
	nl := runNodeLossSpare(t, bin("reft-train")+" "+strings.Join(append(flags, "--dp", "4"), " "), 5, 30)
	if clusterNet() { // a row of make bench-net's table
		defer func() {
			netResult(t, "n2 killed: a silent host on --net", []string{"n2"}, nl.job, nl.killed, !t.Failed(), "n1", "n2", "n3", "n4", "n5")
		}()
	}
	ev := checkNodeLossSpare(t, nl, refHash)
	if b, err := os.ReadFile(filepath.Join(clusterDir, "log", "reft", nl.job, "hostfile.1")); err != nil || string(b) != "n1\nn5\nn3\nn4\n" {
		t.Errorf("the relaunch's hostfile %q (%v): want rank 1 on n5", b, err)
	}
	r := run(t, time.Minute, alice, "sacct", "-n", "-P", "-j", nl.job, "-o", "JobID,JobName,NodeList")
	if !strings.Contains(r.Stdout, ev[3].Step+"|reft-train|n[1,3-5]\n") {
		t.Errorf("sacct does not show the relaunched step %s on n[1,3-5]:\n%s", ev[3].Step, r.Stdout)
	}
}

// TestReftRunNodeLossSpareTorch: the same with the PyTorch trainer
// (examples/torch_ddp.py on reft.torch, DDP over gloo, AdamW): n2 dies at
// a random step, the spare's rank restores from the other agents, and the
// job ends with the bits of an uninterrupted run without reft.
func TestReftRunNodeLossSpareTorch(t *testing.T) {
	enableReft(t)
	flags := append(append([]string{}, torchFlags...), "--steps", "300", "--optimizer", "adamw")
	ref := mustRun(t, 3*time.Minute, alice, append([]string{"srun", "-K1", "-N4", "-n4"}, torchTask(flags...)...)...)
	refHash := torchRun(t, "uninterrupted run", ref)
	nl := runNodeLossSpare(t, strings.Join(torchTask(flags...), " "), 5, 40)
	ev := checkNodeLossSpare(t, nl, refHash)
	// The spare's rank (1) assembled its state from the other agents.
	var peerRestored []int
	for _, e := range eventsNamed(ev, "restore_peer") {
		peerRestored = append(peerRestored, e.Ranks...)
	}
	if !slices.Contains(peerRestored, 1) {
		t.Errorf("rank 1 on the spare did not restore from peers: restores %v", eventNames(ev))
	}
	if out := jobOutput(t, nl.dir, nl.job); strings.Contains(out, "snapshots off") {
		t.Errorf("a step ran without snapshots:\n%s", out)
	}
}

// TestReftRunNodeLossRequeue: -N4 --no-kill, no spare; n3 dies. reft run
// records the failure and the requeue, sets the Comment and requeues the
// job (scontrol shows Restarts=1). Slurm starts it again on n1, n2, n4 and
// the idle n5; that run's ranks restore from what the survivors' memory
// still holds (the stores outlive the first run), and the job completes
// with the uninterrupted run's bits.
func TestReftRunNodeLossRequeue(t *testing.T) {
	enableReft(t)
	flags := append(append([]string{}, trainFlags...), reftTrainFlags...)
	flags = append(flags, "--dp", "4", "--steps", "150")
	refHash := reference(t, flags)
	reviveIfDead(t, "n3")
	job, dir := reftRunJobWith(t, "-N4 --no-kill --reft=arc --requeue --open-mode=append", flags...)
	waitOutput(t, dir, job, "\nstep 10 loss")
	killed := killNode(t, "n3")
	var ev []recoveryEvent
	deadline := time.Now().Add(2 * time.Minute)
	for len(eventsNamed(ev, "job_requeued")) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no job_requeued event; events %v\n%s", eventNames(ev), jobOutput(t, dir, job))
		}
		time.Sleep(250 * time.Millisecond)
		if _, err := os.Stat(filepath.Join(clusterDir, "log", "reft", job, "recovery.jsonl")); err == nil {
			ev = recoveryEvents(t, job)
		}
	}
	// (An MPI_Init crash under load may add a rank failure and a relaunch
	// before: the story under test is the last two events.)
	n := len(ev)
	if n < 3 || ev[0].Event != "step_launched" || ev[n-2].Event != "failure_detected" || ev[n-1].Event != "job_requeued" {
		t.Fatalf("events %v", eventNames(ev))
	}
	failed := ev[n-2]
	if failed.Kind != "node" || failed.Node != "n3" {
		t.Errorf("failure_detected %+v", failed)
	}
	if q := ev[n-1]; q.Node != "n3" || q.ExitCode == nil || *q.ExitCode != 5 || !strings.Contains(q.Cause, "no spare left") {
		t.Errorf("job_requeued %+v", q)
	}
	t.Logf("job %s: n3 killed; requeued %.1f s later", job, ev[n-1].Time.Sub(killed).Seconds())

	// The second run: Restarts=1 in accounting, and completion.
	if st := waitJobEnd(t, job, 5*time.Minute); st != "COMPLETED" {
		t.Fatalf("job %s ended %s after its requeue:\n%s", job, st, jobDiag(t, job))
	}
	out := jobOutput(t, dir, job)
	// (The requeue kills the first run's batch script, often before it
	// can print reft run's exit code.)
	if !strings.Contains(out, "reft run: requeued the job") || !strings.HasSuffix(strings.TrimRight(out, "\n"), "reft run exit 0") {
		t.Fatalf("want the first run to requeue the job and the second to finish (exit 0):\n%s", out)
	}
	sameHash(t, out, refHash)
	// The second run resumed from the survivors' memory: at most the step
	// in flight when n3 died is lost, not the whole run.
	ev = recoveryEvents(t, job)
	var second []recoveryEvent
	for _, e := range ev {
		if e.Restart == 1 {
			second = append(second, e)
		}
	}
	resumed := eventsNamed(second, "resumed")
	if len(resumed) != 1 || len(eventsNamed(second, "step_launched")) != 1 || len(eventsNamed(second, "completed")) != 1 {
		t.Fatalf("the requeued run's events %v, want step_launched, the restores, resumed, completed", eventNames(second))
	}
	// Rank 0 logged step L before the requeue, so every rank had
	// committed L-1 (--save-every 1); the agents' answer, when they still
	// answered at the failure, is exact.
	first, _, _ := strings.Cut(out, "reft run: requeued the job")
	var lastLogged int64 = -1
	for _, m := range lossRe.FindAllStringSubmatch(first, -1) {
		lastLogged, _ = strconv.ParseInt(m[1], 10, 64)
	}
	r := resumed[0]
	switch {
	case failed.Generation >= 0 && (r.Generation < failed.Generation-1 || r.Generation > failed.Generation+1):
		t.Errorf("the requeued run resumed from step %d; step %d was committed when n3 died (at most one step may be lost)", r.Generation, failed.Generation)
	case r.Generation < lastLogged-2:
		t.Errorf("the requeued run resumed from step %d, but rank 0 had logged step %d before the requeue", r.Generation, lastLogged)
	}
	var peers int
	for _, e := range second {
		if e.Event == "restore_peer" || e.Event == "decode" {
			peers++
		}
	}
	if peers == 0 {
		t.Errorf("the requeued run's ranks did not restore through their group: events %v", eventNames(second))
	}
	// (sacct 22.05 has no Restarts field; scontrol keeps it while
	// slurmctld remembers the job.)
	info := run(t, 30*time.Second, root, "scontrol", "-o", "show", "job", job).Stdout
	if !strings.Contains(info, " Restarts=1 ") || !strings.Contains(info, "JobState=COMPLETED") {
		t.Errorf("scontrol does not show the job COMPLETED after 1 restart:\n%s", info)
	}
	nodes := regexp.MustCompile(` NodeList=(\S+)`).FindString(info)
	c := jobComment(t, job)
	t.Logf("job %s: the requeued run (%s) resumed from step %d; sacct Comment: %s", job, nodes, resumed[0].Generation, c)
	if !strings.HasPrefix(c, "reft: 1 failure (node n3 lost), requeued, resumed from step "+strconv.FormatInt(resumed[0].Generation, 10)) {
		t.Errorf("Comment %q: want the failure, the requeue and the resume", c)
	}
}

// phaseMarker starts a log line with a recovery's phases as JSON (a
// row of docs/BENCHMARKS.md's kill-to-resume table, from a go test -v
// log).
const phaseMarker = "PHASES "

// logPhases logs a node-loss recovery's phases, from the kill to the
// first training step after the resume.
func logPhases(t *testing.T, killed time.Time, failed, resumed recoveryEvent, firstStep time.Time) {
	t.Helper()
	p := resumed.Phases
	row := map[string]any{
		"test": t.Name(), "detect_s": failed.Time.Sub(killed).Seconds(),
		"stop_s": p.StopS, "probe_s": p.ProbeS, "replace_s": p.ReplaceS, "backoff_s": p.BackoffS, "launch_s": p.LaunchS,
		"restore_s": p.RestoreS, "first_step_s": firstStep.Sub(resumed.Time).Seconds(), "kill_to_step_s": firstStep.Sub(killed).Seconds(),
	}
	// detect_s runs from before the cluster tool's kill-node (which finds
	// the node's processes first); the agents' own part of it is the
	// failed agent's last sign of life to their verdict.
	if failed.DetectionS != nil {
		row["agents_detection_s"] = *failed.DetectionS
	}
	b, err := json.Marshal(row)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s%s", phaseMarker, b)
}
