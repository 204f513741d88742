package run

import (
	"context"
	"os"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/agent/peer"
	"github.com/reft-hpc/reft/agent/peerconfig"
	"github.com/reft-hpc/reft/launcher/recoverylog"
	"github.com/reft-hpc/reft/launcher/status"
)

// StragglerSource asks the job's agents for the stragglers they measure
// (status.FindStragglers over their status replies). It may take up to
// its own timeout and is called from one goroutine at a time.
type StragglerSource func(ctx context.Context) ([]status.Straggler, error)

// DefaultStragglerEvery is how often reft run asks while a step runs: a
// straggler slows every step, so minutes matter, not seconds, and each
// ask is one status request per agent and one squeue.
const DefaultStragglerEvery = 30 * time.Second

// stragglerWatch asks a StragglerSource in the background, at most one
// ask in flight, and hands each result to the attempt's loop.
type stragglerWatch struct {
	src   StragglerSource
	every time.Duration
	last  time.Time
	busy  bool
	out   chan stragglerResult
	// reported: the ranks already in the recovery log for this attempt.
	reported map[int]bool
}

type stragglerResult struct {
	ss  []status.Straggler
	err error
}

func newStragglerWatch(src StragglerSource, every time.Duration) *stragglerWatch {
	if every <= 0 {
		every = DefaultStragglerEvery
	}
	return &stragglerWatch{src: src, every: every, out: make(chan stragglerResult, 1), reported: map[int]bool{}}
}

// tick starts an ask when one is due and none is in flight. A nil watch
// (no source) does nothing.
func (w *stragglerWatch) tick(ctx context.Context, now time.Time) {
	if w == nil || w.busy || now.Sub(w.last) < w.every {
		return
	}
	w.busy, w.last = true, now
	go func() {
		ss, err := w.src(ctx)
		w.out <- stragglerResult{ss, err}
	}()
}

// results is the channel the attempt's loop selects on; nil (never
// ready) without a source.
func (w *stragglerWatch) results() <-chan stragglerResult {
	if w == nil {
		return nil
	}
	return w.out
}

// record writes a straggler event for each rank not yet reported in this
// attempt; an ask that failed is said once (reft run's other work does not
// depend on it).
func (r *Runner) recordStragglers(ctx context.Context, a *attempt, w *stragglerWatch, res stragglerResult) {
	w.busy = false
	if res.err != nil {
		r.warnOnce("stragglers", "cannot ask the agents for stragglers (%v); the recovery log will not show them", res.err)
		return
	}
	for _, s := range res.ss {
		if w.reported[s.Rank] {
			continue
		}
		w.reported[s.Rank] = true
		e := r.event(recoverylog.Straggler, a.relaunch)
		e.Step, e.Node, e.Ranks, e.DurationS, e.Cause = a.stepID, s.Node, []int{s.Rank}, s.ComputeS, s.String()
		r.emit(ctx, e)
	}
}

// AgentStragglers asks the job's agents over their peer ports, as `reft
// status` does (same configuration, the job's user).
func AgentStragglers(cfg config.Config, job string) (StragglerSource, error) {
	host, _ := os.Hostname()
	pc, err := peerconfig.FromAgentConfig(cfg, peer.Config{Job: job, UID: os.Getuid(), Node: "reft-run@" + host, Role: peer.RoleStatus, Log: zerolog.Nop()})
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) ([]status.Straggler, error) {
		rep, err := status.Query(ctx, status.Options{Peer: pc, Jobs: status.Slurm{Conf: cfg.Agent.SlurmConf}, Timeout: 10 * time.Second})
		if err != nil {
			return nil, err
		}
		return rep.Stragglers, nil
	}, nil
}
