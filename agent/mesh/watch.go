package mesh

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/event"
	"github.com/reft-hpc/reft/agent/peer"
)

// peerState is one other node's agent: what its peerWatch last found.
// The peerWatch writes it (update); Resolve and Peers read it (await,
// status) from any goroutine, under mu. changed is closed at each update,
// so a reader waits for the next one without polling. kick (buffered, 1)
// asks the watch for a search now; a full kick is dropped, since one
// pending search serves every asker.
type peerState struct {
	node  Node
	cands []int
	kick  chan struct{} // an immediate search, asked by Resolve

	mu        sync.Mutex
	addr      string // its listener, once found
	connected bool
	met       bool          // connected at least once since this agent started
	err       error         // why it is not connected
	changed   chan struct{} // closed and replaced at every update

	foreign map[int]time.Time // only the watch goroutine touches it
}

// update records the outcome of a search or check and wakes awaiters.
func (p *peerState) update(addr string, connected bool, err error) {
	p.mu.Lock()
	p.addr, p.connected, p.err = addr, connected, err
	p.met = p.met || connected
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

// status is a snapshot of p for Peers.
func (p *peerState) status() PeerStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := PeerStatus{Node: p.node, Addr: p.addr, Connected: p.connected, Met: p.met}
	if !p.connected {
		s.Err = p.err
	}
	return s
}

// await asks for a search now and waits until the peer is connected
// (its address), or ctx ends; with refusedEnds, also until a search made
// since the call began found every candidate refused (Mesh.resolve).
func (p *peerState) await(ctx context.Context, refusedEnds bool) (string, error) {
	node := p.node.Name
	select { // search now rather than after the current pause
	case p.kick <- struct{}{}:
	default:
	}
	fresh := false // p.err comes from a search made since the call began
	for {
		p.mu.Lock()
		addr, ok, err, ch := p.addr, p.connected, p.err, p.changed
		p.mu.Unlock()
		if ok {
			return addr, nil
		}
		if refusedEnds && fresh && errors.Is(err, syscall.ECONNREFUSED) {
			return "", fmt.Errorf("mesh: the agent of node %s is not reachable: %w", node, err)
		}
		select {
		case <-ch:
			fresh = true
		case <-ctx.Done():
			return "", fmt.Errorf("mesh: the agent of node %s is not reachable: %w (%v)", node, err, context.Cause(ctx))
		}
	}
}

// peerWatch is the goroutine that finds and watches one peer's agent
// (run): the only writer of its peerState and the only user of its
// foreign map. It shares the Mesh's client (safe for concurrent use) and
// its Config's timers and hooks, and knows no other peer. Its own fields
// (the retry backoff, and what it last said of an unreachable peer, said
// again when the cause changes and as a warning once the start's grace is
// over) are touched by run's goroutine alone. The hooks PeerFound and
// PeerLost run on that goroutine, before the peerState changes, so a
// caller of Resolve or Peers that sees the change sees the hook's effect.
type peerWatch struct {
	cl    *peer.Client
	cfg   Config
	start time.Time // the Mesh's start, for cfg.Grace
	p     *peerState
	log   zerolog.Logger

	backoff   time.Duration
	lastCause string
	warned    bool
}

// run finds the peer's agent, then checks its connection, and looks again
// when it is lost (its agent may come back on another candidate). It
// returns when ctx is done.
func (w *peerWatch) run(ctx context.Context) {
	p := w.p
	for {
		p.mu.Lock()
		addr := p.addr
		p.mu.Unlock()
		var ok bool
		if addr == "" {
			ok = w.search(ctx)
		} else {
			ok = w.check(ctx, addr)
		}
		if !ok {
			return
		}
	}
}

// search looks for the peer's agent once, and pauses: backing off after
// a failed search, the watch interval after a found one. false: ctx is
// done.
func (w *peerWatch) search(ctx context.Context) bool {
	p := w.p
	addr, k, skipped, err := w.find(ctx)
	if ctx.Err() != nil {
		return false
	}
	if err != nil {
		w.unreachable(err)
		p.update("", false, err) // after the log, so a reader of Peers finds it logged
		kicked, ok := w.pause(ctx, w.backoff)
		if kicked {
			w.backoff = minRetry
		} else {
			w.backoff = min(2*w.backoff, w.cfg.MaxRetry)
		}
		return ok
	}
	w.backoff, w.lastCause, w.warned = minRetry, "", false
	w.found(addr, k, skipped)
	_, ok := w.pause(ctx, w.cfg.Watch)
	return ok
}

// unreachable logs a failed search when its cause is new, or when the
// start's grace ran out since (then as a warning, once).
func (w *peerWatch) unreachable(err error) {
	late := time.Since(w.start) > w.cfg.Grace
	cause := causeKey(err)
	if cause == w.lastCause && (!late || w.warned) {
		return
	}
	lvl := zerolog.InfoLevel
	if late {
		lvl, w.warned = zerolog.WarnLevel, true
	}
	w.log.WithLevel(lvl).Str("event", "peer_unreachable").Str("peer_host", w.p.node.Addr).Err(err).
		Msgf("agent of node %s not reached yet; retrying", w.p.node.Name)
	w.lastCause = cause
}

// found logs the agent found at addr (candidate k; skipped: the earlier
// candidates that answered as something else), tells PeerFound, and
// records it.
func (w *peerWatch) found(addr string, k int, skipped []Try) {
	p := w.p
	if len(skipped) > 0 {
		// Something else answered on an earlier candidate: another
		// job's agent (a port collision), or a program squatting
		// the port. The search went on; an operator should know.
		w.log.Warn().Str("event", "peer_candidates_skipped").Str("peer_host", p.node.Addr).Int("candidate", k).
			Str("error", skippedText(skipped)).
			Msgf("found the agent of node %s on candidate %d after earlier candidates answered as something else", p.node.Name, k)
	}
	w.log.Info().Str("event", event.PeerConnected).Str("addr", addr).Int("peer_index", p.node.Index).Int("candidate", k).
		Msgf("peer connected: node %s at %s", p.node.Name, addr)
	if w.cfg.PeerFound != nil { // before the update, as the log
		w.cfg.PeerFound(p.node.Name)
	}
	p.update(addr, true, nil)
}

// check checks the connection to the agent at addr, and pauses the
// watch interval while it holds; a lost or changed agent is logged, told
// to PeerLost and forgotten, to be searched for at once. false: ctx is
// done.
func (w *peerWatch) check(ctx context.Context, addr string) bool {
	p := w.p
	node, err := w.cl.Connect(ctx, addr)
	if ctx.Err() != nil {
		return false
	}
	if err == nil && node != p.node.Name {
		w.cl.Drop(addr)
		err = fmt.Errorf("the agent at %s is now node %s's", addr, node)
	}
	if err != nil {
		w.log.Warn().Str("event", "peer_lost").Str("addr", addr).Err(err).
			Msgf("lost the agent of node %s; looking for it again", p.node.Name)
		if w.cfg.PeerLost != nil {
			w.cfg.PeerLost(p.node.Name, err)
		}
		p.update("", false, err)
		return true
	}
	_, ok := w.pause(ctx, w.cfg.Watch)
	return ok
}

// pause waits d, or less if Resolve asks for a search now.
func (w *peerWatch) pause(ctx context.Context, d time.Duration) (kicked, ok bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false, false
	case <-w.p.kick:
		return true, true
	case <-t.C:
		return false, true
	}
}

// find tries the peer's candidates in order: a refused connection or a
// refusal by another job's agent moves on to the next; the first agent of
// this job that authenticates as node p wins. On success, skipped are the
// earlier candidates where something other than nothing answered.
func (w *peerWatch) find(ctx context.Context) (addr string, k int, skipped []Try, err error) {
	p := w.p
	ue := &UnreachableError{Node: p.node.Name, Host: p.node.Addr, Job: w.cfg.Peer.Job}
	now := time.Now()
	for k, port := range p.cands {
		if until, ok := p.foreign[port]; ok {
			if now.Before(until) {
				ue.Tries = append(ue.Tries, Try{Port: port, Kind: TryForeign, Err: errors.New("skipped: another job's agent answered here lately")})
				continue
			}
			delete(p.foreign, port)
		}
		addr := net.JoinHostPort(p.node.Addr, strconv.Itoa(port))
		node, err := w.cl.Connect(ctx, addr)
		if err == nil && node == p.node.Name {
			for _, t := range ue.Tries {
				if t.Kind != TryRefused {
					skipped = append(skipped, t)
				}
			}
			return addr, k, skipped, nil
		}
		if ctx.Err() != nil {
			return "", 0, nil, ctx.Err()
		}
		kind := TryOther
		switch {
		case err == nil: // only when 8n > span puts nodes of a host on shared candidates
			w.cl.Drop(addr)
			kind, err = TryOtherNode, fmt.Errorf("the agent of node %s of this job listens here", node)
		case errors.Is(err, syscall.ECONNREFUSED):
			kind = TryRefused
		case peer.IsCode(err, peer.CodeForbidden):
			kind = TryForeign
			p.foreign[port] = now.Add(foreignSkip)
		}
		ue.Tries = append(ue.Tries, Try{Port: port, Kind: kind, Err: err})
	}
	return "", 0, nil, ue
}
