// Package runrecord is the channel from the agents to `reft run`: the
// record each agent keeps of exactly what reft run decides on, and
// nothing else. An agent appends one JSON line per fact to
// <log dir>/<job>/<node>.record (FileName): a rank registered, a rank
// restored, and, on the agent that coordinated it, a failure verdict.
// reft run (launcher/run's Watcher) reads the records of the
// allocation's nodes; it no longer reads the agents' logs, whose lines
// are for people and may change with any release.
//
// The contract (docs/EVENTS.md, "The run record"):
//
//   - Every line is one JSON object with "v" (Version), "kind" (one of
//     the Kind constants), "node" (the writing agent's node) and "time".
//   - A reader refuses a line of another version (Decode's error says
//     which agent to upgrade), skips kinds it does not know (ErrUnknownKind:
//     a newer agent may record more), and refuses a line that breaks the
//     rules of its kind (Decode says which rule).
//   - A line is written in one write(2) on a file opened O_APPEND, so a
//     reader sees whole lines or a torn last line that a later write
//     completes, never lines of two writers mixed.
//   - The file is the job user's alone (0600, in the job's log directory
//     that agent/logging checks is private); readers open it only through
//     logging.OpenIn.
//
// The package imports nothing of the agent: reft run links it without
// the agent.
package runrecord

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/reft-hpc/reft/agent/event"
)

// Version is the record format's version; Decode refuses any other.
const Version = 1

// FileName is a node's record in the job's log directory.
func FileName(node string) string { return node + Suffix }

// Suffix ends every record's file name (an agent's log ends in .jsonl).
const Suffix = ".record"

// Kinds of record line.
const (
	// KindRegistered: a rank registered with the agent.
	KindRegistered = "registered"
	// KindRestored: the agent served a rank's restore; Event says how
	// (one of event.Restores).
	KindRestored = "restored"
	// KindFailure: this agent coordinated a failure verdict (agent/detect)
	// and published it to the job's agents. Only the coordinator records
	// it, once.
	KindFailure = "failure"
)

// ErrUnknownKind: the line is of this version but of a kind this reader
// does not know. Readers skip such lines.
var ErrUnknownKind = errors.New("unknown record kind")

// Record is one line. Which fields a kind carries is in the comments;
// the others are zero and omitted.
type Record struct {
	V    int       `json:"v"`
	Kind string    `json:"kind"`
	Node string    `json:"node"` // the writing agent's node
	Time time.Time `json:"time"`

	// registered and restored: the rank, its client's process and the
	// Slurm step its hello named ("" when it named none).
	Rank int    `json:"rank,omitempty"`
	PID  int    `json:"pid,omitempty"`
	Step string `json:"step,omitempty"`
	// restored: how (event.Restores), the generation, the bytes served,
	// how long it took, and, when memory could not serve it, why.
	Event      string        `json:"event,omitempty"`
	Generation int64         `json:"generation,omitempty"`
	Bytes      int64         `json:"bytes,omitempty"`
	Duration   time.Duration `json:"duration_ns,omitempty"`
	Reason     string        `json:"reason,omitempty"`

	// failure: the verdict as agent/detect published it.
	Failure *Failure `json:"failure,omitempty"`
}

// Failure is a published failure verdict.
type Failure struct {
	FailedNode  string        `json:"failed_node"`
	Class       string        `json:"class"` // node, agent or hang
	Ranks       []int         `json:"ranks,omitempty"`
	Cause       string        `json:"cause"`
	Coordinator string        `json:"coordinator"`
	Reporter    string        `json:"reporter"`
	ConfirmedBy []string      `json:"confirmed_by,omitempty"`
	Latency     time.Duration `json:"latency_ns"`
	LastHeard   time.Time     `json:"last_heard"` // zero: never heard
	DetectedAt  time.Time     `json:"detected_at"`
	// A node or agent verdict's quorum evidence.
	Quorum bool `json:"quorum"`
	Votes  int  `json:"votes"`
	Agents int  `json:"agents"`
}

// Failure classes (agent/detect's).
var classes = []string{"node", "agent", "hang"}

// Encode is r as one line, newline included, with V set to Version.
func Encode(r Record) ([]byte, error) {
	r.V = Version
	if err := r.check(); err != nil {
		return nil, err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encoding a run record: %w", err)
	}
	return append(b, '\n'), nil
}

// Decode reads one line (without its newline). Its errors name the rule
// the line breaks; ErrUnknownKind for a kind it does not know.
func Decode(line []byte) (Record, error) {
	var r Record
	d := json.NewDecoder(bytes.NewReader(line))
	if err := d.Decode(&r); err != nil {
		return Record{}, fmt.Errorf("a run record line is not JSON of the record format: %w", err)
	}
	if d.More() {
		return Record{}, errors.New("a run record line holds more than one JSON value")
	}
	if r.V != Version {
		return Record{}, fmt.Errorf("run record version %d, this reader knows %d: run the same reft release on every node and where reft run runs", r.V, Version)
	}
	if err := r.check(); err != nil {
		return Record{}, err
	}
	return r, nil
}

// check enforces a kind's rules.
func (r Record) check() error {
	if r.Node == "" || strings.ContainsAny(r.Node, "/\x00\n") {
		return fmt.Errorf("run record: node %q is not a node name", r.Node)
	}
	switch r.Kind {
	case KindRegistered:
		return r.checkRank()
	case KindRestored:
		if err := r.checkRank(); err != nil {
			return err
		}
		return r.checkRestore()
	case KindFailure:
		return r.Failure.check()
	}
	return fmt.Errorf("%w %q", ErrUnknownKind, r.Kind)
}

// checkRank: a registration's or restore's rank and pid, and no failure.
func (r Record) checkRank() error {
	if r.Rank < 0 || r.PID < 0 {
		return fmt.Errorf("run record %s: rank %d, pid %d: neither may be negative", r.Kind, r.Rank, r.PID)
	}
	if r.Failure != nil {
		return fmt.Errorf("run record %s carries a failure", r.Kind)
	}
	return nil
}

// checkRestore: a restore names a restore event and no negative measure.
func (r Record) checkRestore() error {
	if !slices.Contains(event.Restores, r.Event) {
		return fmt.Errorf("run record restored: event %q is none of %s", r.Event, strings.Join(event.Restores, ", "))
	}
	if r.Generation < 0 || r.Bytes < 0 || r.Duration < 0 {
		return fmt.Errorf("run record restored: generation %d, bytes %d, duration %v: none may be negative", r.Generation, r.Bytes, r.Duration)
	}
	return nil
}

// check: a failure names the failed node and a class, and no negative
// measure.
func (f *Failure) check() error {
	if f == nil || f.FailedNode == "" || !slices.Contains(classes, f.Class) {
		return errors.New("run record failure: needs a failure with a failed_node and a class of node, agent or hang")
	}
	if slices.ContainsFunc(f.Ranks, func(n int) bool { return n < 0 }) || f.Latency < 0 || f.Votes < 0 || f.Agents < 0 {
		return errors.New("run record failure: ranks, latency, votes and agents may not be negative")
	}
	return nil
}

// Writer appends records to a node's record file. Its methods are safe
// for concurrent use and never block on anything but the file's write;
// a nil *Writer records nothing (an agent without a log directory, and
// tests). A failed write is returned to the caller, which logs it: the
// record is not the log, and reft run then sees less (its Watcher says
// when a node has no record at all).
type Writer struct {
	mu   sync.Mutex
	w    io.Writer
	node string
	now  func() time.Time
}

// NewWriter records node's facts on w, which must append whole writes
// atomically (an *os.File opened O_APPEND). now stamps lines; nil:
// time.Now.
func NewWriter(w io.Writer, node string, now func() time.Time) *Writer {
	if now == nil {
		now = time.Now
	}
	return &Writer{w: w, node: node, now: now}
}

// Write stamps r with the node, and with the time unless r has one, and
// appends it in one write.
func (w *Writer) Write(r Record) error {
	if w == nil {
		return nil
	}
	r.Node = w.node
	if r.Time.IsZero() {
		r.Time = w.now()
	}
	b, err := Encode(r)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, err := w.w.Write(b); err != nil {
		return fmt.Errorf("appending to the run record: %w", err)
	}
	return nil
}

// Registered records a rank's registration.
func (w *Writer) Registered(rank, pid int, step string) error {
	return w.Write(Record{Kind: KindRegistered, Rank: rank, PID: pid, Step: step})
}

// Restored records a restore the agent served; r's Rank, PID, Step,
// Event, Generation, Bytes, Duration and Reason are taken.
func (w *Writer) Restored(r Record) error {
	r.Kind = KindRestored
	return w.Write(r)
}

// Failed records a failure verdict this agent coordinated.
func (w *Writer) Failed(f Failure, at time.Time) error {
	return w.Write(Record{Kind: KindFailure, Time: at, Failure: &f})
}
