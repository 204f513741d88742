package recoverylog

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxSummary bounds the Comment that reft run keeps: one line, short
// enough for `sacct -o Comment%80` to show most of it.
const MaxSummary = 200

// Summarize gives the one-line recovery summary of a job's events, for its
// Comment: "reft: 1 failure (rank 2 on n3), resumed from step 812 in 6.4 s,
// lost 0 steps". It is "" while nothing has failed, so that a job without
// failures keeps the user's own comment.
func Summarize(events []Event) string {
	failures, last := 0, -1
	for i, e := range events {
		if e.Event == FailureDetected {
			failures++
			last = i
		}
	}
	if failures == 0 {
		return ""
	}
	f := events[last]
	what := Describe(f)
	var spares []string
	for _, e := range events[last+1:] {
		if e.Event == NodeExcluded && e.Replacement != "" {
			spares = append(spares, e.Replacement)
		}
	}
	if len(spares) > 0 {
		what += ", replaced by " + strings.Join(spares, ",")
	}
	var b strings.Builder
	if failures == 1 {
		fmt.Fprintf(&b, "reft: 1 failure (%s)", what)
	} else {
		fmt.Fprintf(&b, "reft: %d failures (last: %s)", failures, what)
	}
	b.WriteString(", " + outcome(events[last+1:]))
	s := b.String()
	if len(s) > MaxSummary {
		s = s[:MaxSummary-3] + "..."
	}
	return s
}

// outcome says what followed a failure: the latest decisive event wins.
func outcome(after []Event) string {
	state := "relaunching"
	requeued := ""
	for _, e := range after {
		switch e.Event {
		case StepRelaunched:
			state = "relaunched"
		case StepLaunched:
			if requeued != "" {
				state = "requeued, running again"
			}
		case Resumed:
			if e.Generation < 0 {
				state = fmt.Sprintf("started over (nothing to restore) in %s", seconds(e.DurationS))
			} else {
				lost := "lost steps unknown"
				if e.LostSteps != nil {
					lost = "lost " + plural(*e.LostSteps, "step")
				}
				state = fmt.Sprintf("%sresumed from step %d in %s, %s", requeued, e.Generation, seconds(e.DurationS), lost)
			}
		case JobRequeued:
			state, requeued = "no spare left, job requeued", "requeued, "
		case GaveUp:
			state = "gave up: " + e.Cause
		case Stopped:
			state = "stopped: " + e.Cause
		}
	}
	return state
}

// Describe names what failed, for summaries and timelines: "rank 2 on n3",
// "agent on n2", "node n3 lost", "step: srun exited 1".
func Describe(e Event) string {
	nodes := strings.Join(e.Nodes, ",")
	if nodes == "" {
		nodes = e.Node
	}
	switch e.Kind {
	case KindRank:
		if len(e.Ranks) == 0 {
			return "a rank on " + nodes
		}
		rs := make([]string, len(e.Ranks))
		for i, r := range e.Ranks {
			rs[i] = strconv.Itoa(r)
		}
		word := "rank"
		if len(rs) > 1 {
			word = "ranks"
		}
		return fmt.Sprintf("%s %s on %s", word, strings.Join(rs, ","), nodes)
	case KindAgent:
		return "agent on " + nodes
	case KindHang:
		if len(e.Ranks) == 0 {
			return "hang on " + nodes
		}
		rs := make([]string, len(e.Ranks))
		for i, r := range e.Ranks {
			rs[i] = strconv.Itoa(r)
		}
		return fmt.Sprintf("hang of rank(s) %s on %s", strings.Join(rs, ","), nodes)
	case KindNode:
		if len(e.Nodes) > 1 {
			return "nodes " + nodes + " lost"
		}
		return "node " + nodes + " lost"
	}
	if e.Cause != "" {
		return "step: " + e.Cause
	}
	return "step failed"
}

func seconds(s float64) string { return strconv.FormatFloat(s, 'f', 1, 64) + " s" }

func plural(n int64, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return strconv.FormatInt(n, 10) + " " + word + "s"
}
