package run

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/agent/event"
	"github.com/reft-hpc/reft/agent/logging"
	"github.com/reft-hpc/reft/agent/runrecord"
	"github.com/reft-hpc/reft/launcher/recoverylog"
)

// Watcher follows the agents' run records (agent/runrecord:
// <log dir>/<job>/<node>.record) to see the agents' failure verdicts and
// the ranks of a relaunched step register and restore. The agents record
// every restore they serve with the rank and the generation; that, not the
// trainer's output, is how reft run learns that the step has resumed and
// from which step. It reads the records, written for it, never the
// agents' logs, which are for people. It needs log.dir on a filesystem
// that the node running reft run sees (as `reft log` does); MissingNodes
// says when it is not.
type Watcher struct {
	dir      string
	nodes    []string // the allocation's: only their logs are read
	uid      int      // the job's: only its files are read
	offsets  map[string]int64
	partial  map[string][]byte
	recs     []agentRecord
	failures []AgentFailure
	// bad is the first record line refused since the watcher began, and
	// where (BadLine); later ones are counted only.
	bad    error
	badN   int
	badMsg bool
}

// AgentFailure is a failure the agents' detector published (agent/detect:
// the coordinator's failure_detected line).
type AgentFailure struct {
	Node        string // the failed node (a hang: the hung ranks' node)
	Class       string // node, agent or hang
	Ranks       []int
	Cause       string
	Coordinator string
	Reporter    string
	ConfirmedBy []string
	Latency     time.Duration // last sign of life to confirmation
	LastHeard   time.Time     // the failed agent's (or hung rank's) last sign of life; zero: not logged
	DetectedAt  time.Time
	// Quorum: Votes of the job's Agents could not reach the node, a
	// majority (agent/detect.Quorum); false from agents that predate it.
	Quorum        bool
	Votes, Agents int
	// Suspect: reft run's cross-check with Slurm found no evidence for a
	// node verdict (no quorum, and Slurm calls the node healthy), and
	// made it an agent failure on a node that is kept (Runner.crossCheck).
	Suspect bool
}

// agentRecord is a registration or a restore that an agent recorded.
type agentRecord struct {
	Event      string // event.RankRegistered or one of event.Restores
	Node       string
	Step       string // the client's step id ("" if its hello was not seen)
	Rank       int
	Generation int64
	Bytes      int64
	Duration   time.Duration
	Time       time.Time
	// Reason is why memory could not serve the restore (the agent's
	// restore_persistent reason); "" otherwise.
	Reason string
}

// NewWatcher follows the run records in dir (<log dir>/<job>) of nodes,
// the allocation's. The log directory is shared by every user of the
// cluster, so the watcher reads only what the job's user alone could
// have written: dir must be a directory of this process's uid (the
// job's) closed to others, and only the regular files of that uid named
// after the allocation's nodes are read, never through a link. Anything
// else there is ignored, however it looks.
func NewWatcher(dir string, nodes []string) *Watcher {
	return &Watcher{dir: dir, nodes: slices.Clone(nodes), uid: os.Getuid(),
		offsets: map[string]int64{}, partial: map[string][]byte{}}
}

// files opens the job's log directory, checked, and lists the agents'
// run records in it; the caller closes d. A directory that does not exist yet
// lists nothing (d nil).
func (w *Watcher) files() (d *os.File, names []string, err error) {
	d, err = logging.OpenJobDir(w.dir, w.uid)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("not reading the agents' run records: %w", err)
	}
	ents, err := d.ReadDir(-1)
	if err != nil {
		d.Close()
		return nil, nil, fmt.Errorf("reading the agents' log directory: %w", err)
	}
	for _, e := range ents {
		n := e.Name()
		if node, ok := strings.CutSuffix(n, runrecord.Suffix); ok && e.Type().IsRegular() && slices.Contains(w.nodes, node) {
			names = append(names, n)
		}
	}
	return d, names, nil
}

// Mark skips what the records hold now, and forgets what was read: Poll
// then sees only what the agents record from here on.
func (w *Watcher) Mark() error {
	w.recs, w.failures = nil, nil
	d, names, err := w.files()
	if err != nil || d == nil {
		return err
	}
	defer d.Close()
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(int(d.Fd()), n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // rotated away between ReadDir and Stat
		}
		w.offsets[n] = st.Size
		delete(w.partial, n)
	}
	return nil
}

// Poll reads what the agents recorded since the last call. Its error says
// which records it could not read; what the others held is read all the
// same. Lines it refuses are skipped and told by BadLine.
func (w *Watcher) Poll() error {
	d, names, err := w.files()
	if err != nil || d == nil {
		return err
	}
	defer d.Close()
	// One unreadable record does not hide the others' lines.
	var errs []error
	for _, n := range names {
		if err := w.readFile(d, n); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (w *Watcher) readFile(d *os.File, name string) error {
	f, err := logging.OpenIn(d, name, os.O_RDONLY, w.uid)
	if err != nil {
		return fmt.Errorf("reading an agent's run record: %w", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() < w.offsets[name] {
		w.offsets[name], w.partial[name] = 0, nil // truncated: start over
	}
	if _, err := f.Seek(w.offsets[name], io.SeekStart); err != nil {
		return fmt.Errorf("reading an agent's run record: %w", err)
	}
	data, err := io.ReadAll(io.LimitReader(f, 64<<20))
	if err != nil {
		return fmt.Errorf("reading an agent's run record: %w", err)
	}
	w.offsets[name] += int64(len(data))
	data = append(w.partial[name], data...)
	end := bytes.LastIndexByte(data, '\n')
	if end < 0 {
		w.partial[name] = data
		return nil
	}
	w.partial[name] = slices.Clone(data[end+1:])
	node := strings.TrimSuffix(name, runrecord.Suffix)
	for _, line := range bytes.Split(data[:end], []byte{'\n'}) {
		w.line(node, line)
	}
	return nil
}

// line takes one line of node's record. An agent records only its own
// node's name: a line naming another is not that agent's.
func (w *Watcher) line(node string, b []byte) {
	if len(bytes.TrimSpace(b)) == 0 {
		return
	}
	r, err := runrecord.Decode(b)
	switch {
	case errors.Is(err, runrecord.ErrUnknownKind):
		return // a newer agent's: the contract says skip it
	case err == nil && r.Node != node:
		err = fmt.Errorf("a line of %s%s names node %q", node, runrecord.Suffix, r.Node)
	case err != nil:
		err = fmt.Errorf("%s%s: %w", node, runrecord.Suffix, err)
	}
	if err != nil {
		w.badN++
		if w.bad == nil {
			w.bad = err
		}
		return
	}
	if r.Kind == runrecord.KindFailure {
		f := r.Failure
		w.failures = append(w.failures, AgentFailure{Node: f.FailedNode, Class: f.Class, Ranks: f.Ranks, Cause: f.Cause,
			Coordinator: f.Coordinator, Reporter: f.Reporter, ConfirmedBy: f.ConfirmedBy,
			Latency: f.Latency, LastHeard: f.LastHeard, DetectedAt: f.DetectedAt,
			Quorum: f.Quorum, Votes: f.Votes, Agents: f.Agents})
		return
	}
	ev, gen := r.Event, r.Generation
	if r.Kind == runrecord.KindRegistered {
		ev, gen = event.RankRegistered, -1
	}
	w.recs = append(w.recs, agentRecord{Event: ev, Node: r.Node, Step: r.Step, Rank: r.Rank, Bytes: r.Bytes, Time: r.Time,
		Generation: gen, Duration: r.Duration, Reason: r.Reason})
}

// BadLine is the first record line refused since the watcher began (nil:
// none) and how many were; fresh is true the first time it is asked after
// one was, so that the caller says it once.
func (w *Watcher) BadLine() (first error, n int, fresh bool) {
	fresh = w.bad != nil && !w.badMsg
	if fresh {
		w.badMsg = true
	}
	return w.bad, w.badN, fresh
}

// Failures lists the failures the agents published since Mark, in the
// order they were read.
func (w *Watcher) Failures() []AgentFailure { return slices.Clone(w.failures) }

// matches says whether a record belongs to step ("" matches all; a record
// whose client step is unknown matches too).
func matches(r agentRecord, step string) bool {
	return step == "" || r.Step == "" || r.Step == step
}

// Registered counts the distinct ranks of step that registered.
func (w *Watcher) Registered(step string) int {
	seen := map[int]bool{}
	for _, r := range w.recs {
		if r.Event == event.RankRegistered && matches(r, step) {
			seen[r.Rank] = true
		}
	}
	return len(seen)
}

// AllRegistered is when the world-th distinct rank of step first
// registered (the last rank's first registration); false while fewer did.
func (w *Watcher) AllRegistered(step string, world int) (time.Time, bool) {
	first := map[int]time.Time{}
	for _, r := range w.recs {
		if t, ok := first[r.Rank]; r.Event == event.RankRegistered && matches(r, step) && (!ok || r.Time.Before(t)) {
			first[r.Rank] = r.Time
		}
	}
	if len(first) < world || world <= 0 {
		return time.Time{}, false
	}
	var last time.Time
	for _, t := range first {
		if t.After(last) {
			last = t
		}
	}
	return last, true
}

// Restores returns the latest restore of every rank of step.
func (w *Watcher) Restores(step string) map[int]agentRecord {
	out := map[int]agentRecord{}
	for _, r := range w.recs {
		if r.Event != event.RankRegistered && matches(r, step) {
			out[r.Rank] = r
		}
	}
	return out
}

// MissingNodes lists the nodes that have no run record in the directory.
func (w *Watcher) MissingNodes(nodes []string) []string {
	d, names, _ := w.files()
	if d != nil {
		d.Close()
	}
	var out []string
	for _, n := range nodes {
		if !slices.Contains(names, runrecord.FileName(n)) {
			out = append(out, n)
		}
	}
	return out
}

// RestoreSummaries groups restores by node, event and generation: one
// recovery event each, with the ranks, their bytes, and the longest rank's
// duration.
func RestoreSummaries(rs map[int]agentRecord) []recoverylog.Event {
	type key struct {
		node, event string
		gen         int64
	}
	groups := map[key]*recoverylog.Event{}
	var order []key
	ranks := make([]int, 0, len(rs))
	for r := range rs {
		ranks = append(ranks, r)
	}
	slices.Sort(ranks)
	for _, rank := range ranks {
		r := rs[rank]
		k := key{r.Node, r.Event, r.Generation}
		e, ok := groups[k]
		if !ok {
			e = &recoverylog.Event{Node: r.Node, Event: r.Event, Generation: r.Generation, Time: r.Time,
				Cause: "served by the node's agent"}
			if r.Reason != "" { // the operator's question: why not from memory
				e.Cause = "memory could not serve it: " + r.Reason
			}
			groups[k] = e
			order = append(order, k)
		}
		e.Ranks = append(e.Ranks, rank)
		e.Bytes += r.Bytes
		if s := r.Duration.Seconds(); s > e.DurationS {
			e.DurationS = s
		}
		if r.Time.After(e.Time) {
			e.Time = r.Time
		}
	}
	slices.SortFunc(order, func(a, b key) int {
		if c := strings.Compare(a.node, b.node); c != 0 {
			return c
		}
		return strings.Compare(a.event, b.event)
	})
	out := make([]recoverylog.Event, 0, len(order))
	for _, k := range order {
		out = append(out, *groups[k])
	}
	return out
}
