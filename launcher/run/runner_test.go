package run

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/agent/runrecord"
	"github.com/reft-hpc/reft/launcher/recoverylog"
	"github.com/reft-hpc/reft/pmix/hostlist"
)

// fakeAttempt is what one srun of the step does in a test.
type fakeAttempt struct {
	stderr []string
	exit   int
	// agentLog: per node, lines the node's agent logs once the step runs.
	agentLog map[string][]string
	// block: srun runs until it gets a signal, then exits 143.
	block bool
	// linger: srun exits this long after reft run saw the step (reft run
	// reads the agents' logs meanwhile).
	linger time.Duration
}

// fakeSlurm plays Slurm for the Runner. Each Start plays the next attempt.
type fakeSlurm struct {
	mu        sync.Mutex
	attempts  []fakeAttempt
	states    func(n int, nodes []string) map[string]string // n: attempts started so far
	probe     func(n int, nodes []string) (map[string]AgentReport, error)
	logDir    string
	argvs     [][]string
	envs      [][]string
	probed    [][]string
	comments  []string
	requeued  int
	signals   []os.Signal
	stepNo    int
	running   string
	listed    chan struct{} // closed once Steps has seen the running step
	started   chan struct{} // gets a value when a step starts
	cancelled []string
	shrunk    [][]string
	stopped   [][]string // StopAgents calls
	// stopAgents, when set, answers StopAgents (call: 0 for the first),
	// without the lock held: it may block until ctx ends.
	stopAgents func(ctx context.Context, call int, nodes []string) (map[string]AgentReport, error)
}

func (f *fakeSlurm) StopAgents(ctx context.Context, _ string, nodes []string) (map[string]AgentReport, error) {
	f.mu.Lock()
	call := len(f.stopped)
	f.stopped = append(f.stopped, slices.Clone(nodes))
	f.probed = append(f.probed, slices.Clone(nodes))
	hook := f.stopAgents
	f.mu.Unlock()
	if hook != nil {
		return hook(ctx, call, nodes)
	}
	return committedReports(nodes, 6), nil
}

func (f *fakeSlurm) Release(context.Context) (Release, error) { return Release{}, nil }

func (f *fakeSlurm) Shrink(_ context.Context, _ string, keep []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.shrunk = append(f.shrunk, slices.Clone(keep))
	return nil
}

func (f *fakeSlurm) Hostnames(_ context.Context, list string) ([]string, error) {
	return hostlist.Expand(list)
}

func (f *fakeSlurm) NodeStates(_ context.Context, _ string, nodes []string) (map[string]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.states != nil {
		return f.states(len(f.argvs), nodes), nil
	}
	out := map[string]string{}
	for _, n := range nodes {
		out[n] = "ALLOCATED"
	}
	return out, nil
}

func (f *fakeSlurm) Probe(_ context.Context, _ string, nodes []string) (map[string]AgentReport, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.probed = append(f.probed, slices.Clone(nodes))
	if f.probe != nil {
		return f.probe(len(f.argvs), nodes)
	}
	return committedReports(nodes, 6), nil
}

// committedReports: every node's agent answers; rank i (on node i) has
// committed up to newest.
func committedReports(nodes []string, newest int64) map[string]AgentReport {
	out := map[string]AgentReport{}
	for i, n := range nodes {
		st := &proto.Status{Node: n}
		if newest >= 0 {
			st.Ranks = []proto.RankStatus{{Rank: i, Newest: newest, Generations: []int64{newest, newest - 1}, Bytes: 100}}
		}
		out[n] = AgentReport{Node: n, OK: true, Status: st}
	}
	return out
}

func (f *fakeSlurm) Steps(_ context.Context, job string) (map[string]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]string{job + ".batch": "batch", job + ".extern": "extern"}
	if f.running != "" {
		out[f.running] = "train"
		if f.listed != nil {
			close(f.listed)
			f.listed = nil
		}
	}
	return out, nil
}

func (f *fakeSlurm) SetComment(_ context.Context, _, text string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.comments = append(f.comments, text)
	return nil
}

func (f *fakeSlurm) Requeue(context.Context, string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requeued++
	return nil
}

func (f *fakeSlurm) Cancel(_ context.Context, step string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cancelled = append(f.cancelled, step)
	return nil
}

type fakeProc struct {
	f    *fakeSlurm
	exit int
	wait chan struct{} // closed when srun "exits"
	once sync.Once
	// stderrDone is closed once the scripted stderr lines are handed
	// over: Wait waits for it, as the real Exec's does for srun's stderr
	// (runAttempt reads the Outcome they write after Wait).
	stderrDone chan struct{}
}

// end makes srun "exit" (once: a signal may come first).
func (p *fakeProc) end() { p.once.Do(func() { close(p.wait) }) }

func (p *fakeProc) Wait() int {
	<-p.wait
	<-p.stderrDone
	p.f.mu.Lock()
	p.f.running = ""
	p.f.mu.Unlock()
	return p.exit
}

func (p *fakeProc) Signal(sig os.Signal) error {
	p.f.mu.Lock()
	p.f.signals = append(p.f.signals, sig)
	p.f.mu.Unlock()
	p.end()
	return nil
}

func (f *fakeSlurm) Start(l Launch) (Proc, error) {
	f.mu.Lock()
	n := len(f.argvs)
	if n >= len(f.attempts) {
		f.mu.Unlock()
		return nil, fmt.Errorf("fake srun: no attempt %d scripted", n)
	}
	at := f.attempts[n]
	f.argvs = append(f.argvs, l.Argv)
	f.envs = append(f.envs, l.Env)
	f.running = fmt.Sprintf("42.%d", f.stepNo)
	f.stepNo += 2 // the probe takes a step id too
	listed := make(chan struct{})
	f.listed = listed
	f.mu.Unlock()
	for node, lines := range at.agentLog {
		fh, err := os.OpenFile(filepath.Join(f.logDir, runrecord.FileName(node)), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return nil, err
		}
		fh.WriteString(strings.ReplaceAll(strings.Join(lines, "\n")+"\n", nowMark, time.Now().Format(time.RFC3339Nano)))
		fh.Close()
	}
	p := &fakeProc{f: f, exit: at.exit, wait: make(chan struct{}), stderrDone: make(chan struct{})}
	if at.block {
		p.exit = 143
	}
	go func() {
		select {
		case <-listed: // srun lives until reft run has seen the step
		case <-p.wait: // or until a signal ends it first: no stderr
			close(p.stderrDone)
			return
		}
		for _, line := range at.stderr {
			l.OnStderr(line, time.Now())
		}
		close(p.stderrDone)
		if !at.block {
			time.Sleep(at.linger)
			p.end()
		}
	}()
	if f.started != nil {
		f.started <- struct{}{}
	}
	return p, nil
}

// restoreLog is what a node's agent logs for a rank that registers and
// restores generation gen in step "1" (gen < 0: registers only).
func restoreLog(node string, rank int, step string, gen int64) []string {
	pid := 1000 + rank
	lines := []string{
		fmt.Sprintf(`{"v":1,"kind":"registered","node":%q,"pid":%d,"step":%q,"rank":%d,"time":"2026-05-01T12:00:02Z"}`, node, pid, step, rank),
	}
	if gen >= 0 {
		lines = append(lines, fmt.Sprintf(`{"v":1,"kind":"restored","node":%q,"pid":%d,"step":%q,"event":"restore_local","rank":%d,"generation":%d,"bytes":100,"duration_ns":250000,"time":"2026-05-01T12:00:03.%dZ"}`, node, pid, step, rank, gen, rank))
	}
	return lines
}

func resumeLogs(step string, gen int64, nodes ...string) map[string][]string {
	out := map[string][]string{}
	for i, n := range nodes {
		out[n] = restoreLog(n, i, step, gen)
	}
	return out
}

var killed2 = []string{
	"reft-train: rank 2: --fail-at 7:2: SIGKILL",
	"srun: error: n3: task 2: Killed",
	"srun: launch/slurm: _step_signal: Terminating StepId=42.0",
	"slurmstepd-n1: error: *** STEP 42.0 ON n1 CANCELLED AT 2026-11-21T21:58:30 ***",
	"srun: error: n2: task 1: Terminated",
	"srun: error: n1: task 0: Terminated",
	"srun: Force Terminated StepId=42.0",
}

type harness struct {
	t      *testing.T
	f      *fakeSlurm
	r      *Runner
	logDir string
	sigs   chan os.Signal
	out    strings.Builder
}

func newHarness(t *testing.T, alloc []string, spares int, policy config.Run, attempts ...fakeAttempt) *harness {
	dir := filepath.Join(t.TempDir(), "42")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	w, err := recoverylog.Open(filepath.Dir(dir), "42")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	plan, err := NewPlan(alloc, spares, 1)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, logDir: dir, sigs: make(chan os.Signal, 2)}
	h.f = &fakeSlurm{attempts: attempts, logDir: dir}
	h.r = &Runner{Slurm: h.f, Log: w, Stdout: io.Discard, Stderr: &h.out, Env: []string{"PATH=/bin", "SLURM_HOSTFILE=/old"},
		Job: "42", Spec: "arc", Plan: plan, Policy: policy, Srun: "srun", SrunOpts: []string{"--mpi=pmix"},
		Command: []string{"train", "--steps", "9"}, JobLogDir: dir, Signals: h.sigs, Tick: time.Millisecond}
	return h
}

// events reads the recovery log back.
func (h *harness) events() []recoverylog.Event {
	ev, bad, err := recoverylog.ReadFile(filepath.Join(h.logDir, recoverylog.FileName))
	if err != nil || len(bad) > 0 {
		h.t.Fatalf("recovery log: %v %v", err, bad)
	}
	return ev
}

func names(ev []recoverylog.Event) []string {
	var out []string
	for _, e := range ev {
		out = append(out, e.Event)
	}
	return out
}

func find(ev []recoverylog.Event, name string) []recoverylog.Event {
	var out []recoverylog.Event
	for _, e := range ev {
		if e.Event == name {
			out = append(out, e)
		}
	}
	return out
}

func fastPolicy() config.Run {
	return config.Run{MaxRestarts: 10, MaxStalled: 3, Backoff: 0, BackoffMax: 0, ProbeTimeout: config.Duration(time.Second)}
}

var four = []string{"n1", "n2", "n3", "n4"}

func TestRunRankFailureResumes(t *testing.T) {
	h := newHarness(t, four, 0, fastPolicy(),
		fakeAttempt{stderr: killed2, exit: 143},
		fakeAttempt{exit: 0, agentLog: resumeLogs("2", 5, four...)})
	if code := h.r.Run(context.Background()); code != ExitOK {
		t.Fatalf("exit %d\n%s", code, h.out.String())
	}
	ev := h.events()
	want := []string{"step_launched", "failure_detected", "step_relaunched", "restore_local", "restore_local", "restore_local",
		"restore_local", "resumed", "completed"}
	if !slices.Equal(names(ev), want) {
		t.Fatalf("events %v, want %v\n%s", names(ev), want, h.out.String())
	}
	f := ev[1]
	if f.Kind != recoverylog.KindRank || !slices.Equal(f.Ranks, []int{2}) || f.Node != "n3" || f.Step != "42.0" ||
		f.Generation != 6 || f.Bytes != 400 || *f.ExitCode != 143 || f.Cause != "task 2 on n3: Killed" || f.Job != "42" || f.Spec != "arc" {
		t.Errorf("failure_detected %+v", f)
	}
	if ev[2].Step != "42.2" || ev[2].Relaunch != 1 || !slices.Equal(ev[2].Nodes, four) || !strings.HasPrefix(ev[2].Cause, "rank failure: same nodes") {
		t.Errorf("step_relaunched %+v", ev[2])
	}
	r := ev[3]
	if r.Node != "n1" || !slices.Equal(r.Ranks, []int{0}) || r.Generation != 5 || r.Bytes != 100 || r.DurationS != 0.00025 {
		t.Errorf("restore_local %+v", r)
	}
	res := ev[7]
	if res.Generation != 5 || res.LostSteps == nil || *res.LostSteps != 1 || res.Bytes != 400 || res.Step != "42.2" ||
		!res.Time.Equal(time.Date(2026, 5, 1, 12, 0, 3, 3e8, time.UTC)) {
		t.Errorf("resumed %+v", res)
	}
	// The phases: the records' registrations (12:00:02) to the last
	// restore (12:00:03.3); the rest is on this test's clock, now, which
	// the records' times precede (clamped to 0, not negative).
	if p := res.Phases; p == nil || p.RestoreS != 1.3 || p.StopS < 0 || p.ProbeS < 0 || p.ReplaceS < 0 || p.BackoffS < 0 || p.LaunchS != 0 {
		t.Errorf("resumed phases %+v", res.Phases)
	}
	// Same nodes, the job's SPEC, --kill-on-bad-exit, --overlap (the failed
	// step may still hold CPUs), the user's options, and the hostfile in
	// the environment; the first launch overlaps nothing.
	if argv := strings.Join(h.f.argvs[0], " "); argv != "srun --nodes=4 --ntasks=4 --distribution=arbitrary --kill-on-bad-exit=1 --reft=arc --mpi=pmix train --steps 9" {
		t.Errorf("launch argv %s", argv)
	}
	argv := strings.Join(h.f.argvs[1], " ")
	if argv != "srun --nodes=4 --ntasks=4 --distribution=arbitrary --kill-on-bad-exit=1 --reft=arc --overlap --mpi=pmix train --steps 9" {
		t.Errorf("relaunch argv %s", argv)
	}
	hf := filepath.Join(h.logDir, "hostfile.1")
	if !slices.Contains(h.f.envs[1], "SLURM_HOSTFILE="+hf) || slices.Contains(h.f.envs[1], "SLURM_HOSTFILE=/old") {
		t.Errorf("env %v", h.f.envs[1])
	}
	// REFT_RUN (the relaunch count) marks reft run's steps for the SPANK
	// plugin's step-end hold.
	if !slices.Contains(h.f.envs[0], "REFT_RUN=0") || !slices.Contains(h.f.envs[1], "REFT_RUN=1") {
		t.Errorf("envs %v / %v: want REFT_RUN=0, then 1", h.f.envs[0], h.f.envs[1])
	}
	if b, _ := os.ReadFile(hf); string(b) != "n1\nn2\nn3\nn4\n" {
		t.Errorf("hostfile %q", b)
	}
	if last := h.f.comments[len(h.f.comments)-1]; !strings.HasPrefix(last, "reft: 1 failure (rank 2 on n3), resumed from step 5 in ") ||
		!strings.HasSuffix(last, ", lost 1 step") {
		t.Errorf("comment %q (all: %q)", last, h.f.comments)
	}
	if len(h.f.probed) != 1 || !slices.Equal(h.f.probed[0], four) {
		t.Errorf("probed %v", h.f.probed)
	}
}

func TestRunNodeFailureTakesSpare(t *testing.T) {
	alloc := []string{"n1", "n2", "n3", "n4", "n5"}
	h := newHarness(t, alloc, 1, fastPolicy(),
		fakeAttempt{stderr: []string{"srun: error: Node failure on n2", "srun: error: n2: task 1: Killed"}, exit: 1},
		fakeAttempt{exit: 0, agentLog: resumeLogs("2", 5, "n1", "n5", "n3", "n4")})
	h.f.states = func(_ int, nodes []string) map[string]string {
		out := map[string]string{}
		for _, n := range nodes {
			if n != "n2" { // gone from the shrunken allocation
				out[n] = "ALLOCATED"
			}
		}
		return out
	}
	if code := h.r.Run(context.Background()); code != ExitOK {
		t.Fatalf("exit %d\n%s", code, h.out.String())
	}
	ev := h.events()
	f := find(ev, recoverylog.FailureDetected)
	if len(f) != 1 || f[0].Kind != recoverylog.KindNode || !slices.Equal(f[0].Nodes, []string{"n2"}) ||
		!strings.Contains(f[0].Cause, "n2: srun reported a node failure") {
		t.Fatalf("failure %+v", f)
	}
	x := find(ev, recoverylog.NodeExcluded)
	if len(x) != 1 || x[0].Node != "n2" || x[0].Replacement != "n5" || !slices.Equal(x[0].Ranks, []int{1}) {
		t.Errorf("node_excluded %+v", x)
	}
	// The lost node is not probed; the spare takes its ranks.
	if !slices.Equal(h.f.probed[0], []string{"n1", "n3", "n4"}) {
		t.Errorf("probed %v", h.f.probed)
	}
	if b, _ := os.ReadFile(filepath.Join(h.logDir, "hostfile.1")); string(b) != "n1\nn5\nn3\nn4\n" {
		t.Errorf("hostfile %q", b)
	}
	rl := find(ev, recoverylog.StepRelaunched)
	if len(rl) != 1 || !slices.Equal(rl[0].Nodes, []string{"n1", "n5", "n3", "n4"}) || !strings.Contains(rl[0].Cause, "n5 in n2's place") {
		t.Errorf("relaunch %+v", rl)
	}
	if len(find(ev, recoverylog.Resumed)) != 1 {
		t.Errorf("no resumed event: %v", names(ev))
	}
	if c := h.f.comments[len(h.f.comments)-1]; !strings.HasPrefix(c, "reft: 1 failure (node n2 lost, replaced by n5), resumed from step 5") {
		t.Errorf("comment %q", c)
	}
}

func TestRunNodeFailureNoSpareRequeues(t *testing.T) {
	h := newHarness(t, four, 0, fastPolicy(), fakeAttempt{exit: 1, stderr: []string{"srun: error: n4: task 3: Killed"}})
	h.f.states = func(_ int, nodes []string) map[string]string {
		return map[string]string{"n1": "MIXED", "n2": "MIXED", "n3": "MIXED", "n4": "DOWN+NOT_RESPONDING"}
	}
	if code := h.r.Run(context.Background()); code != ExitRequeued {
		t.Fatalf("exit %d, want %d\n%s", code, ExitRequeued, h.out.String())
	}
	ev := h.events()
	if !slices.Equal(names(ev), []string{"step_launched", "failure_detected", "job_requeued"}) {
		t.Fatalf("events %v", names(ev))
	}
	if ev[1].Kind != recoverylog.KindNode || !strings.Contains(ev[1].Cause, "n4: not responding (State=DOWN+NOT_RESPONDING)") {
		t.Errorf("failure %+v", ev[1])
	}
	if h.f.requeued != 1 || *ev[2].ExitCode != ExitRequeued || ev[2].Node != "n4" {
		t.Errorf("requeued %d times; event %+v", h.f.requeued, ev[2])
	}
	if c := h.f.comments[len(h.f.comments)-1]; c != "reft: 1 failure (node n4 lost), no spare left, job requeued" {
		t.Errorf("comment %q", c)
	}
}

func TestRunAgentFailure(t *testing.T) {
	h := newHarness(t, four, 0, fastPolicy(),
		fakeAttempt{exit: 1, stderr: []string{"srun: error: n2: task 1: Exited with exit code 1", "srun: error: n1: task 0: Exited with exit code 1"}},
		fakeAttempt{exit: 0, agentLog: resumeLogs("2", 6, four...)})
	h.f.probe = func(_ int, nodes []string) (map[string]AgentReport, error) {
		r := committedReports(nodes, 6)
		r["n2"] = AgentReport{Node: "n2", Error: "no agent answers on /run/reft/42/agent.sock: connection refused"}
		return r, nil
	}
	if code := h.r.Run(context.Background()); code != ExitOK {
		t.Fatalf("exit %d\n%s", code, h.out.String())
	}
	ev := h.events()
	f := find(ev, recoverylog.FailureDetected)[0]
	if f.Kind != recoverylog.KindAgent || f.Node != "n2" || !strings.Contains(f.Cause, "connection refused") {
		t.Errorf("failure %+v", f)
	}
	rl := find(ev, recoverylog.StepRelaunched)[0]
	if !slices.Equal(rl.Nodes, four) || !strings.HasPrefix(rl.Cause, "agent failure: same nodes") {
		t.Errorf("relaunch %+v", rl)
	}
	res := find(ev, recoverylog.Resumed)[0]
	if res.Generation != 6 || *res.LostSteps != 0 {
		t.Errorf("resumed %+v", res)
	}
}

// TestRunIgnoresStaleVerdict: n2's agent is killed, srun sees its rank
// exit first and reft run relaunches; the agents' verdict on the killed
// agent is published only after the relaunch began. It concerns the
// agent before the relaunch and must not stop the relaunch (the e2e test
// TestReftRunAgentKill once took two relaunches).
func TestRunIgnoresStaleVerdict(t *testing.T) {
	for _, class := range []string{"agent", "hang"} {
		t.Run(class, func(t *testing.T) {
			ranks := ""
			if class == "hang" {
				ranks = "1"
			}
			late := agentFailureLineHeard("n1", "n2", class, ranks, 0.75, time.Now().Format(time.RFC3339Nano))
			logs := resumeLogs("2", 6, four...)
			logs["n1"] = append(logs["n1"], late)
			h := newHarness(t, four, 0, fastPolicy(),
				fakeAttempt{exit: 1, stderr: []string{"srun: error: n2: task 1: Exited with exit code 1"}},
				fakeAttempt{exit: 0, linger: 50 * time.Millisecond, agentLog: logs})
			time.Sleep(time.Millisecond) // the relaunch begins after the agent was last heard
			if code := h.r.Run(context.Background()); code != ExitOK {
				t.Fatalf("exit %d\n%s", code, h.out.String())
			}
			ev := h.events()
			if rl := find(ev, recoverylog.StepRelaunched); len(rl) != 1 || len(find(ev, recoverylog.FailureDetected)) != 1 {
				t.Fatalf("events %v: want one failure and one relaunch\n%s", names(ev), h.out.String())
			}
			if !strings.Contains(h.out.String(), "the agents' verdict on n2 ("+class) || !strings.Contains(h.out.String(), "concerns the step before this launch; ignored") {
				t.Errorf("reft run did not say it ignored the stale verdict:\n%s", h.out.String())
			}
		})
	}
}

func TestStale(t *testing.T) {
	start := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		class string
		heard time.Time
		want  bool
	}{
		{"agent", start.Add(-time.Millisecond), true},
		{"hang", start.Add(-time.Minute), true},
		{"agent", start.Add(time.Millisecond), false},
		{"hang", start, false},
		{"node", start.Add(-time.Minute), false}, // a lost node stays lost
		{"agent", time.Time{}, false},            // an older agent that logs no last_heard
	} {
		if got := stale(AgentFailure{Node: "n2", Class: tc.class, LastHeard: tc.heard}, start); got != tc.want {
			t.Errorf("stale(%s, last heard %v) = %v, want %v", tc.class, tc.heard, got, tc.want)
		}
	}
}

func TestRunGivesUpWithoutProgress(t *testing.T) {
	p := fastPolicy()
	p.MaxStalled = 2
	fail := fakeAttempt{exit: 2, stderr: []string{"srun: error: n1: task 0: Exited with exit code 2"}}
	h := newHarness(t, four, 0, p, fail, fail, fail, fail)
	if code := h.r.Run(context.Background()); code != ExitStalled {
		t.Fatalf("exit %d, want %d\n%s", code, ExitStalled, h.out.String())
	}
	if len(h.f.argvs) != 3 {
		t.Errorf("%d launches, want 3 (the first and 2 relaunches without progress)", len(h.f.argvs))
	}
	g := find(h.events(), recoverylog.GaveUp)
	if len(g) != 1 || !strings.Contains(g[0].Cause, "2 relaunch(es) in a row committed no snapshot newer than step 6 (run.max_stalled = 2)") ||
		*g[0].ExitCode != ExitStalled || g[0].Level != "error" {
		t.Errorf("gave_up %+v", g)
	}
}

func TestRunProgressResetsStalled(t *testing.T) {
	p := fastPolicy()
	p.MaxStalled, p.MaxRestarts = 1, 3
	fail := fakeAttempt{exit: 1, stderr: []string{"srun: error: n1: task 0: Killed"}}
	h := newHarness(t, four, 0, p, fail, fail, fail, fail)
	h.f.probe = func(n int, nodes []string) (map[string]AgentReport, error) {
		return committedReports(nodes, int64(10*n)), nil // every attempt commits something newer
	}
	if code := h.r.Run(context.Background()); code != ExitLimit {
		t.Fatalf("exit %d, want %d\n%s", code, ExitLimit, h.out.String())
	}
	if len(h.f.argvs) != 4 {
		t.Errorf("%d launches, want 4", len(h.f.argvs))
	}
	g := find(h.events(), recoverylog.GaveUp)
	if len(g) != 1 || !strings.Contains(g[0].Cause, "relaunch limit reached: 3 relaunch(es)") {
		t.Errorf("gave_up %+v", g)
	}
}

func TestRunNoRelaunches(t *testing.T) {
	p := fastPolicy()
	p.MaxRestarts = 0
	h := newHarness(t, four, 0, p, fakeAttempt{exit: 1, stderr: killed2})
	if code := h.r.Run(context.Background()); code != ExitLimit {
		t.Fatalf("exit %d, want %d", code, ExitLimit)
	}
}

func TestRunStartsOverWhenNothingCommitted(t *testing.T) {
	h := newHarness(t, four, 0, fastPolicy(), fakeAttempt{exit: 1, stderr: killed2},
		fakeAttempt{exit: 0, agentLog: resumeLogs("2", -1, four...)})
	h.f.probe = func(_ int, nodes []string) (map[string]AgentReport, error) { return committedReports(nodes, -1), nil }
	if code := h.r.Run(context.Background()); code != ExitOK {
		t.Fatalf("exit %d\n%s", code, h.out.String())
	}
	res := find(h.events(), recoverylog.Resumed)
	if len(res) != 1 || res[0].Generation != -1 || res[0].LostSteps != nil || !strings.Contains(res[0].Cause, "nothing was committed") {
		t.Errorf("resumed %+v", res)
	}
}

func TestRunStepFailureWithoutTasks(t *testing.T) {
	h := newHarness(t, four, 0, fastPolicy(), fakeAttempt{exit: 1, stderr: []string{"srun: error: Unable to create step for job 42: Invalid generic resource (gres) specification"}},
		fakeAttempt{exit: 0})
	h.f.probe = func(int, []string) (map[string]AgentReport, error) {
		return nil, fmt.Errorf("asking the agents: srun: exit status 1")
	}
	if code := h.r.Run(context.Background()); code != ExitOK {
		t.Fatalf("exit %d", code)
	}
	f := find(h.events(), recoverylog.FailureDetected)[0]
	if f.Kind != recoverylog.KindStep || !strings.Contains(f.Cause, "srun exited with status 1 and named no failed task; asking the agents") {
		t.Errorf("failure %+v", f)
	}
}

func TestRunSignalStopsTheStep(t *testing.T) {
	h := newHarness(t, four, 0, fastPolicy(), fakeAttempt{block: true})
	h.f.started = make(chan struct{}, 1)
	go func() {
		<-h.f.started
		h.sigs <- syscall.SIGINT
	}()
	if code := h.r.Run(context.Background()); code != 128+int(syscall.SIGINT) {
		t.Fatalf("exit %d, want 130\n%s", code, h.out.String())
	}
	if len(h.f.signals) != 1 || h.f.signals[0] != syscall.SIGTERM {
		t.Errorf("srun got %v, want one SIGTERM", h.f.signals)
	}
	ev := h.events()
	if last := ev[len(ev)-1]; last.Event != recoverylog.Stopped || last.Cause != "received interrupt" || *last.ExitCode != 130 {
		t.Errorf("last event %+v", last)
	}
	if len(h.f.argvs) != 1 || len(h.f.cancelled) != 0 {
		t.Errorf("relaunched after a signal, or cancelled: %d launches, %v", len(h.f.argvs), h.f.cancelled)
	}
}

func TestBackoff(t *testing.T) {
	tests := []struct {
		base, max time.Duration
		stalled   int
		want      time.Duration
	}{
		{time.Second, time.Minute, 0, time.Second},
		{time.Second, time.Minute, 1, 2 * time.Second},
		{time.Second, time.Minute, 3, 8 * time.Second},
		{time.Second, time.Minute, 6, time.Minute},
		{time.Second, time.Minute, 1000, time.Minute},
		{0, time.Minute, 5, 0},
		{time.Second, time.Second, 2, time.Second},
	}
	for _, tt := range tests {
		if got := Backoff(tt.base, tt.max, tt.stalled); got != tt.want {
			t.Errorf("Backoff(%v, %v, %d) = %v, want %v", tt.base, tt.max, tt.stalled, got, tt.want)
		}
	}
}

func TestNewStep(t *testing.T) {
	before := map[string]string{"42.batch": "batch", "42.0": "train"}
	now := map[string]string{"42.batch": "batch", "42.0": "train", "42.3": "reft-probe", "42.5": "train", "42.4": "train", "7.9": "x"}
	if got := newStep(before, now, "42"); got != "42.4" {
		t.Errorf("newStep = %q, want 42.4", got)
	}
	if got := newStep(before, before, "42"); got != "" {
		t.Errorf("no new step: %q", got)
	}
}

func TestRunNoAgentAnswerGivesNoProgressVerdict(t *testing.T) {
	p := fastPolicy()
	p.MaxStalled, p.MaxRestarts = 1, 2
	fail := fakeAttempt{exit: 1, stderr: []string{"srun: error: n1: task 0: Exited with exit code 1"}}
	h := newHarness(t, four, 0, p, fail, fail, fail)
	h.f.probe = func(_ int, nodes []string) (map[string]AgentReport, error) {
		out := map[string]AgentReport{}
		for _, n := range nodes {
			out[n] = AgentReport{Node: n, Error: "no agent answers"}
		}
		return out, nil
	}
	// Every agent down: the verdict is an agent failure, and with nothing
	// known about commits, only the relaunch limit ends it.
	if code := h.r.Run(context.Background()); code != ExitLimit {
		t.Fatalf("exit %d, want %d\n%s", code, ExitLimit, h.out.String())
	}
	fs := find(h.events(), recoverylog.FailureDetected)
	if len(fs) != 3 || fs[0].Kind != recoverylog.KindAgent || fs[0].Generation != -1 ||
		!strings.Contains(fs[0].Cause, "the newest committed snapshot is unknown") {
		t.Errorf("failures %+v", fs)
	}
}

// TestRunAfterRequeueResumes: the run after a requeue (SLURM_RESTART_COUNT
// 1) is a recovery: its first launch's restores are observed and reported
// against the failure that requeued the job, and the Comment tells the
// whole story.
func TestRunAfterRequeueResumes(t *testing.T) {
	alloc := []string{"n1", "n2", "n3", "n5"}
	h := newHarness(t, alloc, 0, fastPolicy(), fakeAttempt{exit: 0, agentLog: resumeLogs("0", 6, alloc...)})
	failedAt := time.Date(2026, 5, 1, 11, 59, 30, 0, time.UTC)
	h.r.Restart = 1
	h.r.Prior = []recoverylog.Event{
		{Event: recoverylog.StepLaunched, Job: "42", Step: "42.0", Generation: -1},
		{Event: recoverylog.FailureDetected, Job: "42", Step: "42.0", Kind: recoverylog.KindNode, Node: "n4", Nodes: []string{"n4"}, Generation: 6, Time: failedAt},
		{Event: recoverylog.JobRequeued, Job: "42", Node: "n4", Generation: -1},
	}
	if code := h.r.Run(context.Background()); code != ExitOK {
		t.Fatalf("exit %d\n%s", code, h.out.String())
	}
	ev := h.events()
	want := []string{"step_launched", "restore_local", "restore_local", "restore_local", "restore_local", "resumed", "completed"}
	if !slices.Equal(names(ev), want) {
		t.Fatalf("events %v, want %v\n%s", names(ev), want, h.out.String())
	}
	r := find(ev, "resumed")[0]
	if r.Restart != 1 || r.Generation != 6 || r.LostSteps == nil || *r.LostSteps != 0 || r.DurationS != 33.3 {
		t.Errorf("resumed %+v: want step 6, 0 lost, 33.3 s after the failure", r)
	}
	if c := h.f.comments[len(h.f.comments)-1]; c != "reft: 1 failure (node n4 lost), requeued, resumed from step 6 in 33.3 s, lost 0 steps" {
		t.Errorf("comment %q", c)
	}
}

// agentFailureLine is the coordinator's failure_detected line (agent/detect)
// about an agent or ranks of the attempt that logs it: fake srun writes
// the time it starts the attempt for nowMark.
func agentFailureLine(coord, failed, class string, ranks string, latency float64) string {
	return agentFailureLineHeard(coord, failed, class, ranks, latency, nowMark)
}

// nowMark in an agentLog line is replaced by the time fake srun starts
// the attempt.
const nowMark = "@NOW@"

// agentFailureLineHeard is agentFailureLine with the failed agent last
// heard from at heard (RFC 3339, or nowMark).
func agentFailureLineHeard(coord, failed, class string, ranks string, latency float64, heard string) string {
	return agentFailureLineQuorum(coord, failed, class, ranks, latency, heard, class != "hang")
}

// agentFailureLineQuorum is agentFailureLineHeard with or without the
// quorum evidence (3 of 4 agents) that the detector logs with a node or
// agent verdict.
func agentFailureLineQuorum(coord, failed, class string, ranks string, latency float64, heard string, quorum bool) string {
	r := ""
	if ranks != "" {
		r = `"ranks":[` + ranks + `],`
	}
	if quorum {
		r += `"quorum":true,"votes":3,"agents":4,`
	}
	return fmt.Sprintf(`{"v":1,"kind":"failure","node":%q,"time":%q,"failure":{"failed_node":%q,"class":%q,%s"latency_ns":%d,"last_heard":%q,"detected_at":%q,"reporter":"n3","coordinator":%q,"confirmed_by":["n4"],"cause":"the agent of %s is unreachable"}}`,
		coord, nowMark, failed, class, r, int64(latency*1e9), heard, nowMark, coord, failed)
}

// notResponding is Slurm calling node not responding (from the first
// attempt on), every other node allocated.
func notResponding(node string) func(int, []string) map[string]string {
	return func(_ int, nodes []string) map[string]string {
		out := map[string]string{}
		for _, n := range nodes {
			out[n] = "ALLOCATED"
			if n == node {
				out[n] = "ALLOCATED*+NOT_RESPONDING"
			}
		}
		return out
	}
}

// TestRunAgentsVerdict: a failure the agents publish while the step runs
// stops it at once (srun would notice a lost node half a minute later),
// and the failure_detected event carries their class and detection
// latency; a lost spare only leaves the plan.
func TestRunAgentsVerdict(t *testing.T) {
	alloc := []string{"n1", "n2", "n3", "n4", "n5"}
	for _, tc := range []struct {
		name      string
		first     fakeAttempt
		relaunch  []string // the relaunch's nodes in rank order
		kind      string
		by        string
		ranks     []int
		probed    []string
		stopped   string   // "yes": reft run cancelled the step and signalled srun; "no"; "": either (a race)
		killed    bool     // srun got SIGKILL at once, no SIGTERM (a node verdict: failGrace)
		shrunk    []string // the nodes the job kept (nil: not shrunk)
		noSpare   bool     // the allocation is the step's four nodes: a lost node requeues the job
		twoSpares bool     // n1-n6, two spares
		excluded  []string
		comment   string                                        // prefix
		relaunchW string                                        // prefix of the relaunch's cause
		states    func(n int, nodes []string) map[string]string // Slurm's node states (nil: all allocated)
		causeHas  string                                        // in the failure's cause
	}{
		{name: "node lost", killed: true,
			first:    fakeAttempt{block: true, agentLog: map[string][]string{"n1": {agentFailureLine("n1", "n2", "node", "", 0.8)}}},
			relaunch: []string{"n1", "n5", "n3", "n4"}, kind: recoverylog.KindNode, by: "agents",
			probed: []string{"n1", "n3", "n4", "n5"}, stopped: "yes", excluded: []string{"n2"}, shrunk: []string{"n1", "n3", "n4", "n5"},
			comment: "reft: 1 failure (node n2 lost, replaced by n5)", relaunchW: "node failure: n5 in n2's place",
			causeHas: "Slurm calls n2 healthy (State=ALLOCATED), but 3 of the job's 4 agents cannot reach it (a quorum)"},
		{name: "node verdict without quorum, Slurm calls it healthy",
			first: fakeAttempt{block: true, agentLog: map[string][]string{"n1": {
				agentFailureLineQuorum("n1", "n2", "node", "", 0.8, nowMark, false)}}},
			relaunch: []string{"n1", "n2", "n3", "n4"}, kind: recoverylog.KindAgent, by: "agents",
			probed: []string{"n1", "n2", "n3", "n4"}, stopped: "yes",
			comment: "reft: 1 failure (agent on n2)", relaunchW: "suspected node n2 kept",
			causeHas: "suspect, not lost: the verdict carries no quorum of the agents and Slurm calls n2 healthy (State=ALLOCATED)"},
		{name: "node verdict without quorum, Slurm agrees", killed: true,
			first: fakeAttempt{block: true, agentLog: map[string][]string{"n1": {
				agentFailureLineQuorum("n1", "n2", "node", "", 0.8, nowMark, false)}}},
			relaunch: []string{"n1", "n5", "n3", "n4"}, kind: recoverylog.KindNode, by: "agents", states: notResponding("n2"),
			probed: []string{"n1", "n3", "n4", "n5"}, stopped: "yes", excluded: []string{"n2"}, shrunk: []string{"n1", "n3", "n4", "n5"},
			comment: "reft: 1 failure (node n2 lost, replaced by n5)", relaunchW: "node failure: n5 in n2's place",
			causeHas: "Slurm agrees: n2 not responding"},
		{name: "spare suspected without quorum, then a rank",
			first: fakeAttempt{exit: 143, stderr: killed2,
				agentLog: map[string][]string{"n1": {agentFailureLineQuorum("n1", "n5", "node", "", 0.8, nowMark, false)}}},
			relaunch: []string{"n1", "n2", "n3", "n4"}, kind: recoverylog.KindRank, by: "srun", ranks: []int{2},
			probed: []string{"n1", "n2", "n3", "n4"}, stopped: "no", excluded: nil,
			comment: "reft: 1 failure (rank 2 on n3)", relaunchW: "rank failure: same nodes"},
		{name: "two nodes lost together", twoSpares: true, killed: true,
			first: fakeAttempt{block: true, agentLog: map[string][]string{"n1": {
				agentFailureLine("n1", "n2", "node", "", 0.8), agentFailureLine("n1", "n3", "node", "", 0.9)}}},
			relaunch: []string{"n1", "n5", "n6", "n4"}, kind: recoverylog.KindNode, by: "agents",
			probed: []string{"n1", "n4", "n5", "n6"}, stopped: "yes", excluded: []string{"n2", "n3"}, shrunk: []string{"n1", "n4", "n5", "n6"},
			comment: "reft: 1 failure (nodes n2,n3 lost, replaced by n5,n6)", relaunchW: "node failure: n5 in n2's place, n6 in n3's place"},
		{name: "node lost, no spare", noSpare: true, killed: true,
			first: fakeAttempt{block: true, agentLog: map[string][]string{"n1": {agentFailureLine("n1", "n2", "node", "", 0.8)}}},
			kind:  recoverylog.KindNode, by: "agents",
			probed: []string{"n1", "n3", "n4"}, stopped: "yes", excluded: nil,
			comment: "reft: 1 failure (node n2 lost), no spare left, job requeued"},
		{name: "hang",
			first:    fakeAttempt{block: true, agentLog: map[string][]string{"n2": {agentFailureLine("n2", "n3", "hang", "2", 600)}}},
			relaunch: []string{"n1", "n2", "n3", "n4"}, kind: recoverylog.KindHang, by: "agents", ranks: []int{2},
			probed: []string{"n1", "n2", "n3", "n4"}, stopped: "yes",
			comment: "reft: 1 failure (hang of rank(s) 2 on n3)", relaunchW: "hang: same nodes"},
		{name: "agent killed", // srun and the agents see it at about the same time
			first: fakeAttempt{exit: 1, stderr: []string{"srun: error: n2: task 1: Exited with exit code 1"},
				agentLog: map[string][]string{"n1": {agentFailureLine("n1", "n2", "agent", "", 0.05)}}},
			relaunch: []string{"n1", "n2", "n3", "n4"}, kind: recoverylog.KindAgent, by: "agents",
			probed:  []string{"n1", "n2", "n3", "n4"},
			comment: "reft: 1 failure (agent on n2)", relaunchW: "agent failure: same nodes"},
		{name: "spare lost, then a rank",
			first: fakeAttempt{exit: 143, stderr: killed2,
				agentLog: map[string][]string{"n1": {agentFailureLine("n1", "n5", "node", "", 0.8)}}},
			relaunch: []string{"n1", "n2", "n3", "n4"}, kind: recoverylog.KindRank, by: "srun", ranks: []int{2},
			probed: []string{"n1", "n2", "n3", "n4"}, stopped: "no", excluded: []string{"n5"},
			comment: "reft: 1 failure (rank 2 on n3)", relaunchW: "rank failure: same nodes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			al, spares, want := alloc, 1, ExitOK
			if tc.noSpare {
				al, spares, want = four, 0, ExitRequeued
			}
			if tc.twoSpares {
				al, spares = append(slices.Clone(alloc), "n6"), 2
			}
			h := newHarness(t, al, spares, fastPolicy(), tc.first,
				fakeAttempt{exit: 0, agentLog: resumeLogs("2", 5, tc.relaunch...)})
			h.f.states = tc.states
			// The batch script's allocation variables, as sbatch sets them.
			h.r.Env = append(h.r.Env, "SLURM_JOB_NODELIST="+hostlist.Compress(al), "SLURM_NNODES="+strconv.Itoa(len(al)),
				"SLURM_JOB_CPUS_PER_NODE=2(x"+strconv.Itoa(len(al))+")", "SLURM_TASKS_PER_NODE=1(x"+strconv.Itoa(len(al))+")", "SLURM_NTASKS="+strconv.Itoa(len(al)))
			if code := h.r.Run(context.Background()); code != want {
				t.Fatalf("exit %d, want %d\n%s", code, want, h.out.String())
			}
			checkResizedEnv(t, h.f.envs, al, tc.shrunk)
			ev := h.events()
			fs := find(ev, recoverylog.FailureDetected)
			if len(fs) != 1 {
				t.Fatalf("failure_detected events %+v\n%s", fs, h.out.String())
			}
			f := fs[0]
			if f.Kind != tc.kind || f.DetectedBy != tc.by || !slices.Equal(f.Ranks, tc.ranks) || f.Generation != 6 {
				t.Errorf("failure_detected %+v; want kind %s by %s, ranks %v", f, tc.kind, tc.by, tc.ranks)
			}
			if !strings.Contains(f.Cause, tc.causeHas) {
				t.Errorf("failure_detected cause %q, want it to say %q", f.Cause, tc.causeHas)
			}
			if tc.by == "agents" {
				if f.DetectionS == nil || *f.DetectionS <= 0 || !strings.Contains(f.Cause, "the agents' failure detector") ||
					!strings.Contains(f.Cause, "coordinator n1") && !strings.Contains(f.Cause, "coordinator n2") {
					t.Errorf("failure_detected %+v: want the agents' latency and cause", f)
				}
			} else if f.DetectionS != nil {
				t.Errorf("failure_detected %+v: a latency without the agents' verdict", f)
			}
			if rl := find(ev, recoverylog.StepRelaunched); tc.noSpare && (len(rl) != 0 || h.f.requeued != 1) {
				t.Errorf("relaunches %+v, requeues %d: want a requeue", rl, h.f.requeued)
			} else if !tc.noSpare && (len(rl) != 1 || !slices.Equal(rl[0].Nodes, tc.relaunch) || !strings.HasPrefix(rl[0].Cause, tc.relaunchW)) {
				t.Errorf("step_relaunched %+v; want %v (%s)", rl, tc.relaunch, tc.relaunchW)
			}
			if len(h.f.probed) != 1 || !slices.Equal(h.f.probed[0], tc.probed) {
				t.Errorf("probed %v, want %v", h.f.probed, tc.probed)
			}
			term, kill := slices.Contains(h.f.signals, os.Signal(syscall.SIGTERM)), slices.Contains(h.f.signals, os.Signal(syscall.SIGKILL))
			stopped := map[bool]string{true: "yes", false: "no"}[slices.Contains(h.f.cancelled, "42.0") && (term || kill)]
			if tc.stopped != "" && stopped != tc.stopped {
				t.Errorf("step cancelled %v, srun signalled %v; want stopped=%v", h.f.cancelled, h.f.signals, tc.stopped)
			}
			if tc.stopped == "yes" && (tc.killed != (kill && !term)) {
				t.Errorf("srun signalled %v; want SIGKILL at once: %v", h.f.signals, tc.killed)
			}
			if tc.shrunk == nil && len(h.f.shrunk) > 0 || tc.shrunk != nil && (len(h.f.shrunk) != 1 || !slices.Equal(h.f.shrunk[0], tc.shrunk)) {
				t.Errorf("job shrunk to %v, want %v", h.f.shrunk, tc.shrunk)
			}
			// After a shrink every agent left restarts (their ports follow the allocation).
			if tc.shrunk == nil && len(h.f.stopped) > 0 || tc.shrunk != nil && (len(h.f.stopped) != 1 || !slices.Equal(h.f.stopped[0], tc.shrunk)) {
				t.Errorf("agents stopped on %v, want %v", h.f.stopped, tc.shrunk)
			}
			if !slices.Equal(h.r.Plan.Excluded, tc.excluded) {
				t.Errorf("excluded %v, want %v", h.r.Plan.Excluded, tc.excluded)
			}
			if c := h.f.comments[len(h.f.comments)-1]; !strings.HasPrefix(c, tc.comment) {
				t.Errorf("comment %q, want %q...", c, tc.comment)
			}
		})
	}
}

// TestRunIgnoresForgedVerdict: the log directory is shared by every
// user, so another user's failure_detected line in a log not named after
// a node of the allocation must not stop, shrink or requeue the job
// (issue 14, finding 4). The forged verdict (n2 lost) is in n0.record,
// read before the real one (a hang on n3, from n1's agent): reft run acts
// on the real one only, relaunching on the same nodes.
func TestRunIgnoresForgedVerdict(t *testing.T) {
	alloc := []string{"n1", "n2", "n3", "n4", "n5"}
	forged := agentFailureLine("n0", "n2", "node", "", 0.8)
	h := newHarness(t, alloc, 1, fastPolicy(),
		fakeAttempt{block: true, agentLog: map[string][]string{
			"n0": {forged},
			"n1": {agentFailureLine("n1", "n3", "hang", "2", 600)},
		}},
		fakeAttempt{exit: 0, agentLog: resumeLogs("2", 5, four...)})
	if code := h.r.Run(context.Background()); code != ExitOK {
		t.Fatalf("exit %d\n%s", code, h.out.String())
	}
	fs := find(h.events(), recoverylog.FailureDetected)
	if len(fs) != 1 || fs[0].Kind != recoverylog.KindHang {
		t.Fatalf("failure_detected %+v, want the real hang only\n%s", fs, h.out.String())
	}
	if len(h.f.shrunk) != 0 || h.f.requeued != 0 || len(find(h.events(), recoverylog.NodeExcluded)) != 0 {
		t.Fatalf("the forged verdict acted: shrunk %v, requeued %d, events %v", h.f.shrunk, h.f.requeued, names(h.events()))
	}
	if rl := find(h.events(), recoverylog.StepRelaunched); len(rl) != 1 || !slices.Equal(rl[0].Nodes, four) {
		t.Fatalf("relaunched %+v, want the same four nodes", rl)
	}
}

// TestRecoveryPhases: a recovery's phases run end to end from the failure
// to the last restore, so they add up to the resumed event's duration; a
// phase the clocks make negative is 0; without the failed attempt's marks
// (a first launch, a requeued job's) there are none.
func TestRecoveryPhases(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 9, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	for _, tc := range []struct {
		name                string
		a                   attempt
		registered, restore time.Time
		want                *recoverylog.Phases
	}{
		{"node lost, spare", attempt{failedAt: at(0), start: at(4.5),
			marks: recoveryMarks{stopped: at(2), probed: at(3.25), replaced: at(3.5)}}, at(7), at(7.5),
			&recoverylog.Phases{StopS: 2, ProbeS: 1.25, ReplaceS: 0.25, BackoffS: 1, LaunchS: 2.5, RestoreS: 0.5}},
		{"a skewed agent clock: its registration before the launch", attempt{failedAt: at(0), start: at(4),
			marks: recoveryMarks{stopped: at(1), probed: at(2), replaced: at(2)}}, at(3.5), at(5),
			&recoverylog.Phases{StopS: 1, ProbeS: 1, ReplaceS: 0, BackoffS: 2, LaunchS: 0, RestoreS: 1.5}},
		{"first launch", attempt{start: at(0)}, at(1), at(2), nil},
		{"requeued job", attempt{failedAt: at(0), start: at(30)}, at(31), at(32), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.a.phases(tc.registered, tc.restore)
			if (got == nil) != (tc.want == nil) || got != nil && *got != *tc.want {
				t.Fatalf("phases %+v, want %+v", got, tc.want)
			}
			if got != nil && tc.registered.After(tc.a.start) {
				sum := got.StopS + got.ProbeS + got.ReplaceS + got.BackoffS + got.LaunchS + got.RestoreS
				if d := tc.restore.Sub(tc.a.failedAt).Seconds(); sum != d {
					t.Errorf("phases add up to %g s, the recovery took %g s", sum, d)
				}
			}
		})
	}
}

// checkResizedEnv: the first launch gets the allocation's variables as
// sbatch set them; a relaunch after a shrink gets the kept nodes' (as
// Slurm's resize script sets them), and without a shrink the same as the
// first.
func checkResizedEnv(t *testing.T, envs [][]string, alloc, shrunk []string) {
	t.Helper()
	get := func(env []string, k string) (string, bool) {
		for _, kv := range env {
			if v, ok := strings.CutPrefix(kv, k+"="); ok {
				return v, true
			}
		}
		return "", false
	}
	for i, env := range envs {
		nodes, ntasks, tasks := alloc, true, true
		if i > 0 && shrunk != nil {
			nodes, ntasks, tasks = shrunk, false, false
		}
		sorted := slices.Clone(nodes)
		slices.Sort(sorted) // n1..n6: Slurm's order is the names'
		want := map[string]string{"SLURM_JOB_NODELIST": hostlist.Compress(sorted), "SLURM_NNODES": strconv.Itoa(len(nodes)),
			"SLURM_JOB_CPUS_PER_NODE": "2(x" + strconv.Itoa(len(nodes)) + ")"}
		for k, w := range want {
			if v, _ := get(env, k); v != w {
				t.Errorf("launch %d: %s=%q, want %q", i, k, v, w)
			}
		}
		if _, ok := get(env, "SLURM_NTASKS"); ok != ntasks {
			t.Errorf("launch %d: SLURM_NTASKS set %v, want %v", i, ok, ntasks)
		}
		if _, ok := get(env, "SLURM_TASKS_PER_NODE"); ok != tasks {
			t.Errorf("launch %d: SLURM_TASKS_PER_NODE set %v, want %v", i, ok, tasks)
		}
		if _, ok := get(env, "SLURM_NODELIST"); ok {
			t.Errorf("launch %d: SLURM_NODELIST set; only variables already set are rewritten", i)
		}
	}
}

func TestResizedEnv(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  []string
		held []string
		want []string // nil: an error
		err  string
	}{
		{name: "sbatch's variables",
			env:  []string{"A=1", "SLURM_JOB_NODELIST=n[1-5]", "SLURM_NODELIST=n[1-5]", "SLURM_NNODES=5", "SLURM_JOB_NUM_NODES=5", "SLURM_JOB_CPUS_PER_NODE=2(x5)", "SLURM_TASKS_PER_NODE=1(x5)", "SLURM_NTASKS=5", "SLURM_NPROCS=5"},
			held: []string{"n5", "n1", "n3", "n4"},
			want: []string{"A=1", "SLURM_JOB_NODELIST=n[1,3-5]", "SLURM_NODELIST=n[1,3-5]", "SLURM_NNODES=4", "SLURM_JOB_NUM_NODES=4", "SLURM_JOB_CPUS_PER_NODE=2(x4)"}},
		{name: "unequal CPUs keep their nodes'",
			env:  []string{"SLURM_JOB_NODELIST=a1,b[1-3]", "SLURM_JOB_CPUS_PER_NODE=8,4(x2),2"},
			held: []string{"a1", "b3"},
			want: []string{"SLURM_JOB_NODELIST=a1,b3", "SLURM_JOB_CPUS_PER_NODE=8,2"}},
		{name: "only what is set",
			env:  []string{"SLURM_NODELIST=n[1-3]", "PATH=/bin"},
			held: []string{"n2"},
			want: []string{"SLURM_NODELIST=n2", "PATH=/bin"}},
		{name: "a node not in the list", env: []string{"SLURM_JOB_NODELIST=n[1-3]"}, held: []string{"n9"}, err: "node n9 is not in SLURM_JOB_NODELIST=n[1-3]"},
		{name: "no list", env: []string{"PATH=/bin"}, held: []string{"n1"}, err: "neither SLURM_JOB_NODELIST nor SLURM_NODELIST is set"},
		{name: "bad CPU counts", env: []string{"SLURM_JOB_NODELIST=n[1-2]", "SLURM_JOB_CPUS_PER_NODE=2(xz)"}, held: []string{"n1"}, err: "bad count item \"2(xz)\""},
		{name: "CPU counts of another list", env: []string{"SLURM_JOB_NODELIST=n[1-3]", "SLURM_JOB_CPUS_PER_NODE=2(x2)"}, held: []string{"n1"}, err: "counts 2 nodes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := resizedEnv(tc.env, tc.held)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("resizedEnv: %v, want an error saying %q", err, tc.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("resizedEnv = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
