package agent

import (
	"context"
	"time"

	"github.com/rs/zerolog"
)

// jobStater reports the job's state (mesh.Slurm in the agent).
type jobStater interface {
	JobState(ctx context.Context) (state string, gone bool, err error)
}

// liveJobStates are the states in which a job's steps may still use its
// agents. In any other state (ended, or PENDING after a requeue: its next
// run starts agents of its own) the agent stops. COMPLETING is not live:
// the job's steps are gone, and the job epilog on this node waits for the
// agent to let go of the store before it removes it (spank/plugin/epilog.go).
var liveJobStates = map[string]bool{
	"RUNNING": true, "SUSPENDED": true, "CONFIGURING": true, "RESIZING": true,
	"SIGNALING": true, "STAGE_OUT": true,
}

// watchJob stops the agent (cancel) once slurmctld says its job no longer
// runs. The plugin stops agents when the job's extern step ends, but an
// agent started by a later step (after a node loss shrank the allocation
// and ended the extern step) would otherwise outlive the job and keep its
// pinned memory. Errors from scontrol keep the agent running; the first
// one is logged.
func watchJob(ctx context.Context, cancel context.CancelFunc, js jobStater, every time.Duration, log zerolog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	warned := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		state, gone, err := js.JobState(ctx)
		switch {
		case err != nil:
			if !warned && ctx.Err() == nil {
				log.Warn().Err(err).Str("event", "job_watch_error").Msg("cannot read the job's state; the agent keeps running")
				warned = true
			}
		case gone || !liveJobStates[state]:
			if gone {
				state = "unknown to slurmctld"
			}
			log.Info().Str("event", "job_ended").Str("job_state", state).Msg("the job no longer runs; the agent stops")
			cancel()
			return
		}
	}
}
