package run

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/launcher/recoverylog"
)

// TaskExit is one "srun: error: NODE: task(s) LIST: REASON" line.
type TaskExit struct {
	Node     string
	Tasks    []int
	Reason   string // "Killed", "Exited with exit code 1", "Terminated", "Segmentation fault", ...
	Teardown bool   // reported after srun began to kill the step (collateral of --kill-on-bad-exit)
}

// Outcome is what srun said and did. Scan gets srun's stderr line by line
// (the tasks' own stderr passes through it too; only srun's messages match).
type Outcome struct {
	Exit         int // srun's exit status; -1 when it died of a signal
	Tasks        []TaskExit
	NodeFailures []string  // "Node failure on NODE"
	FirstError   time.Time // when the first failure message arrived (zero: none)
	teardown     bool
}

var (
	taskExitRe    = regexp.MustCompile(`^srun: error: (\S+): tasks? ([0-9][0-9,\-]*): (.+)$`)
	nodeFailureRe = regexp.MustCompile(`^srun: error: Node failure on (\S+)`)
	// srun starts tearing the step down (--kill-on-bad-exit, a cancel, a
	// signal): later task exits are collateral.
	teardownRe = regexp.MustCompile(`Terminating (job|StepId)|Force Terminated|forcing job termination|\*\*\* STEP \S+ ON \S+ CANCELLED|Job step aborted`)
)

// Scan reads one line of srun's stderr that arrived at t.
func (o *Outcome) Scan(line string, t time.Time) {
	line = strings.TrimRight(line, "\r\n")
	if m := taskExitRe.FindStringSubmatch(line); m != nil {
		tasks, err := parseTaskList(m[2])
		if err != nil {
			return
		}
		o.Tasks = append(o.Tasks, TaskExit{Node: m[1], Tasks: tasks, Reason: m[3], Teardown: o.teardown})
		if o.FirstError.IsZero() {
			o.FirstError = t
		}
		return
	}
	if m := nodeFailureRe.FindStringSubmatch(line); m != nil {
		if !slices.Contains(o.NodeFailures, m[1]) {
			o.NodeFailures = append(o.NodeFailures, m[1])
		}
		if o.FirstError.IsZero() {
			o.FirstError = t
		}
		return
	}
	if teardownRe.MatchString(line) {
		o.teardown = true
	}
}

// maxTasks bounds a task list: a task can print a line that looks like
// srun's, and many ranges ("0-1048575,0-1048575,...") would otherwise
// allocate without limit (found by FuzzScan).
const maxTasks = 1 << 20

// parseTaskList reads srun's task lists: "2", "0-3", "0,2-3".
func parseTaskList(s string) ([]int, error) {
	var out []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, err
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a || b-a > 1<<20 {
				return nil, fmt.Errorf("bad task range %q", part)
			}
		}
		if b-a >= maxTasks-len(out) {
			return nil, fmt.Errorf("task list %.40q... has more than %d tasks", s, maxTasks)
		}
		for k := a; k <= b; k++ {
			out = append(out, k)
		}
	}
	return out, nil
}

// Culprits are the task exits that caused the failure: those srun reported
// before it began to tear the step down, other than plain SIGTERMs (which
// are the teardown's own); when that leaves none, every exit that is not
// a SIGTERM; then every exit.
func (o Outcome) Culprits() []TaskExit {
	pick := func(keep func(TaskExit) bool) []TaskExit {
		var out []TaskExit
		for _, t := range o.Tasks {
			if keep(t) {
				out = append(out, t)
			}
		}
		return out
	}
	if c := pick(func(t TaskExit) bool { return !t.Teardown && t.Reason != "Terminated" }); len(c) > 0 {
		return c
	}
	if c := pick(func(t TaskExit) bool { return t.Reason != "Terminated" }); len(c) > 0 {
		return c
	}
	return o.Tasks
}

// AgentReport is one node's answer to the probe (reft status-local).
type AgentReport struct {
	Node   string        `json:"node"`
	Job    string        `json:"job"`
	OK     bool          `json:"ok"`              // the agent answered
	Error  string        `json:"error,omitempty"` // why not
	Status *proto.Status `json:"status,omitempty"`

	// Stopped: the agent was asked to stop (status-local --stop-agent)
	// and is gone.
	Stopped bool `json:"stopped,omitempty"`
	// OpenAtStop: connections (ranks) still open on the agent when it was
	// stopped, after FlushWaitS seconds of waiting for them to close; a
	// rank's save then in flight is lost.
	OpenAtStop int     `json:"open_at_stop,omitempty"`
	FlushWaitS float64 `json:"flush_wait_s,omitempty"`
}

// Health is what Slurm and the agents say about the step's nodes after a
// failure.
type Health struct {
	// NodeStates maps a node to its scontrol State (IDLE, MIXED,
	// DOWN+NOT_RESPONDING, ...); a node missing here is not in the job's
	// allocation any more.
	NodeStates map[string]string
	// Agents maps a node to its probe report; a node missing here could
	// not be reached by the probe.
	Agents map[string]AgentReport
	// ProbeErr says why the probe as a whole failed, if it did.
	ProbeErr error
}

// NodeLost says why Slurm considers a node lost ("" if it does not).
func NodeLost(state string) string {
	s := strings.ToUpper(state)
	switch {
	case s == "":
		return "no longer in the job's allocation"
	case strings.HasSuffix(s, "*"), strings.Contains(s, "NOT_RESPONDING"):
		return "not responding (State=" + state + ")"
	case strings.Contains(s, "DOWN"), strings.Contains(s, "FAIL"), strings.Contains(s, "POWER"):
		return "State=" + state
	}
	return ""
}

// Failure is the classified cause of a failed step.
type Failure struct {
	Kind  string   // recoverylog.Kind*
	Nodes []string // lost nodes (KindNode), nodes without an agent (KindAgent), the failed ranks' nodes (KindRank)
	Ranks []int    // the failed ranks (KindRank)
	Cause string   // one line for humans
}

// Classify decides what failed. A lost node outranks a dead agent, which
// outranks a dead rank: a node loss kills its agent and ranks, and an
// agent's death fails its ranks' saves.
func Classify(o Outcome, plan Plan, h Health) Failure {
	var lost, why []string
	for _, n := range plan.Slots {
		reason := ""
		switch {
		case slices.Contains(o.NodeFailures, n):
			reason = "srun reported a node failure"
		case h.NodeStates != nil:
			st, ok := h.NodeStates[n]
			if !ok {
				st = ""
			}
			reason = NodeLost(st)
		}
		if reason == "" && h.ProbeErr == nil && h.Agents != nil {
			if _, ok := h.Agents[n]; !ok {
				reason = "did not answer the probe step"
			}
		}
		if reason != "" {
			lost = append(lost, n)
			why = append(why, n+": "+reason)
		}
	}
	if len(lost) > 0 {
		return Failure{Kind: recoverylog.KindNode, Nodes: lost, Cause: strings.Join(why, "; ")}
	}

	var noAgent []string
	why = nil
	for _, n := range plan.Slots {
		if r, ok := h.Agents[n]; ok && !r.OK {
			noAgent = append(noAgent, n)
			why = append(why, n+": "+r.Error)
		}
	}
	if len(noAgent) > 0 {
		return Failure{Kind: recoverylog.KindAgent, Nodes: noAgent, Cause: "agent not answering: " + strings.Join(why, "; ")}
	}

	if c := o.Culprits(); len(c) > 0 {
		var ranks []int
		var nodes, reasons []string
		for _, t := range c {
			ranks = append(ranks, t.Tasks...)
			if !slices.Contains(nodes, t.Node) {
				nodes = append(nodes, t.Node)
			}
			word := "task"
			if len(t.Tasks) > 1 {
				word = "tasks"
			}
			reasons = append(reasons, fmt.Sprintf("%s %s on %s: %s", word, intList(t.Tasks), t.Node, t.Reason))
		}
		sort.Ints(ranks)
		return Failure{Kind: recoverylog.KindRank, Nodes: nodes, Ranks: slices.Compact(ranks), Cause: strings.Join(reasons, "; ")}
	}

	cause := fmt.Sprintf("srun exited with status %d and named no failed task", o.Exit)
	if o.Exit < 0 {
		cause = "srun was killed by a signal"
	}
	if h.ProbeErr != nil {
		cause += "; " + h.ProbeErr.Error()
	}
	return Failure{Kind: recoverylog.KindStep, Cause: cause}
}

// FromAgents is the failure the agents' detector published: their class
// (node, agent or hang) and node, and their cause with who saw it.
//
// also are node failures published right after f (nodes lost together):
// the failure is then a node failure of all of them, in that order.
func FromAgents(f AgentFailure, also ...AgentFailure) Failure {
	out := Failure{Kind: f.Class, Nodes: []string{f.Node}, Cause: "the agents' failure detector: " + agentCause(f)}
	if f.Class == recoverylog.KindHang {
		out.Ranks = slices.Clone(f.Ranks)
	}
	for _, o := range also {
		if o.Class != recoverylog.KindNode || slices.Contains(out.Nodes, o.Node) {
			continue
		}
		if out.Kind != recoverylog.KindNode { // a lost node outweighs an agent or a hang
			out.Kind, out.Nodes, out.Ranks = recoverylog.KindNode, nil, nil
		}
		out.Nodes = append(out.Nodes, o.Node)
		out.Cause += "; and " + agentCause(o)
	}
	return out
}

// agentCause is one verdict with who reached it.
func agentCause(f AgentFailure) string {
	by := "coordinator " + f.Coordinator
	if f.Reporter != "" && f.Reporter != f.Coordinator {
		by += ", reported by " + f.Reporter
	}
	if len(f.ConfirmedBy) > 0 {
		by += ", confirmed by " + strings.Join(f.ConfirmedBy, ",")
	}
	return fmt.Sprintf("%s (%s)", f.Cause, by)
}

func intList(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

// Committed summarizes the agents' reports: the newest committed snapshot
// step of any rank (-1: none), and the payload bytes of the newest one.
// known is false when no agent answered: then nothing is known.
func Committed(h Health) (newest int64, bytes int64, known bool) {
	newest = -1
	for _, r := range h.Agents {
		if !r.OK || r.Status == nil {
			continue
		}
		known = true
		for _, rs := range r.Status.Ranks {
			if rs.Newest > newest {
				newest, bytes = rs.Newest, 0
			}
			if rs.Newest == newest {
				bytes += rs.Bytes
			}
		}
	}
	return newest, bytes, known
}

// SilentAgents names the probed nodes whose agent did not answer, with
// why, when that is not already the failure's verdict.
func SilentAgents(h Health, f Failure) string {
	if f.Kind == recoverylog.KindAgent {
		return ""
	}
	var why []string
	for n, r := range h.Agents {
		if !r.OK && !slices.Contains(f.Nodes, n) {
			why = append(why, n+": "+r.Error)
		}
	}
	sort.Strings(why)
	return strings.Join(why, "; ")
}
