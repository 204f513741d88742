package agent

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// DegradedGrace is how long the node's protection must have been below its
// SPEC, for the same reasons, before commit replies say so: a new agent's
// peering takes a moment to come up, and a peer's agent restarting takes a
// moment too; neither is worth a warning in every rank's output.
const DegradedGrace = 10 * time.Second

// degradedState is what commit replies say of the node's protection
// (metrics.Degraded of the agent's own status, as the
// reft_protection_degraded metric). A status costs more than a commit
// should, so it is recomputed at most once a second. Safe for concurrent
// use: every rank's connection reads it.
type degradedState struct {
	// status is the node's reasons now: the Server's own status, given at
	// construction (the one hook from a part back to the whole). It runs
	// on a commit's goroutine under mu, so it must not wait for a commit
	// or call back into d.
	status func() []string

	mu    sync.Mutex
	at    time.Time // when why was computed
	why   []string  // the reasons then
	since time.Time // since when they have been these
}

// reasons returns the node's degradation reasons once they have held for
// grace (0: DegradedGrace), else nil; d.status computes them afresh when
// due.
func (d *degradedState) reasons(now time.Time, grace time.Duration) []string {
	if grace <= 0 {
		grace = DegradedGrace
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.at.IsZero() || now.Sub(d.at) >= time.Second {
		why := d.status()
		if !slices.Equal(why, d.why) {
			d.since = now
		}
		d.at, d.why = now, why
	}
	if len(d.why) == 0 || now.Sub(d.since) < grace {
		return nil
	}
	return slices.Clone(d.why)
}

// strictRefusal is why a commit is refused under a strict SPEC: its
// protection has fallen below the modes' (why, from reasons) for the
// grace; nil when the SPEC is not strict or nothing is short.
func strictRefusal(strict bool, grace time.Duration, why []string) error {
	if !strict || len(why) == 0 {
		return nil
	}
	if grace <= 0 {
		grace = DegradedGrace
	}
	return fmt.Errorf("the SPEC is strict and this node's snapshots have been less protected than it asks for %s or more (%s): "+
		"the step fails rather than train on; `reft status` says why, docs/METRICS.md explains each reason; "+
		"fix the cause, or leave strict out of --reft to train on with a warning", grace, strings.Join(why, ", "))
}
