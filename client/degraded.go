package client

import (
	"strings"
	"sync"
)

// degradedNotice says, once per change, what the agent's commit replies
// say of the node's protection (proto.CommitReply.Degraded): a warning
// when the reasons appear or change, a notice when they are gone. Safe for
// concurrent use (each save's commit runs on its own goroutine).
type degradedNotice struct {
	mu   sync.Mutex
	said string // the reasons last said, "" none
}

// note takes one commit reply's reasons and returns what to say, "" for
// nothing.
func (d *degradedNotice) note(why []string) string {
	now := strings.Join(why, ", ")
	d.mu.Lock()
	defer d.mu.Unlock()
	if now == d.said {
		return ""
	}
	was := d.said
	d.said = now
	if now == "" {
		return "the agent says this node's snapshots are protected as the SPEC asks again (it had said: " + was + ")"
	}
	return "warning: the agent says this node's snapshots are less protected than the SPEC asks (" + now +
		"): a failure may cost more than the SPEC promises; `reft status` says why, docs/METRICS.md explains each reason"
}
