package run

import (
	"context"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/agent/metrics"
	"github.com/reft-hpc/reft/agent/peer"
	"github.com/reft-hpc/reft/agent/peerconfig"
	"github.com/reft-hpc/reft/launcher/recoverylog"
	"github.com/reft-hpc/reft/launcher/status"
)

// AgentHealth is what reft run learns from the job's agents while a step
// runs: the stragglers they measure and the nodes whose protection or
// health they report degraded.
type AgentHealth struct {
	Stragglers []status.Straggler
	// Degraded maps each node whose snapshots are less protected than the
	// SPEC asks to why, as the reft_protection_degraded metric says it
	// (metrics.Degraded: peering, peer_lost, placement, rank_local,
	// save_failures). Other warnings of `reft status` (unpinned arenas, a
	// memory budget nearly used) are not a loss of protection.
	Degraded map[string][]string
}

// HealthSource asks the job's agents for their AgentHealth (one status
// request per agent and one squeue, as `reft status`). It may take up to
// its own timeout and is called from one goroutine at a time.
type HealthSource func(ctx context.Context) (AgentHealth, error)

// DefaultHealthEvery is how often reft run asks while a step runs: a
// straggler slows every step and a degraded node stays degraded, so
// minutes matter, not seconds.
const DefaultHealthEvery = 30 * time.Second

// healthWatch asks a HealthSource in the background, at most one ask in
// flight, and hands each result to the attempt's loop, which alone calls
// its methods and reads its maps.
type healthWatch struct {
	src   HealthSource
	every time.Duration
	last  time.Time
	busy  bool
	out   chan healthResult
	// reported: the ranks already in the recovery log for this attempt.
	reported map[int]bool
	// seen is each node's reasons in the previous ask; said is what the
	// recovery log last said of each node still degraded.
	seen, said map[string]string
}

type healthResult struct {
	h   AgentHealth
	err error
}

func newHealthWatch(src HealthSource, every time.Duration) *healthWatch {
	if every <= 0 {
		every = DefaultHealthEvery
	}
	return &healthWatch{src: src, every: every, out: make(chan healthResult, 1), reported: map[int]bool{},
		seen: map[string]string{}, said: map[string]string{}}
}

// tick starts an ask when one is due and none is in flight. A nil watch
// (no source) does nothing.
func (w *healthWatch) tick(ctx context.Context, now time.Time) {
	if w == nil || w.busy || now.Sub(w.last) < w.every {
		return
	}
	w.busy, w.last = true, now
	go func() {
		h, err := w.src(ctx)
		w.out <- healthResult{h, err}
	}()
}

// results is the channel the attempt's loop selects on; nil (never
// ready) without a source.
func (w *healthWatch) results() <-chan healthResult {
	if w == nil {
		return nil
	}
	return w.out
}

// degradedChanges compares an ask's degraded nodes with the previous
// ask's and with what was said, and returns what to say now: a node's
// warnings once they are the same in two asks in a row (a new agent's
// peering takes a moment to come up, and one ask must not cry wolf), and
// a node said degraded that has no warnings any more. Nodes in order.
func (w *healthWatch) degradedChanges(deg map[string][]string) (degraded map[string]string, restored []string) {
	now := map[string]string{}
	for n, ws := range deg {
		if len(ws) > 0 {
			now[n] = strings.Join(ws, ", ")
		}
	}
	degraded = map[string]string{}
	for n, ws := range now {
		if w.seen[n] == ws && w.said[n] != ws {
			degraded[n], w.said[n] = ws, ws
		}
	}
	for n := range w.said {
		if _, ok := now[n]; !ok {
			restored = append(restored, n)
			delete(w.said, n)
		}
	}
	slices.Sort(restored)
	w.seen = now
	return degraded, restored
}

// recordHealth writes a straggler event for each rank not yet reported in
// this attempt, and a degraded or restored event for each node whose state
// changed (degradedChanges); an ask that failed is said once (reft run's
// other work does not depend on it).
func (r *Runner) recordHealth(ctx context.Context, a *attempt, w *healthWatch, res healthResult) {
	w.busy = false
	if res.err != nil {
		r.warnOnce("health", "cannot ask the agents for stragglers and degraded nodes (%v); the recovery log will not show them", res.err)
		return
	}
	for _, s := range res.h.Stragglers {
		if w.reported[s.Rank] {
			continue
		}
		w.reported[s.Rank] = true
		e := r.event(recoverylog.Straggler, a.relaunch)
		e.Step, e.Node, e.Ranks, e.DurationS, e.Cause = a.stepID, s.Node, []int{s.Rank}, s.ComputeS, s.String()
		r.emit(ctx, e)
	}
	degraded, restored := w.degradedChanges(res.h.Degraded)
	nodes := make([]string, 0, len(degraded))
	for n := range degraded {
		nodes = append(nodes, n)
	}
	slices.Sort(nodes)
	for _, n := range nodes {
		e := r.event(recoverylog.Degraded, a.relaunch)
		e.Level, e.Step, e.Node = "warn", a.stepID, n
		e.Cause = "protection below the SPEC (" + degraded[n] + "); `reft status` says why"
		r.emit(ctx, e)
	}
	for _, n := range restored {
		e := r.event(recoverylog.DegradedCleared, a.relaunch)
		e.Step, e.Node = a.stepID, n
		r.emit(ctx, e)
	}
}

// AgentHealthSource asks the job's agents over their peer ports, as `reft
// status` does (same configuration, the job's user).
func AgentHealthSource(cfg config.Config, job string) (HealthSource, error) {
	host, _ := os.Hostname()
	pc, err := peerconfig.FromAgentConfig(cfg, peer.Config{Job: job, UID: os.Getuid(), Node: "reft-run@" + host, Role: peer.RoleStatus, Log: zerolog.Nop()})
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) (AgentHealth, error) {
		rep, err := status.Query(ctx, status.Options{Peer: pc, Jobs: status.Slurm{Conf: cfg.Agent.SlurmConf}, Timeout: 10 * time.Second})
		if err != nil {
			return AgentHealth{}, err
		}
		return healthOf(rep), nil
	}, nil
}

// healthOf is a status report's AgentHealth: its stragglers, and the
// nodes in the allocation whose agent answered with a degraded protection
// (a node the allocation lost, or whose agent is down, is reft run's
// failure to handle, not a degraded node).
func healthOf(rep *status.Report) AgentHealth {
	h := AgentHealth{Stragglers: rep.Stragglers}
	for _, n := range rep.Nodes {
		if !n.InAllocation || n.Status == nil {
			continue
		}
		if why := metrics.Degraded(n.Status); len(why) > 0 {
			if h.Degraded == nil {
				h.Degraded = map[string][]string{}
			}
			h.Degraded[n.Node] = why
		}
	}
	return h
}
