package agent

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/agent/peer"
	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/agent/sg"
	"github.com/reft-hpc/reft/agent/shard"
)

// Ring placement (issue #6). A sharding group's ring decides which
// member keeps whose ARC copy, parity inputs and AOR replica: ring
// neighbours should sit on different nodes and failure domains, which dp
// order does not give when, say, DP ranks fill a rack before the next.
//
// The agent learns where its group's members run from the agents
// themselves: every watermarks reply lists which of the asked ranks are
// registered with the answering agent (peer.HostedRank). At a group's
// first sharded save on this node, the agent asks the job's nodes for the
// group's members (until it has found them all; later questions, the
// watermarks views of restores, go only to the nodes that host them), waits for every member to be registered somewhere (bounded by
// ringWait), and computes the ring with sg.FormGroup over the site's
// failure domains ([topology] in reft.toml). The ring is then fixed for
// the group on this agent and announced in its watermarks replies; an
// agent that finds a member's agent with a fixed ring adopts it instead
// of computing its own, so a later agent (a spare) joins the ring the
// job uses. Every agent computes the same ring from the same map, so
// agents deciding at the same moment agree too. Without the full map in
// time, the agent keeps dp order and says so (sg_ring_fallback).
//
// A generation records its ring (manifest, watermarks), and a restore
// reads every generation with the ring it was saved with; after a
// restore the agent fixes the group's ring to the restored one, so the
// job keeps it however the ranks moved.

// ringWaitDefault bounds the wait for a group's members to register.
const ringWaitDefault = 10 * time.Second

// ringPoll is the pause between two searches for unregistered members.
const ringPoll = 100 * time.Millisecond

// groupState is what this agent knows of one sharding group.
type groupState struct {
	name   string
	decide sync.Mutex // one ring decision at a time (several local ranks)
	// Under Server.groupsMu:
	ring  []int          // fixed ring; nil: not decided yet
	hosts map[int]string // member rank -> node it is registered on, as last learnt
	// holders are the other nodes that held the group's generations when
	// this agent last searched the job; with hosts' nodes, the nodes a
	// watermarks view asks.
	holders map[string]bool
	// searched: hosts covers every member (a later view can ask only the
	// group's nodes); cleared when a host stops answering for a member.
	searched bool
	warned   map[string]bool // sg_shared_node warnings given, by node
	warnings []string        // for the status reply
}

// AttachTopology gives the server the site's failure domains (reft.toml
// [topology]); without, every node is a domain of its own.
func (s *Server) AttachTopology(t config.Topology) { s.topo = t }

// group returns the state of si's sharding group.
func (s *Server) group(si *shard.Geometry) *groupState {
	name := si.GroupName()
	s.groupsMu.Lock()
	defer s.groupsMu.Unlock()
	if s.groups == nil {
		s.groups = map[string]*groupState{}
	}
	g := s.groups[name]
	if g == nil {
		g = &groupState{name: name, hosts: map[int]string{}, holders: map[string]bool{}, warned: map[string]bool{}}
		s.groups[name] = g
	}
	return g
}

// fixedRing is g's ring, nil while undecided.
func (s *Server) fixedRing(g *groupState) []int {
	s.groupsMu.Lock()
	defer s.groupsMu.Unlock()
	return slices.Clone(g.ring)
}

// host records that rank (of si's group, nil: unsharded) registered here.
func (s *Server) host(rank int, si *shard.Geometry) {
	s.groupsMu.Lock()
	defer s.groupsMu.Unlock()
	if s.hosted == nil {
		s.hosted = map[int]int{}
		s.hostedGroup = map[int]string{}
	}
	s.hosted[rank]++
	if si != nil {
		s.hostedGroup[rank] = si.GroupName()
	}
}

// Hosted lists the ranks among ranks (nil: all) registered with this
// agent since it started (a rank that closed its connection still counts:
// it finished, or restarts here), each with its group's fixed ring: the
// peer.HostedSource of the agent's mesh.
func (s *Server) Hosted(ranks []int) []peer.HostedRank {
	s.groupsMu.Lock()
	defer s.groupsMu.Unlock()
	out := []peer.HostedRank{}
	for r := range s.hosted {
		if ranks != nil && !slices.Contains(ranks, r) {
			continue
		}
		h := peer.HostedRank{Rank: r}
		if g := s.groups[s.hostedGroup[r]]; g != nil {
			h.Ring = slices.Clone(g.ring)
		}
		out = append(out, h)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Rank < out[j].Rank })
	return out
}

// placementWarnings are the group warnings this agent gave, for status.
func (s *Server) placementWarnings() []string {
	s.groupsMu.Lock()
	defer s.groupsMu.Unlock()
	var out []string
	for _, g := range s.groups {
		out = append(out, g.warnings...)
	}
	sort.Strings(out)
	return out
}

// ensureRing fixes the ring of rc's group before its first sharded save
// and lays the save out again when the ring differs from the one the
// registration was laid out with.
func (s *Server) ensureRing(rc *rankConn, log zerolog.Logger) error {
	if rc.sg == nil || rc.ringFixed {
		return nil
	}
	ring := s.groupRing(rc.sg, log)
	if slices.Equal(ring, rc.spec.Ring) {
		rc.ringFixed = true
		return nil
	}
	si, err := rc.sg.WithRing(ring)
	if err != nil {
		return err
	}
	if err := s.applyLayout(rc, rc.req, si); err != nil {
		return fmt.Errorf("laying the save out on ring %v: %w", ring, err)
	}
	rc.ringFixed = true
	log.Info().Str("event", "arena_layout").Int("rank", rc.key.Rank).Str("arena_layout", si.Describe()).Msg("save laid out on the group's ring")
	return nil
}

// groupRing returns si's group's ring, deciding it first if no one has.
func (s *Server) groupRing(si *shard.Geometry, log zerolog.Logger) []int {
	g := s.group(si)
	g.decide.Lock()
	defer g.decide.Unlock()
	if r := s.fixedRing(g); r != nil {
		// A member registered here after the ring was fixed (or adopted
		// before it registered) may share this node with another.
		s.warnShared(g, s.localShared(si, s.hostsHere(si)), log)
		return r
	}
	ring, how, fallback, warns := s.decideRing(si, g)
	s.fixRing(si, g, ring, how, log)
	if fallback {
		log.Warn().Str("event", "sg_ring_fallback").Str("group", g.name).Ints("ring", ring).Str("reason", how).
			Msgf("SG %s keeps dp order on its ring: %s", g.name, how)
	}
	s.warnShared(g, warns, log)
	return ring
}

// fixRing fixes g's ring (a restore's replaces a decided one) and logs it.
func (s *Server) fixRing(si *shard.Geometry, g *groupState, ring []int, how string, log zerolog.Logger) {
	s.groupsMu.Lock()
	old := g.ring
	g.ring = slices.Clone(ring)
	nodes := make([]string, len(ring))
	for i, r := range ring {
		nodes[i] = g.hosts[r]
	}
	s.groupsMu.Unlock()
	if slices.Equal(old, ring) {
		return
	}
	dom, _ := s.topo.DomainsOf(nodes)
	doms := make([]string, len(nodes))
	for i, n := range nodes {
		doms[i] = dom[n]
	}
	log.Info().Str("event", "sg_ring").Str("group", g.name).Ints("ring", ring).Strs("nodes", nodes).Strs("domains", doms).
		Bool("dp_order", slices.Equal(ring, si.DPOrder())).Str("how", how).Msgf("SG %s ring %v (%s)", g.name, ring, how)
}

// adoptRing fixes the ring a restored generation was saved with.
func (s *Server) adoptRing(si *shard.Geometry, step int64, log zerolog.Logger) {
	g := s.group(si)
	g.decide.Lock()
	defer g.decide.Unlock()
	s.fixRing(si, g, si.Members, fmt.Sprintf("the ring step %d was saved with, restored", step), log)
}

// decideRing searches the group's members until every one is found
// registered (or a member's agent has a fixed ring), at most ringWait.
func (s *Server) decideRing(si *shard.Geometry, g *groupState) (ring []int, how string, fallback bool, warns []sg.Warning) {
	wait := s.ringWait
	if wait <= 0 {
		wait = ringWaitDefault
	}
	deadline := time.Now().Add(wait)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	for {
		adopted, from, hosts, why := s.searchGroup(ctx, si, g)
		if adopted != nil {
			if _, err := si.WithRing(adopted); err == nil {
				return adopted, "adopted from node " + from + "'s agent, which fixed it first", false, s.localShared(si, hosts)
			}
		}
		if len(hosts) == si.M {
			nodes := make([]string, si.M)
			for dp, r := range si.DPOrder() {
				nodes[dp] = hosts[r]
			}
			dom, err := s.topo.DomainsOf(nodes)
			if err != nil {
				return si.DPOrder(), fmt.Sprintf("the failure domains in reft.toml do not work: %v", err), true, s.localShared(si, hosts)
			}
			c := si.Layout.Coord(si.Rank)
			grp, w, err := sg.FormGroup(si.Layout, c.PP, c.TP, nodes, dom)
			if err != nil {
				return si.DPOrder(), err.Error(), true, s.localShared(si, hosts)
			}
			how := "spread across nodes"
			if len(dom) > 0 {
				how = "spread across failure domains and nodes"
			}
			return grp.Ranks(), how, false, w
		}
		if ctx.Err() != nil || why != "" && strings.HasPrefix(why, "peering is off") {
			var missing []int
			for _, r := range si.DPOrder() {
				if hosts[r] == "" {
					missing = append(missing, r)
				}
			}
			reason := fmt.Sprintf("after %s, ranks %s are not registered with any agent that answered", wait, strings.Join(intStrings(missing), ","))
			if why != "" {
				reason += " (" + why + ")"
			}
			return si.DPOrder(), reason, true, s.localShared(si, hosts)
		}
		select {
		case <-ctx.Done():
		case <-time.After(ringPoll):
		}
	}
}

// searchGroup asks this agent and every other agent of the job which of
// the group's members run where (O(job) requests, each of the members'
// ranks only: no agent knows the rank-to-node map before asking, see
// docs/ARCHITECTURE.md "Sharding-group rings"), recording the answers in
// g; once every member is found, views ask only the group's nodes. Each
// call asks every node again: one without a member yet may get one (a
// late registration), one with a member may have fixed a ring to adopt.
// It returns a ring a member's agent fixed (and its node), the hosts
// found so far, and why some agents did not answer.
func (s *Server) searchGroup(ctx context.Context, si *shard.Geometry, g *groupState) (adopted []int, from string, hosts map[int]string, why string) {
	members := si.DPOrder()
	for _, h := range s.Hosted(members) {
		s.noteHost(g, h.Rank, s.info.Node)
	}
	var whys []string
	if m := s.mesh; m == nil || m() == nil {
		if st := s.peeringStatus(); st == nil || st.State == proto.PeeringOff {
			whys = append(whys, "peering is off: only this node's ranks are known")
		} else {
			whys = append(whys, "peering is still starting")
		}
	} else {
		var mu sync.Mutex
		whys = askOthers(ctx, m(), members, func(node string, rep *peer.WatermarksReply) {
			for _, h := range rep.Hosted {
				if !slices.Contains(members, h.Rank) {
					continue
				}
				s.noteHost(g, h.Rank, node)
				mu.Lock()
				if h.Ring != nil && adopted == nil {
					adopted, from = h.Ring, node
				}
				mu.Unlock()
			}
			if len(rep.Generations) > 0 {
				s.groupsMu.Lock()
				g.holders[node] = true
				s.groupsMu.Unlock()
			}
		})
	}
	s.groupsMu.Lock()
	hosts = map[int]string{}
	for _, r := range members {
		if n := g.hosts[r]; n != "" {
			hosts[r] = n
		}
	}
	g.searched = len(hosts) == len(members)
	s.groupsMu.Unlock()
	sort.Strings(whys)
	return adopted, from, hosts, strings.Join(whys, "; ")
}

// hostsHere maps the members of si's group registered with this agent to
// this node.
func (s *Server) hostsHere(si *shard.Geometry) map[int]string {
	s.groupsMu.Lock()
	defer s.groupsMu.Unlock()
	out := map[int]string{}
	for _, r := range si.DPOrder() {
		if s.hosted[r] > 0 {
			out[r] = s.info.Node
		}
	}
	return out
}

func (s *Server) noteHost(g *groupState, rank int, node string) {
	s.groupsMu.Lock()
	g.hosts[rank] = node
	s.groupsMu.Unlock()
	s.repl.hosts.note(rank, node) // the job's rank map, for placement
}

// localShared warns about the group's members registered on this node,
// for when the full map is not known.
func (s *Server) localShared(si *shard.Geometry, hosts map[int]string) []sg.Warning {
	var here []int
	for _, r := range si.DPOrder() {
		if hosts[r] == s.info.Node {
			here = append(here, r)
		}
	}
	if len(here) < 2 {
		return nil
	}
	name := si.GroupName()
	return []sg.Warning{{Kind: sg.WarnSharedNode, Group: name, Node: s.info.Node, Ranks: here,
		Msg: fmt.Sprintf("SG %s: ranks %s share node %s, so losing %s loses %d of the group's %d members at once; place a sharding group's DP ranks on different nodes",
			name, joinAnd(intStrings(here)), s.info.Node, s.info.Node, len(here), si.M)}}
}

// joinAnd writes 1 and 2, or 1, 2 and 3, as agent/sg's warnings do.
func joinAnd(s []string) string {
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

// warnShared logs each shared-node warning about this node once: the
// agent of the shared node gives it, so the job logs it once.
func (s *Server) warnShared(g *groupState, warns []sg.Warning, log zerolog.Logger) {
	for _, w := range warns {
		if w.Kind != sg.WarnSharedNode || w.Node != s.info.Node {
			continue
		}
		s.groupsMu.Lock()
		done := g.warned[w.Node]
		g.warned[w.Node] = true
		if !done {
			g.warnings = append(g.warnings, w.Msg)
		}
		s.groupsMu.Unlock()
		if !done {
			log.Warn().Str("event", "sg_shared_node").Str("group", g.name).Str("shared_node", w.Node).Ints("ranks", w.Ranks).Msg(w.Msg)
		}
	}
}

// viewNodes are the nodes a watermarks view of g asks (besides this
// one): those hosting its members and those that held its generations
// when the job was last searched; ok is false until a search found every
// member.
func (s *Server) viewNodes(g *groupState) (nodes []string, ok bool) {
	s.groupsMu.Lock()
	defer s.groupsMu.Unlock()
	set := map[string]bool{}
	for _, n := range g.hosts {
		set[n] = true
	}
	for n := range g.holders {
		set[n] = true
	}
	delete(set, s.info.Node)
	for n := range set {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	return nodes, g.searched
}
