// Package recoverylog is the recovery timeline of a job: the events that
// `reft run` writes, one zerolog JSON line each, to
// <log dir>/<jobid>/recovery.jsonl (next to the agents' <node>.jsonl), the
// one-line summary it keeps in the job's Comment, and `reft log`, which
// joins the events with Slurm's accounting records (sacct).
package recoverylog

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/event"
	"github.com/reft-hpc/reft/agent/logging"
)

// FileName is the recovery log's name inside <log dir>/<jobid>/.
const FileName = "recovery.jsonl"

// Event names. The restore events summarize what the agents served (their
// own logs have one line per rank); the others are reft run's decisions.
const (
	StepLaunched      = "step_launched"         // the first launch of the step
	FailureDetected   = "failure_detected"      // the step failed; Kind says what failed
	NodeExcluded      = "node_excluded"         // a lost node leaves the step for the rest of the allocation
	StepRelaunched    = "step_relaunched"       // the step was launched again
	RestoreLocal      = event.RestoreLocal      // ranks of a node restored from its tmpfs
	RestorePeer       = event.RestorePeer       // ... fetched from a peer's copy
	Decode            = event.Decode            // ... rebuilt from parity
	RestorePersistent = event.RestorePersistent // ... loaded from the persistent directory
	Resumed           = "resumed"               // every rank of the relaunched step has restored (or started over)
	JobRequeued       = "job_requeued"          // a node was lost and no spare is left
	GaveUp            = "gave_up"               // relaunch limit, or no progress
	Stopped           = "stopped"               // a signal (Ctrl-C, scancel) ended reft run
	Completed         = "completed"             // the step exited 0
	// Straggler: a rank's own work per step is well above the job's
	// (launcher/status.Straggler); reported once per rank and launch,
	// never acted on. DurationS is the rank's median work per step.
	Straggler = "straggler"
	// Degraded: a node's agent reports its protection or health below
	// what the SPEC asks (launcher/status.NodeReport.Warnings, in Cause),
	// the same in two asks in a row; said again only when it changes.
	// DegradedCleared: a node said degraded reports nothing any more.
	// Never acted on.
	Degraded        = "degraded"
	DegradedCleared = "degraded_cleared"
)

// RestoreEvents are the agents' restore event names (agent/event) that
// reft run summarizes per node.
var RestoreEvents = event.Restores

// Failure kinds (Event.Kind of failure_detected).
const (
	KindRank  = "rank"  // a task died or exited non-zero; its node and agent answer
	KindAgent = "agent" // a node's agent does not answer; the node does
	KindNode  = "node"  // a node is lost: Slurm says it is down or not responding, or it cannot be reached
	KindStep  = "step"  // srun failed without naming a task or a node (e.g. a launch error)
	KindHang  = "hang"  // ranks made no progress past detect.hang (the agents' verdict)
)

// Event is one line of the recovery log. Job, Step, Restart, Relaunch,
// Node, Event, Spec, Generation, Bytes, DurationS and Cause are always
// written; the rest only when set.
type Event struct {
	Time       time.Time `json:"time"`
	Level      string    `json:"level,omitempty"`
	Job        string    `json:"job"`
	Step       string    `json:"step"`     // the Slurm step concerned, e.g. "42.3"; "" when unknown
	Restart    int       `json:"restart"`  // SLURM_RESTART_COUNT: requeues of the job (as in the agents' logs)
	Relaunch   int       `json:"relaunch"` // relaunches by this reft run inside the allocation so far
	Node       string    `json:"node"`     // the node concerned; "" for job-wide events
	Event      string    `json:"event"`
	Spec       string    `json:"spec"`       // the --reft SPEC of the step
	Generation int64     `json:"generation"` // snapshot step concerned; -1: none or unknown
	Bytes      int64     `json:"bytes"`
	DurationS  float64   `json:"duration_s"` // seconds; what it measures depends on the event
	Cause      string    `json:"cause"`

	Kind        string   `json:"kind,omitempty"`        // failure_detected: KindRank, ...
	Nodes       []string `json:"nodes,omitempty"`       // launches: the step's nodes in rank order; failures: the nodes concerned
	Ranks       []int    `json:"ranks,omitempty"`       // failed ranks, or the ranks a restore served
	Replacement string   `json:"replacement,omitempty"` // node_excluded: the spare that takes its ranks
	LostSteps   *int64   `json:"lost_steps,omitempty"`  // resumed: committed steps thrown away
	ExitCode    *int     `json:"exit_code,omitempty"`   // srun's, or reft run's own when it ends
	Message     string   `json:"message,omitempty"`

	// failure_detected: who saw it first ("agents": their failure detector
	// published it; "srun": srun's messages and the probe), and for the
	// agents' verdict the seconds from the failed agent's last sign of
	// life (a hang: the ranks' last progress) to the confirmation.
	DetectedBy string   `json:"detected_by,omitempty"`
	DetectionS *float64 `json:"detection_s,omitempty"`

	// resumed: where the time from the failure to the restore went.
	Phases *Phases `json:"phases,omitempty"`
}

// Phases splits a recovery's time, the resumed event's duration_s from
// the failure to every rank restored, into what reft run did in turn;
// each phase runs from the end of the one before, so they add up to it.
// Times come from reft run's clock except the two ends (the failure's
// time and the ranks' registrations and restores come from the agents'
// records): across hosts a skew moves time between the first and last
// phases and their neighbours, and a phase that would be negative is 0.
type Phases struct {
	// StopS: the failure to srun's exit (the failed step ended; for the
	// agents' verdict, the cancel and srun's grace).
	StopS float64 `json:"stop_s"`
	// ProbeS: srun's exit to reft run knowing what failed and what was
	// committed (waiting out further verdicts, asking the agents, the
	// probe step when they did not answer).
	ProbeS float64 `json:"probe_s"`
	// ReplaceS: spares put in the lost nodes' places, lost nodes given
	// back to Slurm.
	ReplaceS float64 `json:"replace_s"`
	// BackoffS: the wait before the relaunch (run.backoff).
	BackoffS float64 `json:"backoff_s"`
	// LaunchS: the relaunch's srun start to its last rank's registration
	// with its agent (Slurm's launch, the agents' start, the trainer's
	// start-up and MPI init).
	LaunchS float64 `json:"launch_s"`
	// RestoreS: the last registration to the last rank restored (the
	// ranks' agreement on the step, and the copies).
	RestoreS float64 `json:"restore_s"`
}

// Path is the recovery log of a job.
func Path(logDir, job string) string {
	return filepath.Join(logDir, safe(job), FileName)
}

// Writer appends events to a job's recovery log.
type Writer struct {
	mu   sync.Mutex
	file io.WriteCloser
	w    errWriter
	zl   zerolog.Logger
}

// errWriter keeps the first write error, which zerolog itself only prints.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	n, err := e.w.Write(p)
	if err != nil && e.err == nil {
		e.err = err
	}
	return n, err
}

// Open creates or appends to the recovery log of job under logDir.
func Open(logDir, job string) (*Writer, error) {
	// The log directory is shared by every user: the job's directory in
	// it must be the job user's own, and the file is opened through it.
	d, err := logging.JobDir(logDir, job, os.Getuid())
	if err != nil {
		return nil, fmt.Errorf("the recovery log: %w", err)
	}
	defer d.Close()
	f, err := logging.OpenIn(d, FileName, os.O_WRONLY|os.O_CREATE|os.O_APPEND, os.Getuid())
	if err != nil {
		return nil, fmt.Errorf("the recovery log: %w", err)
	}
	return NewWriter(f), nil
}

// NewWriter writes events to w; Close closes w when it is an io.Closer.
func NewWriter(w io.Writer) *Writer {
	wr := &Writer{}
	if c, ok := w.(io.WriteCloser); ok {
		wr.file = c
	}
	wr.w = errWriter{w: w}
	wr.zl = zerolog.New(&wr.w)
	return wr
}

// Write appends one event as a JSON line, fields in a fixed order.
func (w *Writer) Write(e Event) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	lvl := zerolog.InfoLevel
	switch e.Level {
	case "warn":
		lvl = zerolog.WarnLevel
	case "error":
		lvl = zerolog.ErrorLevel
	}
	ev := w.zl.WithLevel(lvl).
		Str("job", e.Job).Str("step", e.Step).Int("restart", e.Restart).Int("relaunch", e.Relaunch).
		Str("node", e.Node).Str("event", e.Event).Str("spec", e.Spec).
		Int64("generation", e.Generation).Int64("bytes", e.Bytes).
		Float64("duration_s", math.Round(e.DurationS*1e6)/1e6).Str("cause", e.Cause)
	if e.Kind != "" {
		ev = ev.Str("kind", e.Kind)
	}
	if len(e.Nodes) > 0 {
		ev = ev.Strs("nodes", e.Nodes)
	}
	if len(e.Ranks) > 0 {
		ev = ev.Ints("ranks", e.Ranks)
	}
	if e.Replacement != "" {
		ev = ev.Str("replacement", e.Replacement)
	}
	if e.LostSteps != nil {
		ev = ev.Int64("lost_steps", *e.LostSteps)
	}
	if e.DetectedBy != "" {
		ev = ev.Str("detected_by", e.DetectedBy)
	}
	if e.DetectionS != nil {
		ev = ev.Float64("detection_s", math.Round(*e.DetectionS*1e6)/1e6)
	}
	if e.ExitCode != nil {
		ev = ev.Int("exit_code", *e.ExitCode)
	}
	if p := e.Phases; p != nil {
		r := func(s float64) float64 { return math.Round(s*1e6) / 1e6 }
		ev = ev.Dict("phases", zerolog.Dict().Float64("stop_s", r(p.StopS)).Float64("probe_s", r(p.ProbeS)).
			Float64("replace_s", r(p.ReplaceS)).Float64("backoff_s", r(p.BackoffS)).Float64("launch_s", r(p.LaunchS)).
			Float64("restore_s", r(p.RestoreS)))
	}
	ev.Str("time", e.Time.UTC().Format(time.RFC3339Nano)).Msg(e.Message)
	if w.w.err != nil {
		return fmt.Errorf("writing the recovery log: %w", w.w.err)
	}
	return nil
}

// Close closes the underlying file.
func (w *Writer) Close() error {
	if w.file == nil {
		return nil
	}
	return w.file.Close()
}

// Read parses a recovery log. Lines that are not events (a torn last line,
// foreign text) are skipped and reported in bad, one error per line.
func Read(r io.Reader) (events []Event, bad []error, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var e Event
		if jerr := json.Unmarshal(line, &e); jerr != nil || e.Event == "" {
			if jerr == nil {
				jerr = errors.New("no event field")
			}
			bad = append(bad, fmt.Errorf("line %d: %v", n, jerr))
			continue
		}
		events = append(events, e)
	}
	return events, bad, sc.Err()
}

// ReadFile reads a job's recovery log; a missing file is no error and no events.
func ReadFile(path string) ([]Event, []error, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("reading the recovery log: %w", err)
	}
	defer f.Close()
	ev, bad, err := Read(f)
	if err != nil {
		err = fmt.Errorf("reading the recovery log %s: %w", path, err)
	}
	return ev, bad, err
}

// safe keeps a path component from escaping the log directory (as the
// agents' logging does).
func safe(s string) string {
	if s == "" || s == "." || s == ".." {
		return "_"
	}
	return strings.NewReplacer("/", "_", "\x00", "_").Replace(s)
}
