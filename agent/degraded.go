package agent

import (
	"slices"
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
	mu    sync.Mutex
	at    time.Time // when why was computed
	why   []string  // the reasons then
	since time.Time // since when they have been these
}

// reasons returns the node's degradation reasons once they have held for
// grace (0: DegradedGrace), else nil; status computes them afresh when
// due, under d's lock (it must not call back into d).
func (d *degradedState) reasons(now time.Time, grace time.Duration, status func() []string) []string {
	if grace <= 0 {
		grace = DegradedGrace
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.at.IsZero() || now.Sub(d.at) >= time.Second {
		why := status()
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
