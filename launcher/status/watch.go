package status

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// WatchOptions configures Watch.
type WatchOptions struct {
	// Query asks for the job's report (Query with fixed Options, or a fake
	// in tests). Watch calls it from its own goroutine, one call at a time.
	Query func(ctx context.Context) (*Report, error)
	// Interval is the time from one refresh's start to the next; 0: 2 s.
	// A query slower than that delays the next refresh, never overlaps it.
	Interval time.Duration
	// TTY: redraw the table in place (the screen cleared before each
	// refresh), with the last changes under it. Otherwise plain lines: one
	// per node at every refresh, and one per change, each timestamped, for
	// a log file or a pipe.
	TTY bool
}

// ttyChanges is how many of the newest changes the TTY view keeps under
// the table.
const ttyChanges = 8

// clearScreen moves the cursor home and clears the screen (ANSI; every
// terminal emulator Slurm users meet understands it).
const clearScreen = "\x1b[H\x1b[2J"

// Watch refreshes the job's status every Interval until ctx is done (the
// user's Ctrl-C: it returns nil) or the job no longer runs (it says so and
// returns nil). A node's agent that goes away, or comes back, is said once
// as a change, with the step it had committed. A query that fails for
// another reason (Slurm slow to answer) is said once and tried again at the
// next refresh; another user's job (ErrForeign) ends the watch with that
// error, since no refresh can change it.
func Watch(ctx context.Context, w io.Writer, o WatchOptions) error {
	if o.Interval <= 0 {
		o.Interval = 2 * time.Second
	}
	wt := watcher{w: w, o: o}
	t := time.NewTicker(o.Interval)
	defer t.Stop()
	for {
		rep, err := o.Query(ctx)
		if ctx.Err() != nil {
			return nil
		}
		switch {
		case errors.Is(err, ErrForeign):
			return err
		case errors.Is(err, ErrNotRunning):
			wt.change("the job no longer runs: " + err.Error())
			wt.flushEnd()
			return nil
		case err != nil:
			if msg := err.Error(); msg != wt.failing {
				wt.failing = msg
				wt.change(fmt.Sprintf("query failed: %s (trying again every %s)", msg, o.Interval))
			}
			wt.redraw(nil)
		default:
			if wt.failing != "" {
				wt.failing = ""
				wt.change("query answered again")
			}
			wt.compare(rep)
			wt.redraw(rep)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// watcher is Watch's state between refreshes.
type watcher struct {
	w       io.Writer
	o       WatchOptions
	prev    map[string]nodeSeen // by node, from the last report
	wasUp   map[string]bool     // nodes whose agent was up in some report
	last    *Report             // the last report, redrawn while queries fail
	changes []string            // TTY: the newest changes, oldest first
	failing string              // the failing query's error, "" when it answers
}

// nodeSeen is what Watch remembers of a node to tell changes.
type nodeSeen struct {
	agent     string
	committed string
}

func stamp() string { return time.Now().Format("15:04:05") }

// change records one change: a line of its own when plain, kept for the
// next redraw on a TTY.
func (wt *watcher) change(s string) {
	line := stamp() + " " + s
	if !wt.o.TTY {
		fmt.Fprintln(wt.w, line)
		return
	}
	wt.changes = append(wt.changes, line)
	if len(wt.changes) > ttyChanges {
		wt.changes = wt.changes[len(wt.changes)-ttyChanges:]
	}
}

// flushEnd shows the last change on a TTY (whose redraw would otherwise
// wait for a next refresh that never comes).
func (wt *watcher) flushEnd() {
	if wt.o.TTY && len(wt.changes) > 0 {
		fmt.Fprintln(wt.w, wt.changes[len(wt.changes)-1])
	}
}

// compare records the changes from the previous report to rep.
func (wt *watcher) compare(rep *Report) {
	seen := map[string]nodeSeen{}
	for _, n := range rep.Nodes {
		now := nodeSeen{agent: n.Agent, committed: committed(n)}
		seen[n.Node] = now
		before, known := wt.prev[n.Node]
		switch {
		case wt.prev == nil:
		case !known:
			wt.change(fmt.Sprintf("%s joined the report (agent %s)", n.Node, n.Agent))
		case before.agent == AgentUp && n.Agent != AgentUp:
			why := n.Error
			if why == "" {
				why = "no reason given"
			}
			wt.change(fmt.Sprintf("%s: its agent went away (agent %s; it had committed step %s): %s", n.Node, n.Agent, before.committed, why))
		case before.agent != AgentUp && n.Agent == AgentUp:
			again := ""
			if wt.wasUp[n.Node] {
				again = " again"
			}
			step := "committed step " + now.committed
			if now.committed == "-" {
				step = "no rank registered yet" // a relaunch's new agent, before its ranks
			}
			wt.change(fmt.Sprintf("%s: its agent is up%s (%s)", n.Node, again, step))
		}
		if n.Agent == AgentUp {
			if wt.wasUp == nil {
				wt.wasUp = map[string]bool{}
			}
			wt.wasUp[n.Node] = true
		}
	}
	for node, before := range wt.prev {
		if _, ok := seen[node]; !ok {
			wt.change(fmt.Sprintf("%s left the report (agent was %s, committed step %s)", node, before.agent, before.committed))
		}
	}
	wt.prev, wt.last = seen, rep
}

// redraw shows rep (nil: the last one, while queries fail).
func (wt *watcher) redraw(rep *Report) {
	if !wt.o.TTY {
		if rep == nil {
			return // the failure was said; no stale node lines
		}
		ts := stamp()
		for _, n := range rep.Nodes {
			fmt.Fprintf(wt.w, "%s %s agent %s committed %s peers %s%s\n", ts, n.Node, n.Agent, committed(n), peerCell(n, rep.Nodes), degradedText(n))
		}
		return
	}
	if rep == nil {
		rep = wt.last
	}
	// One write per refresh, so the terminal never shows a half-drawn table.
	var b bytes.Buffer
	b.WriteString(clearScreen)
	fmt.Fprintf(&b, "reft status --watch, every %s, at %s (Ctrl-C to stop)\n", wt.o.Interval, stamp())
	if wt.failing != "" {
		fmt.Fprintf(&b, "QUERY FAILING: %s\n", wt.failing)
	}
	if rep != nil {
		Print(&b, rep)
	}
	if len(wt.changes) > 0 {
		b.WriteString("changes:\n")
		for _, c := range wt.changes {
			b.WriteString("  " + c + "\n")
		}
	}
	wt.w.Write(b.Bytes())
}

// committed is a node's ranks' newest committed steps, "12,11"; "-" for
// a node whose agent did not answer or holds no rank.
func committed(n NodeReport) string {
	if n.Status == nil || len(n.Status.Ranks) == 0 {
		return "-"
	}
	var cs []string
	for _, rk := range n.Status.Ranks {
		if rk.Newest < 0 {
			cs = append(cs, "none")
		} else {
			cs = append(cs, strconv.FormatInt(rk.Newest, 10))
		}
	}
	return strings.Join(cs, ",")
}

func peerCell(n NodeReport, all []NodeReport) string {
	if n.Status == nil {
		return "-"
	}
	return peers(n.Status, all)
}

// degradedText is a plain line's tail: the node's warnings, or why its
// agent is not up.
func degradedText(n NodeReport) string {
	if n.Agent == AgentNone {
		return " (" + n.Error + ")" // a spare: nothing wrong
	}
	var w []string
	if n.Error != "" {
		w = append(w, n.Error)
	}
	w = append(w, n.Warnings...)
	if len(w) == 0 {
		return ""
	}
	return " degraded: " + strings.Join(w, "; ")
}
