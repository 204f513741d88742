package run

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/agent/logging"
	"github.com/reft-hpc/reft/launcher/recoverylog"
)

// Runner launches the step, watches it and relaunches it. Run is its loop.
type Runner struct {
	Slurm    Slurm
	Log      *recoverylog.Writer
	Stdout   io.Writer // the step's stdout
	Stderr   io.Writer // the step's stderr and reft run's own messages
	Env      []string  // the environment srun gets (SLURM_HOSTFILE is added)
	Job      string
	Restart  int    // SLURM_RESTART_COUNT
	Spec     string // canonical SPEC of the step
	Plan     Plan
	Policy   config.Run
	Srun     string
	SrunOpts []string
	// SlurmRelease is srun's release (Slurm.Release); the zero value means
	// 22.05's command line.
	SlurmRelease Release
	Command      []string
	// JobLogDir is <log dir>/<job>: the agents' run records
	// (agent/runrecord) are read there, and the hostfiles written.
	JobLogDir string
	Signals   <-chan os.Signal
	// Tick is how often a running step is looked at (step id, restores).
	Tick time.Duration
	// StopGrace is how long srun may take to end the step after SIGTERM
	// before reft run cancels the step and kills srun.
	StopGrace time.Duration
	Now       func() time.Time
	// Health, when set, is asked every HealthEvery (0:
	// DefaultHealthEvery) while a step runs; each straggler goes to the
	// recovery log once per launch, each degraded node when its warnings
	// change (healthWatch).
	Health      HealthSource
	HealthEvery time.Duration
	healthOff   error // why Health is nil, said once at the start
	// Prior are the recovery events of the job's earlier runs (before a
	// requeue): the Comment keeps counting them, and a run after a
	// requeue is a recovery like a relaunch.
	Prior []recoverylog.Event

	events  []recoverylog.Event
	sayMu   sync.Mutex
	comment string
	warned  map[string]bool
	// held: the nodes the job holds after reft run's last shrink (nil:
	// none yet); later launches get the resized environment (resizedEnv).
	held []string
}

// attempt is one launch of the step.
type attempt struct {
	relaunch  int
	start     time.Time
	stepID    string // "42.3"; "" until known
	announced bool
	resumed   bool
	outcome   Outcome
	// For a relaunch: when the failure it recovers from was detected, the
	// newest snapshot committed then, and how the relaunch recovers.
	failedAt        time.Time
	newestAtFailure int64
	committedKnown  bool // some agent answered after the failure
	why             string
	// agentFailure is the agents' published verdict on this attempt's
	// failure (nil: none); seenFailures counts the published failures
	// already looked at.
	agentFailure *AgentFailure
	seenFailures int
	// verdictAt: when reft run read agentFailure; alsoLost: the other
	// nodes of the step the agents found lost within verdictSettle of it
	// (two nodes of a rack, lost together).
	verdictAt time.Time
	alsoLost  []AgentFailure
	// shrunk: the lost node was given back to Slurm, and the job now
	// holds these nodes.
	shrunk []string
	// ended: when srun exited; marks: for a relaunch, when its failed
	// attempt's phases ended (the resumed event's Phases).
	ended time.Time
	marks recoveryMarks
}

// recoveryMarks are the ends of the phases of a recovery that happen
// before the relaunch starts: srun's exit, the failure known (probe), the
// nodes replaced. Zero for a first launch, or a requeued job's.
type recoveryMarks struct {
	stopped, probed, replaced time.Time
}

// phases splits the recovery of a, whose ranks all registered at
// registered and all restored at restored (the agents' records).
func (a *attempt) phases(registered, restored time.Time) *recoverylog.Phases {
	m := a.marks
	if m.stopped.IsZero() || a.failedAt.IsZero() {
		return nil
	}
	d := func(from, to time.Time) float64 { return max(0, to.Sub(from).Seconds()) }
	return &recoverylog.Phases{
		StopS: d(a.failedAt, m.stopped), ProbeS: d(m.stopped, m.probed), ReplaceS: d(m.probed, m.replaced),
		BackoffS: d(m.replaced, a.start), LaunchS: d(a.start, registered), RestoreS: d(registered, restored),
	}
}

// stepSuffix is the step part of "42.3", as the agents' records have it.
func stepSuffix(id string) string {
	_, s, _ := strings.Cut(id, ".")
	return s
}

func (r *Runner) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// say writes one line to Stderr; it may be called from the probe's
// goroutine too (settleAndProbe), so lines are written whole, one at a time.
func (r *Runner) say(format string, a ...any) {
	r.sayMu.Lock()
	defer r.sayMu.Unlock()
	fmt.Fprintf(r.Stderr, "reft run: "+format+"\n", a...)
}

func (r *Runner) warnOnce(key, format string, a ...any) {
	if r.warned == nil {
		r.warned = map[string]bool{}
	}
	if !r.warned[key] {
		r.warned[key] = true
		r.say("warning: "+format, a...)
	}
}

// emit writes an event, tells the user, and refreshes the Comment.
func (r *Runner) emit(ctx context.Context, e recoverylog.Event) {
	if e.Time.IsZero() {
		e.Time = r.now()
	}
	e.Job, e.Restart, e.Spec = r.Job, r.Restart, r.Spec
	if err := r.Log.Write(e); err != nil {
		r.warnOnce("log", "%v; the recovery log misses events from here on", err)
	}
	r.events = append(r.events, e)
	r.say("%s", recoverylog.Format(e))
	if s := recoverylog.Summarize(r.events); s != "" && s != r.comment {
		if err := r.Slurm.SetComment(ctx, r.Job, s); err != nil {
			r.warnOnce("comment", "cannot keep the summary in the job's Comment: %v", err)
		} else {
			r.comment = s
		}
	}
}

func (r *Runner) event(name string, relaunch int) recoverylog.Event {
	return recoverylog.Event{Event: name, Relaunch: relaunch, Generation: -1}
}

// Backoff is the wait before a relaunch after stalled relaunches in a row
// without progress: base, doubled each time, at most max.
func Backoff(base, max time.Duration, stalled int) time.Duration {
	d := base
	for i := 0; i < stalled && d < max; i++ {
		d *= 2
	}
	return min(d, max)
}

// relaunchDelay is the wait before a relaunch: Backoff, except for the
// first relaunch in a row (stalled 0) after spares took lost nodes' slots
// (swapped). The backoff keeps a failure that comes back at once (a bad
// build, a bad node, a file system hiccup) from spinning relaunches; a
// node swap already removed the failed part, the relaunch runs on other
// hardware, and the probe step has just shown that Slurm launches steps
// on the shrunk allocation. If the swap does not help, the next failure
// finds stalled > 0 and the backoff applies again, doubled as before.
func relaunchDelay(base, max time.Duration, stalled int, swapped bool) time.Duration {
	if swapped && stalled == 0 {
		return 0
	}
	return Backoff(base, max, stalled)
}

// Run runs the step until it completes, reft run gives up or requeues the
// job, or a signal stops it; it returns reft run's exit code.
func (r *Runner) Run(ctx context.Context) int {
	if r.Tick <= 0 {
		r.Tick = 250 * time.Millisecond
	}
	if r.StopGrace <= 0 {
		r.StopGrace = time.Minute
	}
	watcher := NewWatcher(r.JobLogDir, r.Plan.Alloc)
	if r.Spec == "off" {
		r.say("warning: --reft=off: the step takes no snapshots, so every relaunch starts over")
	}
	if r.healthOff != nil {
		r.say("warning: stragglers and degraded nodes will not be in the recovery log: %v", r.healthOff)
	}
	var (
		relaunch          int
		stalled           int
		committedAtLaunch int64 = -1
		began                   = r.now()
		next                    = &attempt{newestAtFailure: -1}
	)
	r.events = append(r.events[:0:0], r.Prior...)
	if f, ok := requeuedAfter(r.Prior); ok {
		// The job was requeued after a failure: this run's first launch
		// recovers from it, as a relaunch would, with the time and the
		// snapshot of that failure.
		next = &attempt{failedAt: f.Time, newestAtFailure: f.Generation, committedKnown: f.Generation >= 0,
			why: "the job was requeued after " + recoverylog.Describe(f)}
	}
	for {
		a := next
		a.relaunch, a.start = relaunch, r.now()
		if err := watcher.Mark(); err != nil {
			r.warnOnce("watch", "%v; resumption will not be observed", err)
		}
		code, sig, err := r.runAttempt(ctx, a, watcher)
		if err != nil {
			r.say("%v", err)
			return ExitError
		}
		if sig != nil {
			return r.stopped(ctx, a, sig)
		}
		if code == 0 {
			e := r.event(recoverylog.Completed, relaunch)
			e.Step, e.DurationS, e.ExitCode = a.stepID, r.now().Sub(began).Seconds(), ptr(0)
			e.Cause = "srun exited 0"
			r.emit(ctx, e)
			return ExitOK
		}

		// The step failed: what failed, and what was committed?
		failedAt := a.outcome.FirstError
		if failedAt.IsZero() {
			failedAt = r.now()
		}
		var h Health
		if a.agentFailure != nil {
			h = r.settleAndProbe(ctx, a, watcher)
		} else {
			h = r.health(ctx, a)
		}
		if a.agentFailure == nil { // published while srun was ending, or the probe ran
			r.checkAgents(ctx, a, watcher)
		}
		marks := recoveryMarks{stopped: a.ended}
		f := Classify(a.outcome, r.Plan, h)
		detectedBy := "srun"
		if af := a.agentFailure; af != nil {
			f, detectedBy = FromAgents(*af, a.alsoLost...), "agents"
			if failedAt.IsZero() || af.DetectedAt.Before(failedAt) {
				failedAt = af.DetectedAt
			}
		}
		newest, bytes, known := Committed(h)
		fe := r.event(recoverylog.FailureDetected, relaunch)
		fe.Time, fe.Step, fe.Kind, fe.Nodes, fe.Ranks, fe.Cause = failedAt, a.stepID, f.Kind, f.Nodes, f.Ranks, f.Cause
		fe.DetectedBy = detectedBy
		if af := a.agentFailure; af != nil {
			fe.DetectionS = ptr(af.Latency.Seconds())
		}
		if s := SilentAgents(h, f); s != "" {
			fe.Cause += "; also no agent answer from " + s
		}
		if !known {
			fe.Cause += "; no agent answered, so the newest committed snapshot is unknown"
		}
		fe.Generation, fe.Bytes, fe.ExitCode = newest, bytes, ptr(a.outcome.Exit)
		fe.DurationS = failedAt.Sub(a.start).Seconds()
		if len(f.Nodes) == 1 {
			fe.Node = f.Nodes[0]
		}
		fe.Level = "warn"
		marks.probed = r.now()
		r.emit(ctx, fe)
		next = &attempt{failedAt: failedAt, newestAtFailure: newest, committedKnown: known, why: relaunchWhy(f)}
		if af := a.agentFailure; af != nil && af.Suspect {
			next.why = "suspected node " + af.Node + " kept (the agents' verdict has no quorum and Slurm calls it healthy): same nodes"
		}

		// Progress: a relaunched attempt must have committed something newer
		// than what existed when it started. Without an agent's answer there
		// is no verdict either way; the relaunch limit still holds.
		if relaunch > 0 && known {
			if newest > committedAtLaunch {
				stalled = 0
			} else {
				stalled++
			}
		}
		if relaunch > 0 && stalled >= r.Policy.MaxStalled {
			return r.gaveUp(ctx, relaunch, ExitStalled, fmt.Sprintf("%d relaunch(es) in a row committed no snapshot newer than %s (run.max_stalled = %d); the last failure: %s",
				stalled, genText(committedAtLaunch), r.Policy.MaxStalled, recoverylog.Describe(fe)+": "+f.Cause))
		}
		if relaunch >= r.Policy.MaxRestarts {
			return r.gaveUp(ctx, relaunch, ExitLimit, fmt.Sprintf("relaunch limit reached: %d relaunch(es) (run.max_restarts / --max-restarts = %d)",
				relaunch, r.Policy.MaxRestarts))
		}

		swapped := false
		if f.Kind == recoverylog.KindNode {
			why, sw, code, done := r.replaceNodes(ctx, relaunch, f)
			if done {
				return code
			}
			next.why, swapped = why, sw
		}
		marks.replaced = r.now()
		next.marks = marks

		delay := relaunchDelay(r.Policy.Backoff.D(), r.Policy.BackoffMax.D(), stalled, swapped)
		if sig := r.wait(delay); sig != nil {
			return r.stopped(ctx, a, sig)
		}
		if known {
			committedAtLaunch = newest
		}
		relaunch++
	}
}

// relaunchWhy says how a relaunch after f recovers.
func relaunchWhy(f Failure) string {
	switch f.Kind {
	case recoverylog.KindRank:
		return "rank failure: same nodes, every rank restores from its node's snapshots"
	case recoverylog.KindAgent:
		return "agent failure: same nodes; the step starts a new agent, which re-indexes the node's snapshots"
	case recoverylog.KindHang:
		return "hang: same nodes, every rank restores from its node's snapshots"
	}
	return f.Kind + " failure: same nodes"
}

func genText(g int64) string {
	if g < 0 {
		return "none"
	}
	return "step " + strconv.FormatInt(g, 10)
}

func ptr[T any](v T) *T { return &v }

// runAttempt launches the step once and follows it until srun exits or a
// signal arrives (sig != nil: srun is still running then).
func (r *Runner) runAttempt(ctx context.Context, a *attempt, w *Watcher) (code int, sig os.Signal, err error) {
	argv, env, err := r.argv(a.relaunch)
	if err != nil {
		return 0, nil, err
	}
	before, serr := r.Slurm.Steps(ctx, r.Job)
	if serr != nil {
		r.warnOnce("steps", "cannot list the job's steps (%v); events will not name the step", serr)
	}
	// The outcome is written by srun's stderr reader only, and read after
	// srun has exited (done orders the two).
	outcome := &a.outcome
	proc, err := r.Slurm.Start(Launch{Argv: argv, Env: env, Stdout: r.Stdout, Stderr: r.Stderr,
		OnStderr: outcome.Scan})
	if err != nil {
		return 0, nil, fmt.Errorf("cannot launch the step: %w (is srun on PATH? --srun names it)", err)
	}
	done := make(chan int, 1)
	go func() { done <- proc.Wait() }()
	tick := time.NewTicker(r.Tick)
	defer tick.Stop()
	var killAt time.Time // srun is killed then, after the agents' verdict stopped the step
	var sw *healthWatch
	if r.Health != nil {
		sw = newHealthWatch(r.Health, r.HealthEvery)
		sw.last = r.now() // the first ask one period in: the ranks need steps to be measured
	}
	for {
		select {
		case res := <-sw.results():
			r.recordHealth(ctx, a, sw, res)
		case s := <-r.Signals:
			r.stopStep(ctx, a, proc, done, s)
			return 0, s, nil
		case c := <-done:
			outcome.Exit, a.ended = c, r.now()
			r.follow(ctx, a, w, before, serr == nil, true)
			return c, nil, nil
		case <-tick.C:
			r.follow(ctx, a, w, before, serr == nil, false)
			sw.tick(ctx, r.now())
			switch {
			case a.agentFailure == nil:
				if r.checkAgents(ctx, a, w) {
					if g := r.failStep(ctx, a, proc); g > 0 {
						killAt = r.now().Add(g)
					}
				}
			case !killAt.IsZero() && r.now().After(killAt):
				r.say("srun outlived the step's cancellation by %s; killing it", min(r.StopGrace, failStopGrace))
				proc.Signal(syscall.SIGKILL)
				killAt = time.Time{}
			}
		}
	}
}

// failStopGrace bounds how long srun may take to end a step that the
// agents found failed and reft run cancelled: srun waits for every node's
// slurmd to confirm the end, which a lost node's never does (seen on the
// test cluster: srun outlived a 10 s grace). The live nodes end their
// tasks within a second of the cancel.
const failStopGrace = 2 * time.Second

// failGrace is how long srun may take to end a step that the agents'
// verdict f stopped (cancelled: the step was cancelled in Slurm) before
// reft run kills it; 0 kills it at once.
//
// At once after a node verdict on a cancelled step: srun would only wait
// for the lost node's slurmd, which never answers (failStopGrace), and
// nothing in that wait protects the state. The cancel, not srun, ends
// the survivors' tasks; their last saves (the JIT flush on the agents'
// notice or the cancel's SIGTERM) go to their agents, which the probe
// stops only once the ranks have let go (waitRanksGone), and the agents'
// verdict, not srun's last lines, classifies the failure.
//
// The grace stays where srun is still needed or may say something new:
// the step's cancel failed or its id is unknown (srun's SIGTERM is then
// what ends the step; killing srun would leave it running), or no node
// is lost (a hang, an agent, a suspect node kept): every slurmd answers,
// srun ends within a second and forwards the tasks' last output and exit
// codes.
func failGrace(f AgentFailure, cancelled bool, stopGrace time.Duration) time.Duration {
	if cancelled && f.Class == recoverylog.KindNode && !f.Suspect {
		return 0
	}
	return min(stopGrace, failStopGrace)
}

// stale says whether f concerns an agent or ranks that were last heard
// from before start, the launch of the attempt being watched: the new
// attempt's agents and ranks only begin after it. A node verdict is never
// stale: a node that was lost stays lost. (Agents' and reft run's clocks
// are the nodes' clocks; a skew below the agents' start time is harmless.)
func stale(f AgentFailure, start time.Time) bool {
	return f.Class != recoverylog.KindNode && !f.LastHeard.IsZero() && f.LastHeard.Before(start)
}

// sayBadLines says once that the agents' run records held lines reft run
// refused (another reft release's agents, or a damaged file), and the
// first one's fault: what they said is not acted on.
func (r *Runner) sayBadLines(w *Watcher) {
	if err, n, fresh := w.BadLine(); fresh {
		r.warnOnce("badrecord", "%v; that line and others like it (%d so far) are skipped", err, n)
	}
}

// checkAgents looks for a failure the agents published since the attempt
// began that concerns the step (a node or agent of the step, or its hung
// ranks) and records it in a; a lost spare leaves the plan at once.
func (r *Runner) checkAgents(ctx context.Context, a *attempt, w *Watcher) bool {
	if err := w.Poll(); err != nil {
		// What could be read is used; what not is said once.
		r.warnOnce("watch", "%v; failures in those records are seen only when srun reports them", err)
	}
	r.sayBadLines(w)
	fs := w.Failures()
	for ; a.seenFailures < len(fs); a.seenFailures++ {
		f := fs[a.seenFailures]
		if stale(f, a.start) {
			// The detector's verdict on the agent (or rank) of the step
			// before this one, published after this launch began: srun
			// saw that failure first and this attempt already recovers
			// from it. Acting on it would stop the relaunch (seen on the
			// test cluster: an agent kill cost two relaunches).
			r.say("the agents' verdict on %s (%s, last heard %s) concerns the step before this launch; ignored",
				f.Node, f.Class, f.LastHeard.Format(time.RFC3339Nano))
			continue
		}
		if slices.Contains(r.Plan.Alloc, f.Node) {
			r.crossCheck(ctx, &f)
		}
		if slices.Contains(r.Plan.Slots, f.Node) {
			if a.agentFailure == nil {
				a.agentFailure, a.verdictAt = &f, r.now()
				continue // the rest may be nodes lost with it
			}
			if f.Class == recoverylog.KindNode && !slices.Contains(a.lostNodes(), f.Node) {
				a.alsoLost = append(a.alsoLost, f)
			}
			continue
		}
		if f.Suspect && slices.Contains(r.Plan.Alloc, f.Node) {
			r.say("the agents suspect spare node %s (%s); it stays a spare", f.Node, f.Cause)
			continue
		}
		if f.Class == recoverylog.KindNode && slices.Contains(r.Plan.Alloc, f.Node) && !slices.Contains(r.Plan.Excluded, f.Node) {
			r.Plan.Replace(f.Node) // a spare: never used from now on
			r.say("the agents report spare node %s lost (%s); it will not replace a node", f.Node, f.Cause)
		}
	}
	return a.agentFailure != nil
}

// crossCheck weighs the agents' verdict that a node is lost against
// Slurm's own view before reft run gives the node back or excludes it:
// the agents may be the ones cut off, or a link may have flapped.
//
//   - Slurm calls the node lost (down, not responding, gone): it is lost.
//   - The verdict carries a quorum of the job's agents: it is lost, even
//     though Slurm still calls it healthy (Slurm takes SlurmdTimeout, minutes
//     by default, to notice).
//   - Neither (an agent without quorum evidence, and Slurm calls the node
//     healthy or cannot be asked): the node is only suspect. The verdict
//     becomes an agent failure on a node that is kept: the step is
//     relaunched on the same nodes, and if the node is really gone the
//     relaunch fails and srun and Slurm say so. The cause says why.
func (r *Runner) crossCheck(ctx context.Context, f *AgentFailure) {
	if f.Class != recoverylog.KindNode {
		return
	}
	states, err := r.Slurm.NodeStates(ctx, r.Job, []string{f.Node})
	slurm := ""
	if err != nil {
		slurm = fmt.Sprintf("Slurm could not be asked about %s (%v)", f.Node, err)
	} else {
		st, ok := states[f.Node]
		if why := NodeLost(st); why != "" || !ok {
			if !ok {
				why = NodeLost("")
			}
			f.Cause += "; Slurm agrees: " + f.Node + " " + why
			return
		}
		slurm = fmt.Sprintf("Slurm calls %s healthy (State=%s)", f.Node, st)
	}
	if f.Quorum {
		f.Cause += fmt.Sprintf("; %s, but %d of the job's %d agents cannot reach it (a quorum)", slurm, f.Votes, f.Agents)
		return
	}
	f.Class, f.Suspect = recoverylog.KindAgent, true
	f.Cause += "; suspect, not lost: the verdict carries no quorum of the agents and " + slurm + ", so the node is kept"
	r.say("the agents' verdict that %s is lost carries no quorum and %s: treating %s as suspect, not lost", f.Node, slurm, f.Node)
}

// verdictSettle is how long after the agents' first verdict on a step
// reft run still takes their verdicts on other nodes as part of the same
// failure: of nodes lost together (a rack's power, a switch) one may be
// watched only by another that died, and is found once the ring closes
// over it, a beat or two later; a relaunch that still named it would only
// fail again. srun takes about as long to end the step (failStopGrace).
const verdictSettle = 2 * time.Second

// settle waits out verdictSettle after the first verdict (srun usually
// takes longer to end the step), reads the agents' verdicts once more,
// and gives any further lost node back to Slurm.
func (r *Runner) settle(ctx context.Context, a *attempt, w *Watcher) {
	if d := verdictSettle - r.now().Sub(a.verdictAt); d > 0 {
		time.Sleep(d)
	}
	r.checkAgents(ctx, a, w)
	if len(a.alsoLost) > 0 {
		var names []string
		for _, f := range a.alsoLost {
			names = append(names, f.Node)
		}
		r.say("the agents also found %s lost", strings.Join(names, ","))
		r.giveBack(ctx, a)
	}
}

// lostNodes are the nodes the agents' verdicts on this attempt call lost.
func (a *attempt) lostNodes() []string {
	var out []string
	if f := a.agentFailure; f != nil && f.Class == recoverylog.KindNode {
		out = append(out, f.Node)
	}
	for _, f := range a.alsoLost {
		out = append(out, f.Node)
	}
	return out
}

// giveBack shrinks the job to the allocation without the lost nodes (and
// those excluded before), so that Slurm neither keeps the failed step nor
// makes the relaunch wait until it calls them down. Not without a spare:
// the job is requeued then, and must keep its size.
func (r *Runner) giveBack(ctx context.Context, a *attempt) {
	lost := a.lostNodes()
	if len(lost) == 0 || len(r.Plan.Spares()) == 0 {
		return
	}
	var keep []string
	for _, n := range r.Plan.Alloc {
		if !slices.Contains(lost, n) && !slices.Contains(r.Plan.Excluded, n) {
			keep = append(keep, n)
		}
	}
	if slices.Equal(keep, a.shrunk) {
		return
	}
	if err := r.Slurm.Shrink(ctx, r.Job, keep); err != nil {
		r.say("warning: cannot give lost node(s) %s back to Slurm (%v); the relaunch may wait until Slurm calls them down", strings.Join(lost, ","), err)
		return
	}
	a.shrunk, r.held = keep, keep
	r.say("gave lost node(s) %s back to Slurm: the job now holds %s", strings.Join(lost, ","), strings.Join(keep, ","))
}

// failStep ends the step after the agents' verdict: the step is cancelled
// in Slurm, without waiting for srun to notice (it takes Slurm about half
// a minute to call a node down), and srun gets SIGKILL at once or SIGTERM
// and the grace it returns (failGrace).
func (r *Runner) failStep(ctx context.Context, a *attempt, proc Proc) time.Duration {
	f := a.agentFailure
	r.say("the agents detected a %s failure on %s %.2f s after its last sign of life (coordinator %s): %s; stopping the step",
		f.Class, f.Node, f.Latency.Seconds(), f.Coordinator, f.Cause)
	r.giveBack(ctx, a)
	cancelled := false
	if a.stepID != "" {
		if err := r.Slurm.Cancel(ctx, a.stepID); err != nil {
			r.say("warning: %v", err)
		} else {
			cancelled = true
		}
	}
	g := failGrace(*f, cancelled, r.StopGrace)
	if g == 0 {
		r.say("the step is cancelled and the lost node's slurmd will not confirm its end: killing srun now")
		proc.Signal(syscall.SIGKILL)
		return 0
	}
	proc.Signal(syscall.SIGTERM)
	return g
}

// follow learns the step's id, announces the launch, and for a relaunch
// watches the agents' run records until every rank has restored.
func (r *Runner) follow(ctx context.Context, a *attempt, w *Watcher, before map[string]string, canList, ended bool) {
	failedAt, newestAtFailure := a.failedAt, a.newestAtFailure
	if a.stepID == "" && canList && !ended && r.now().Sub(a.start) < 30*time.Second {
		if now, err := r.Slurm.Steps(ctx, r.Job); err == nil {
			a.stepID = newStep(before, now, r.Job)
		}
	}
	if !a.announced && (a.stepID != "" || ended || !canList || r.now().Sub(a.start) >= 30*time.Second) {
		a.announced = true
		name := recoverylog.StepRelaunched
		if a.relaunch == 0 {
			name = recoverylog.StepLaunched
		}
		e := r.event(name, a.relaunch)
		e.Time, e.Step, e.Nodes = a.start, a.stepID, slices.Clone(r.Plan.Slots)
		if a.relaunch > 0 {
			e.DurationS, e.Cause = a.start.Sub(failedAt).Seconds(), a.why
		}
		r.emit(ctx, e)
	}
	if (a.relaunch == 0 && a.failedAt.IsZero()) || a.resumed {
		return
	}
	if err := w.Poll(); err != nil {
		r.warnOnce("watch", "%v; resumption in those records will not be observed", err)
	}
	r.sayBadLines(w)
	step := stepSuffix(a.stepID)
	world := r.Plan.Ranks()
	restores := w.Restores(step)
	switch {
	case len(restores) >= world:
		a.resumed = true
		var last time.Time
		gen := int64(-1)
		var bytes int64
		gens := map[int64]bool{}
		for _, rr := range restores {
			if rr.Time.After(last) {
				last = rr.Time
			}
			if gen < 0 || rr.Generation < gen {
				gen = rr.Generation
			}
			gens[rr.Generation] = true
			bytes += rr.Bytes
		}
		for _, e := range RestoreSummaries(restores) {
			e.Relaunch, e.Step = a.relaunch, a.stepID
			r.emit(ctx, e)
		}
		e := r.event(recoverylog.Resumed, a.relaunch)
		e.Time, e.Step, e.Generation, e.Bytes = last, a.stepID, gen, bytes
		e.DurationS = last.Sub(failedAt).Seconds()
		if reg, ok := w.AllRegistered(step, world); ok {
			e.Phases = a.phases(reg, last)
		}
		e.Cause = fmt.Sprintf("all %d ranks restored step %d", world, gen)
		if len(gens) > 1 {
			e.Cause = fmt.Sprintf("the %d ranks restored different steps (%v); the oldest is %d", world, keys(gens), gen)
		}
		if a.committedKnown && newestAtFailure >= gen {
			e.LostSteps = ptr(newestAtFailure - gen)
		}
		r.emit(ctx, e)
	case a.committedKnown && newestAtFailure < 0 && w.Registered(step) >= world:
		// Nothing was committed before the failure: the ranks start over.
		a.resumed = true
		e := r.event(recoverylog.Resumed, a.relaunch)
		e.Step, e.DurationS = a.stepID, r.now().Sub(failedAt).Seconds()
		e.Cause = fmt.Sprintf("all %d ranks registered; nothing was committed before the failure", world)
		r.emit(ctx, e)
	case ended && len(restores) > 0:
		for _, e := range RestoreSummaries(restores) {
			e.Relaunch, e.Step = a.relaunch, a.stepID
			r.emit(ctx, e)
		}
	}
	if ended && !a.resumed {
		if miss := w.MissingNodes(r.Plan.Slots); len(miss) > 0 {
			r.warnOnce("agentlogs", "no agent run record of %s in %s: reft run cannot see restores unless log.dir is on a filesystem this node shares",
				strings.Join(miss, ","), r.JobLogDir)
		}
	}
}

// requeuedAfter returns the failure an earlier run requeued the job for,
// when the earlier runs ended with that requeue.
func requeuedAfter(prior []recoverylog.Event) (recoverylog.Event, bool) {
	if len(prior) == 0 || prior[len(prior)-1].Event != recoverylog.JobRequeued {
		return recoverylog.Event{}, false
	}
	for i := len(prior) - 1; i >= 0; i-- {
		if prior[i].Event == recoverylog.FailureDetected {
			return prior[i], true
		}
	}
	return recoverylog.Event{}, false
}

func keys(m map[int64]bool) []int64 {
	out := make([]int64, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// newStep picks the step that appeared since before: the lowest new
// numeric step id that is not a probe.
func newStep(before, now map[string]string, job string) string {
	best, bestN := "", -1
	for id, name := range now {
		if _, old := before[id]; old || name == recoverylog.ProbeStepName {
			continue
		}
		j, s, ok := strings.Cut(id, ".")
		n, err := strconv.Atoi(s)
		if !ok || j != job || err != nil {
			continue
		}
		if bestN < 0 || n < bestN {
			best, bestN = id, n
		}
	}
	return best
}

// argv builds the srun command line and environment of an attempt, and
// writes the hostfile.
func (r *Runner) argv(relaunch int) ([]string, []string, error) {
	hostfile := filepath.Join(r.JobLogDir, fmt.Sprintf("hostfile.%d", relaunch))
	// srun places the ranks by this file: it is written only into the
	// job user's own directory, never through a link.
	d, err := logging.JobDir(filepath.Dir(r.JobLogDir), filepath.Base(r.JobLogDir), os.Getuid())
	if err != nil {
		return nil, nil, fmt.Errorf("the step's hostfile: %w", err)
	}
	defer d.Close()
	f, err := logging.OpenIn(d, filepath.Base(hostfile), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, os.Getuid())
	if err != nil {
		return nil, nil, fmt.Errorf("the step's hostfile: %w", err)
	}
	_, err = f.WriteString(r.Plan.Hostfile())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, nil, fmt.Errorf("writing the step's hostfile %s: %w", hostfile, err)
	}
	place := r.Plan.SrunArgs()
	if !r.SlurmRelease.nodesWithArbitrary() {
		place = slices.DeleteFunc(place, func(a string) bool { return strings.HasPrefix(a, "--nodes=") })
	}
	argv := append([]string{r.Srun}, place...)
	argv = append(argv, "--kill-on-bad-exit=1", "--reft="+r.Spec)
	if relaunch > 0 {
		// The failed step can linger, ending, on a node that died with it
		// and keep its CPUs until Slurm gives up on that node (minutes):
		// the relaunch shares them instead of waiting.
		argv = append(argv, "--overlap")
	}
	argv = append(argv, r.SrunOpts...)
	argv = append(argv, r.Command...)
	env := slices.DeleteFunc(slices.Clone(r.Env), func(kv string) bool {
		return strings.HasPrefix(kv, "SLURM_HOSTFILE=") || strings.HasPrefix(kv, "REFT_RUN=")
	})
	if r.held != nil {
		if renv, err := resizedEnv(env, r.held); err != nil {
			r.warnOnce("resizedenv", "cannot give the step the shrunk allocation's environment (%v); its ranks see the allocation as it was submitted, lost nodes included", err)
		} else {
			env = renv
		}
	}
	// REFT_RUN marks the step as reft run's for the SPANK plugin's
	// step-end hold (spank/stepend), which waits for reft run's shrink.
	return argv, append(env, "SLURM_HOSTFILE="+hostfile, "REFT_RUN="+strconv.Itoa(relaunch)), nil
}

// healthQuery is what health needs to know about a failed attempt, copied
// out of it so that the probe can run while settle still changes the
// attempt (settleAndProbe).
type healthQuery struct {
	slots        []string // the step's nodes
	nodeFailures []string // the nodes srun called failed
	lost         []string // the nodes the agents called lost
	shrunk       []string // the allocation after the shrink (nil: none)
}

func (r *Runner) healthQuery(a *attempt) healthQuery {
	return healthQuery{slots: slices.Clone(r.Plan.Slots), nodeFailures: slices.Clone(a.outcome.NodeFailures),
		lost: a.lostNodes(), shrunk: slices.Clone(a.shrunk)}
}

// health asks Slurm about the step's nodes and the agents on those that
// Slurm still considers up.
func (r *Runner) health(ctx context.Context, a *attempt) Health {
	return r.ask(ctx, r.healthQuery(a))
}

// settleAndProbe is settle and health at once, after an agents' verdict:
// the probe (an srun on the survivors, 1.5-3 s on the test cluster) runs
// while settle waits out verdictSettle for nodes lost with the first, so
// the wait costs nothing. When settle finds another node lost, the probe
// it overlapped asked the wrong nodes (one of them gone, the allocation
// shrunk again): it is cancelled and asked again on the smaller
// allocation. Agents the first probe already stopped then answer no
// more; their answers to the first probe are kept.
func (r *Runner) settleAndProbe(ctx context.Context, a *attempt, w *Watcher) Health {
	q := r.healthQuery(a)
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	first := make(chan Health, 1)
	go func() { first <- r.ask(pctx, q) }()
	r.settle(ctx, a, w)
	if slices.Equal(q.lost, a.lostNodes()) && slices.Equal(q.shrunk, a.shrunk) {
		return <-first
	}
	cancel()
	h0 := <-first
	r.say("the probe asked nodes that are now known lost; asking the agents again on %s", strings.Join(a.shrunk, ","))
	h := r.health(ctx, a)
	if h.Agents == nil {
		h.Agents = map[string]AgentReport{}
	}
	lost := a.lostNodes()
	for n, rep := range h0.Agents {
		if old, ok := h.Agents[n]; rep.OK && (!ok || !old.OK) && slices.Contains(r.Plan.Slots, n) && !slices.Contains(lost, n) {
			h.Agents[n] = rep
		}
	}
	return h
}

// ask is health for q. It reads no Runner state that settle changes, and
// may run beside it.
func (r *Runner) ask(ctx context.Context, q healthQuery) Health {
	var h Health
	states, err := r.Slurm.NodeStates(ctx, r.Job, q.slots)
	if err != nil {
		r.say("warning: cannot ask Slurm about the nodes (%v); classifying from srun's messages and the agents", err)
	} else {
		h.NodeStates = states
	}
	var probe []string
	for _, n := range q.slots {
		if slices.Contains(q.nodeFailures, n) {
			continue
		}
		if slices.Contains(q.lost, n) {
			continue // a probe step on it would wait for a slurmd that is gone
		}
		if h.NodeStates != nil && NodeLost(h.NodeStates[n]) != "" {
			continue
		}
		probe = append(probe, n)
	}
	pctx, cancel := context.WithTimeout(ctx, r.Policy.ProbeTimeout.D())
	defer cancel()
	if len(q.shrunk) > 0 {
		// The agents still running found each other on the larger
		// allocation's ports (agent/mesh); new ones on the smaller one
		// would not find them. The probe stops them all (each new agent
		// re-indexes its node's store); right after the cancel a step may
		// not start yet, so it is tried twice.
		for try := 0; try < 2; try++ {
			all, err := r.Slurm.StopAgents(pctx, r.Job, q.shrunk)
			h.Agents, h.ProbeErr = map[string]AgentReport{}, err
			for _, n := range probe {
				if rep, ok := all[n]; ok {
					h.Agents[n] = rep
				}
			}
			if err == nil || pctx.Err() != nil {
				break
			}
			r.say("warning: %v; trying again", err)
			select {
			case <-pctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
		for _, n := range probe {
			if rep := h.Agents[n]; rep.Stopped && rep.OpenAtStop > 0 {
				r.say("warning: the agent on %s was stopped with %d rank connection(s) still open after %.1f s: a save those ranks had in flight is lost, and the relaunch may resume from an older step",
					n, rep.OpenAtStop, rep.FlushWaitS)
			}
		}
	} else {
		h.Agents, h.ProbeErr = r.Slurm.Probe(pctx, r.Job, probe)
	}
	if h.ProbeErr != nil && !errors.Is(ctx.Err(), context.Canceled) { // cancelled: settleAndProbe says why
		r.say("warning: %v", h.ProbeErr)
	}
	// Nodes not probed because Slurm calls them lost have no report; that
	// is the node state's verdict, not the probe's.
	return h
}

// replaceNodes excludes lost nodes and hands their slots to spares
// (swapped: some spare took a slot); with none left it requeues the job
// (done is then true).
func (r *Runner) replaceNodes(ctx context.Context, relaunch int, f Failure) (why string, swapped bool, code int, done bool) {
	var swaps []string
	for _, n := range f.Nodes {
		spare, ok := r.Plan.Replace(n)
		if !ok {
			e := r.event(recoverylog.JobRequeued, relaunch)
			e.Node, e.Level = n, "warn"
			e.Cause = fmt.Sprintf("node %s lost and no spare left in the allocation (spares: %d used, excluded: %s); requeued to get new nodes",
				n, len(r.Plan.Excluded), strings.Join(r.Plan.Excluded, ","))
			e.ExitCode = ptr(ExitRequeued)
			r.emit(ctx, e)
			if err := r.Slurm.Requeue(ctx, r.Job); err != nil {
				r.say("cannot requeue job %s: %v (submit with --requeue; an administrator may have disabled requeues with JobRequeue=0)", r.Job, err)
				return "", false, ExitError, true
			}
			return "", false, ExitRequeued, true
		}
		if spare != "" {
			swaps = append(swaps, spare+" in "+n+"'s place")
		}
		e := r.event(recoverylog.NodeExcluded, relaunch)
		e.Node, e.Replacement, e.Level = n, spare, "warn"
		e.Cause = f.Cause
		if spare != "" {
			e.Ranks = r.Plan.RanksOn(spare)
		}
		r.emit(ctx, e)
	}
	why = "node failure: " + strings.Join(swaps, ", ") + "; the other ranks restore from their nodes' snapshots"
	if len(swaps) == 0 {
		why = "node failure (a spare was lost): same nodes"
	}
	return why, len(swaps) > 0, 0, false
}

func (r *Runner) gaveUp(ctx context.Context, relaunch, code int, cause string) int {
	e := r.event(recoverylog.GaveUp, relaunch)
	e.Cause, e.Level, e.ExitCode = cause, "error", ptr(code)
	r.emit(ctx, e)
	return code
}

// wait sleeps d unless a signal comes first.
func (r *Runner) wait(d time.Duration) os.Signal {
	if d <= 0 {
		select {
		case s := <-r.Signals:
			return s
		default:
			return nil
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case s := <-r.Signals:
		return s
	case <-t.C:
		return nil
	}
}

// stopStep ends a running step after a signal: SIGTERM to srun (which
// cancels the step in Slurm); if srun outlives StopGrace or a second
// signal comes, the step is cancelled with scancel and srun killed.
func (r *Runner) stopStep(ctx context.Context, a *attempt, proc Proc, done chan int, sig os.Signal) {
	r.say("%s: ending the step", sig)
	if err := proc.Signal(syscall.SIGTERM); err != nil {
		<-done // srun already gone
		return
	}
	t := time.NewTimer(r.StopGrace)
	defer t.Stop()
	select {
	case <-done:
		return
	case <-r.Signals:
	case <-t.C:
	}
	if a.stepID != "" {
		if err := r.Slurm.Cancel(ctx, a.stepID); err != nil {
			r.say("warning: %v", err)
		}
	}
	proc.Signal(syscall.SIGKILL)
	<-done
}

func (r *Runner) stopped(ctx context.Context, a *attempt, sig os.Signal) int {
	code := 128 + 1
	if s, ok := sig.(syscall.Signal); ok {
		code = 128 + int(s)
	}
	e := r.event(recoverylog.Stopped, a.relaunch)
	e.Step, e.Cause, e.ExitCode = a.stepID, "received "+sig.String(), ptr(code)
	r.emit(ctx, e)
	return code
}
