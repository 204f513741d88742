package agent

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/hostmem"
	"github.com/reft-hpc/reft/tmpfs/gc"
)

// gcTimeout bounds the collection at start (local directory walks only).
const gcTimeout = 2 * time.Minute

// collectOnStart removes the user's snapshot data on this node that sat
// unchanged beyond [store] max_age (tmpfs/gc): the net under a job end the
// job epilog missed (the node was down, the plugin not loaded). It never
// asks Slurm: every agent of a job starts at once on every node, and a
// squeue from each would be a thundering herd on slurmctld; the job epilog
// removes a job's store at its end, and `reft gc` asks Slurm when an admin
// runs it. It keeps the agent's own job and any store whose agent still
// holds its lock. Failures are logged and never stop the agent.
func collectOnStart(ctx context.Context, root, hugetlbfs string, uid int, job string, maxAge time.Duration, log zerolog.Logger) {
	if maxAge <= 0 {
		return // disabled by the admin; nothing to say per start
	}
	ctx, cancel := context.WithTimeout(ctx, gcTimeout)
	defer cancel()
	decs, err := gc.Collect(ctx, gc.Options{Root: root, HugeTLBFS: hugetlbfs, UID: uid, Except: job, MaxAge: maxAge, Log: log})
	if err != nil {
		log.Warn().Err(err).Str("event", "gc_skipped").
			Msg("garbage collection at start removed nothing; old data stays on this node until the next agent or `reft gc`")
		return
	}
	var removed, kept, failed int
	var bytes int64
	for _, d := range decs {
		switch {
		case d.Err != nil:
			failed++ // Collect logged why
		case d.Remove:
			removed++
			bytes += d.Bytes
		default:
			kept++
		}
	}
	log.Info().Str("event", "gc_done").Int("removed", removed).Int64("bytes", bytes).Int("kept", kept).Int("failed", failed).
		Msgf("garbage collection at start: removed %d store(s) unchanged for more than %s (%s), kept %d", removed, maxAge, hostmem.FormatBytes(bytes), kept)
}
