package agent

import (
	"fmt"
	"slices"
	"sync"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/event"
	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/agent/shard"
)

// registry is the ranks registered on this node: each rank's last
// registration and the connection it came from (a rank's snapshots have
// one writer: an older connection of the rank is fenced), and its
// protection for the status reply. Its methods are safe for concurrent
// use (the connections' goroutines and the status reply); a rank's
// connection owns its rankConn, this is the copy others may read.
type registry struct {
	log   zerolog.Logger
	mu    sync.Mutex
	ranks map[int]*proto.RankProtection
	owner map[int]*rankConn // the connection each entry came from
}

// registered records a rank's registration for the status reply.
func (g *registry) registered(rc *rankConn, rank, world int, si *shard.Geometry) {
	p := &proto.RankProtection{Connected: true, World: world, Mode: proto.ProtectLocal}
	if si != nil {
		c := si.Layout.Coord(rank)
		p.Layout = fmt.Sprintf("dp=%d pp=%d tp=%d", si.Layout.DP, si.Layout.PP, si.Layout.TP)
		p.Group, p.Position, p.Members = fmt.Sprintf("(pp=%d,tp=%d)", c.PP, c.TP), si.Pos, slices.Clone(si.Members)
		p.ARC, p.AEC, p.AOR = si.ARC && !si.Whole, si.K, si.AOR != nil
		p.Mode = proto.ProtectSharded
		if si.Whole {
			p.Mode = proto.ProtectWhole
		}
	}
	g.mu.Lock()
	if g.ranks == nil {
		g.ranks, g.owner = map[int]*proto.RankProtection{}, map[int]*rankConn{}
	}
	if old := g.owner[rank]; old != nil && old != rc && g.ranks[rank].Connected {
		g.log.Warn().Str("event", event.RankFenced).Int("rank", rank).Int32("pid", rc.pid).Int32("fenced_pid", old.pid).
			Msgf("rank %d registered again by pid %d while pid %d's registration is still connected: pid %d is fenced (its saves, commits, restores and releases are refused)",
				rank, rc.pid, old.pid, old.pid)
	}
	g.ranks[rank], g.owner[rank] = p, rc
	g.mu.Unlock()
}

// fencedBy returns the connection that registered rc's rank after rc did,
// or nil while rc is the rank's registration.
func (g *registry) fencedBy(rc *rankConn) *rankConn {
	g.mu.Lock()
	defer g.mu.Unlock()
	if o := g.owner[rc.key.Rank]; o != nil && o != rc {
		return o
	}
	return nil
}

// gone marks a registered rank's connection closed.
func (g *registry) gone(rc *rankConn) {
	if !rc.registered {
		return
	}
	g.mu.Lock()
	// Only the connection that registered last: a rank's old connection
	// may finish closing after its restarted process registered again.
	if p := g.ranks[rc.key.Rank]; p != nil && g.owner[rc.key.Rank] == rc {
		p.Connected = false
	}
	g.mu.Unlock()
}

// protection is a copy of rank's registration (nil: none), for the
// status reply.
func (g *registry) protection(rank int) *proto.RankProtection {
	g.mu.Lock()
	defer g.mu.Unlock()
	p := g.ranks[rank]
	if p == nil {
		return nil
	}
	c := *p
	c.Members = slices.Clone(p.Members)
	return &c
}

// count is how many ranks registered on this node since the agent
// started, at least 1.
func (g *registry) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return max(len(g.ranks), 1)
}
