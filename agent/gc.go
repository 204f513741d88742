package agent

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/hostmem"
	"github.com/reft-hpc/reft/tmpfs/gc"
)

// gcTimeout bounds the collection at start: squeue and scontrol answer in
// seconds even from a busy slurmctld, and the agent serves meanwhile.
const gcTimeout = 2 * time.Minute

// collectOnStart removes the user's snapshot data on this node that no
// running or pending job owns (tmpfs/gc): a job killed before its agent
// cleaned up leaves its generations in memory, and nothing else frees
// them short of `reft gc`. It keeps the agent's own job, every job Slurm
// says runs or waits (a requeued job's restart needs its data), every job
// Slurm cannot say about, and any store whose agent still holds its lock.
// Failures are logged and never stop the agent.
func collectOnStart(ctx context.Context, root string, uid int, job string, jobs gc.Jobs, log zerolog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, gcTimeout)
	defer cancel()
	decs, err := gc.Collect(ctx, gc.Options{Root: root, UID: uid, Except: job, Jobs: jobs, Log: log})
	if err != nil {
		log.Warn().Err(err).Str("event", "gc_skipped").
			Msg("garbage collection at start removed nothing; data of ended jobs stays on this node until an agent starts with Slurm reachable, or `reft gc` runs")
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
		Msgf("garbage collection at start: removed the data of %d ended job(s) (%s), kept %d", removed, hostmem.FormatBytes(bytes), kept)
}
