package recoverylog

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// ProbeStepName is the name of the steps with which reft run asks every
// node's agent for its state; the timeline leaves them out.
const ProbeStepName = "reft-probe"

// stateResizing is sacct's state for a record that ends because its job
// changed size.
const stateResizing = "RESIZING"

// nodeText is a record's node list with its count: "n[1-4] (4 nodes)".
func nodeText(r Record) string {
	if r.NNodes <= 0 {
		return r.NodeList
	}
	return fmt.Sprintf("%s (%d node%s)", r.NodeList, r.NNodes, map[bool]string{true: "", false: "s"}[r.NNodes == 1])
}

// Entry is one line of a job's timeline.
type Entry struct {
	Time     time.Time `json:"time"`
	Source   string    `json:"source"` // "slurm" (sacct) or "reft" (recovery log)
	Event    string    `json:"event"`  // job_start, job_resized, job_end, step_start, step_end, or a recovery event
	Step     string    `json:"step,omitempty"`
	Text     string    `json:"text"`
	Sacct    *Record   `json:"sacct,omitempty"`
	Recovery *Event    `json:"recovery,omitempty"`
}

// Timeline joins sacct records and recovery events in time order. Extern
// and probe steps are left out; a record's start or end that sacct does
// not know (yet) gives no entry.
func Timeline(recs []Record, events []Event) []Entry {
	var out []Entry
	// next: a RESIZING job record's following record of the same job;
	// continues: the records that follow one (sacct lists them in order).
	next, continues := map[int]int{}, map[int]bool{}
	last := map[string]int{}
	for i, r := range recs {
		if !r.IsJob() {
			continue
		}
		if p, ok := last[r.JobID]; ok && recs[p].State == stateResizing {
			next[p], continues[i] = i, true
		}
		last[r.JobID] = i
	}
	for i := range recs {
		r := &recs[i]
		if r.StepID() == "extern" || r.Name == ProbeStepName {
			continue
		}
		nodes := nodeText(*r)
		if r.IsJob() {
			// A job that loses a node under --no-kill shrinks: Slurm 24.11's
			// sacct ends its record there, RESIZING, and goes on in the job's
			// next record (same start) on the nodes left. The resize is
			// one entry; the next record's start is not a second start.
			if !r.Start.IsZero() && !continues[i] {
				out = append(out, Entry{Time: r.Start, Source: "slurm", Event: "job_start", Sacct: r,
					Text: fmt.Sprintf("job %s (%s) started on %s", r.JobID, r.Name, nodes)})
			}
			if !r.End.IsZero() {
				e := Entry{Time: r.End, Source: "slurm", Event: "job_end", Sacct: r,
					Text: fmt.Sprintf("job %s ended %s, exit %s, after %s", r.JobID, r.State, r.ExitCode, r.Elapsed)}
				if r.State == stateResizing {
					e.Event, e.Text = "job_resized", fmt.Sprintf("job %s resized after %s: its allocation on %s ends", r.JobID, r.Elapsed, nodes)
					if n, ok := next[i]; ok {
						e.Text = fmt.Sprintf("job %s resized after %s: it goes on on %s", r.JobID, r.Elapsed, nodeText(recs[n]))
					}
				}
				out = append(out, e)
			}
			continue
		}
		if !r.Start.IsZero() {
			out = append(out, Entry{Time: r.Start, Source: "slurm", Event: "step_start", Step: r.JobID, Sacct: r,
				Text: fmt.Sprintf("step %s (%s) started on %s", r.JobID, r.Name, nodes)})
		}
		if !r.End.IsZero() {
			text := fmt.Sprintf("step %s ended %s, exit %s, after %s", r.JobID, r.State, r.ExitCode, r.Elapsed)
			if r.State == stateResizing {
				// The step did not end: its record did, with the job's resize.
				text = fmt.Sprintf("step %s: its record ends with the job's resize, after %s", r.JobID, r.Elapsed)
			}
			out = append(out, Entry{Time: r.End, Source: "slurm", Event: "step_end", Step: r.JobID, Sacct: r, Text: text})
		}
	}
	for i := range events {
		e := &events[i]
		out = append(out, Entry{Time: e.Time, Source: "reft", Event: e.Event, Step: e.Step, Recovery: e, Text: Format(*e)})
	}
	// sacct has whole seconds: at equal times, starts sort before reft's
	// events and ends after them, the job's outside its steps'.
	rank := func(e Entry) int {
		switch e.Event {
		case "job_start":
			return 0
		case "step_start":
			return 1
		case "step_end":
			return 3
		case "job_end", "job_resized":
			return 4
		}
		return 2
	}
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].Time.Equal(out[j].Time) {
			return out[i].Time.Before(out[j].Time)
		}
		return rank(out[i]) < rank(out[j])
	})
	return out
}

// Format renders a recovery event as one line for humans.
func Format(e Event) string {
	var s string
	nodes := strings.Join(e.Nodes, ",")
	gen := func() string {
		if e.Generation < 0 {
			return "none"
		}
		return "step " + strconv.FormatInt(e.Generation, 10)
	}
	switch e.Event {
	case StepLaunched:
		s = fmt.Sprintf("launched the step on %s (--reft=%s)", nodes, e.Spec)
	case FailureDetected:
		s = fmt.Sprintf("failure: %s: %s; newest committed snapshot: %s", Describe(e), e.Cause, gen())
		if e.DetectedBy == "agents" && e.DetectionS != nil {
			s += fmt.Sprintf("; detected by the agents %s after the last sign of life", shortDuration(*e.DetectionS))
		}
	case NodeExcluded:
		s = fmt.Sprintf("excluded %s for the rest of the allocation", e.Node)
		if e.Replacement != "" {
			s += "; spare " + e.Replacement + " takes its ranks"
		}
	case StepRelaunched:
		s = fmt.Sprintf("relaunch %d on %s, %s after the failure", e.Relaunch, nodes, seconds(e.DurationS))
		if e.Cause != "" {
			s += " (" + e.Cause + ")"
		}
	case RestoreLocal, RestorePeer, Decode, RestorePersistent:
		from := map[string]string{RestoreLocal: "from its tmpfs", RestorePeer: "from a peer", Decode: "by decoding parity",
			RestorePersistent: "from the persistent directory"}[e.Event]
		s = fmt.Sprintf("%s: %s restored %s %s (%s, %s)", e.Node, rankList(e.Ranks), gen(), from, bytesText(e.Bytes), shortDuration(e.DurationS))
		if e.Event == RestorePersistent && e.Cause != "" {
			s += ": " + e.Cause // why memory could not serve it
		}
	case Resumed:
		if e.Generation < 0 {
			s = fmt.Sprintf("started over, nothing to restore, %s after the failure", seconds(e.DurationS))
		} else {
			s = fmt.Sprintf("resumed from step %d, %s after the failure", e.Generation, seconds(e.DurationS))
			if e.LostSteps != nil {
				s += ", lost " + plural(*e.LostSteps, "step")
			}
			if p := e.Phases; p != nil {
				s += fmt.Sprintf(" (stop %s, probe %s, replace %s, backoff %s, launch %s, restore %s)", seconds(p.StopS), seconds(p.ProbeS),
					seconds(p.ReplaceS), seconds(p.BackoffS), seconds(p.LaunchS), seconds(p.RestoreS))
			}
		}
	case JobRequeued:
		s = "requeued the job: " + e.Cause
	case GaveUp:
		s = "gave up: " + e.Cause
	case Straggler:
		s = e.Cause // it begins "straggler: rank N on NODE"
	case Degraded:
		s = "degraded on " + e.Node + ": " + e.Cause
	case DegradedCleared:
		s = "no longer degraded on " + e.Node
	case Stopped:
		s = "stopped: " + e.Cause
	case Completed:
		s = "the step completed"
		if e.Relaunch > 0 {
			s += fmt.Sprintf(" after %d relaunch(es)", e.Relaunch)
		}
	default:
		s = e.Event
		if e.Cause != "" {
			s += ": " + e.Cause
		}
	}
	if e.Step != "" {
		s += " [step " + e.Step + "]"
	}
	return s
}

// shortDuration shows sub-second durations in milliseconds.
func shortDuration(s float64) string {
	if s < 1 {
		return strconv.FormatFloat(s*1000, 'f', 1, 64) + " ms"
	}
	return seconds(s)
}

func rankList(ranks []int) string {
	if len(ranks) == 0 {
		return "ranks"
	}
	rs := make([]string, len(ranks))
	for i, r := range ranks {
		rs[i] = strconv.Itoa(r)
	}
	if len(rs) == 1 {
		return "rank " + rs[0]
	}
	return "ranks " + strings.Join(rs, ",")
}

func bytesText(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + " B"
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
