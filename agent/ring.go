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
	"github.com/reft-hpc/reft/agent/mesh"
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

// rings is what this agent knows of its sharding groups' rings and of
// where the job's ranks run: the group formation and the rank-to-node map
// (the Server's s.rings). Its methods are safe for concurrent use. mu
// guards groups, hosted, hostedGroup and the groupState fields marked so;
// a group's decide mutex serializes that group's ring decision and is
// taken before mu, never under it. The hooks are called without mu held
// and must not block on the rings: mesh and peering from a decision or a
// search, noted whenever a member's node is learnt.
type rings struct {
	node string          // this agent's node
	topo config.Topology // the site's failure domains (AttachTopology)
	// wait bounds the wait for a group's members to register (0:
	// ringWaitDefault).
	wait time.Duration
	// mesh is the job's agent mesh (nil, or returning nil: not up yet);
	// peering says why not (nil: no peering section).
	mesh    func() *mesh.Mesh
	peering func() *proto.Peering
	// noted hears every member's node as it is learnt (the replicator's
	// rank map).
	noted func(rank int, node string)

	mu sync.Mutex
	// groups this agent saves or restores for; hosted: the ranks
	// registered here since it started (rank -> registrations), and their
	// groups (a rank that finished, or whose process is between a crash
	// and its restart, still ran here).
	groups      map[string]*groupState
	hosted      map[int]int
	hostedGroup map[int]string
}

// waitFor is the bound on the wait for a group's members.
func (rg *rings) waitFor() time.Duration {
	if rg.wait <= 0 {
		return ringWaitDefault
	}
	return rg.wait
}

// groupState is what this agent knows of one sharding group.
type groupState struct {
	name   string
	decide sync.Mutex // one ring decision at a time (several local ranks)
	// Under rings.mu:
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
// [topology]); without, every node is a domain of its own. Call it before
// Serve.
func (s *Server) AttachTopology(t config.Topology) { s.rings.topo = t }

// forget drops node n from g's hosts and holders: it did not answer (the
// next search finds its members again). The caller holds rings.mu.
func (g *groupState) forget(n string) {
	delete(g.holders, n)
	for r, hn := range g.hosts {
		if hn == n {
			delete(g.hosts, r)
		}
	}
}

// movedFrom says whether a member g had on node n is no longer hosted
// there (a relaunch moved it). The caller holds rings.mu.
func (g *groupState) movedFrom(n string, hosted map[int]bool) bool {
	for r, hn := range g.hosts {
		if hn == n && !hosted[r] {
			return true
		}
	}
	return false
}

// group returns the state of si's sharding group.
func (rg *rings) group(si *shard.Geometry) *groupState {
	name := si.GroupName()
	rg.mu.Lock()
	defer rg.mu.Unlock()
	if rg.groups == nil {
		rg.groups = map[string]*groupState{}
	}
	g := rg.groups[name]
	if g == nil {
		g = &groupState{name: name, hosts: map[int]string{}, holders: map[string]bool{}, warned: map[string]bool{}}
		rg.groups[name] = g
	}
	return g
}

// fixedRing is g's ring, nil while undecided.
func (rg *rings) fixedRing(g *groupState) []int {
	rg.mu.Lock()
	defer rg.mu.Unlock()
	return slices.Clone(g.ring)
}

// host records that rank (of si's group, nil: unsharded) registered here.
func (rg *rings) host(rank int, si *shard.Geometry) {
	rg.mu.Lock()
	defer rg.mu.Unlock()
	if rg.hosted == nil {
		rg.hosted = map[int]int{}
		rg.hostedGroup = map[int]string{}
	}
	rg.hosted[rank]++
	if si != nil {
		rg.hostedGroup[rank] = si.GroupName()
	}
}

// Hosted lists the ranks among ranks (nil: all) registered with this
// agent since it started (a rank that closed its connection still counts:
// it finished, or restarts here), each with its group's fixed ring: the
// peer.HostedSource of the agent's mesh.
func (rg *rings) Hosted(ranks []int) []peer.HostedRank {
	rg.mu.Lock()
	defer rg.mu.Unlock()
	out := []peer.HostedRank{}
	for r := range rg.hosted {
		if ranks != nil && !slices.Contains(ranks, r) {
			continue
		}
		h := peer.HostedRank{Rank: r}
		if g := rg.groups[rg.hostedGroup[r]]; g != nil {
			h.Ring = slices.Clone(g.ring)
		}
		out = append(out, h)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Rank < out[j].Rank })
	return out
}

// placementWarnings are the group warnings this agent gave, for status.
func (rg *rings) placementWarnings() []string {
	rg.mu.Lock()
	defer rg.mu.Unlock()
	var out []string
	for _, g := range rg.groups {
		out = append(out, g.warnings...)
	}
	sort.Strings(out)
	return out
}

// ensureRing fixes the ring of rc's group before its first sharded save
// and lays the save out again when the ring differs from the one the
// registration was laid out with.
func (s *snapshots) ensureRing(rc *rankConn, log zerolog.Logger) error {
	if rc.sg == nil || rc.ringFixed {
		return nil
	}
	ring := s.rings.groupRing(rc.sg, log)
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
func (rg *rings) groupRing(si *shard.Geometry, log zerolog.Logger) []int {
	g := rg.group(si)
	g.decide.Lock()
	defer g.decide.Unlock()
	if r := rg.fixedRing(g); r != nil {
		// A member registered here after the ring was fixed (or adopted
		// before it registered) may share this node with another.
		rg.warnShared(g, localShared(rg.node, si, rg.hostsHere(si)), log)
		return r
	}
	ring, how, fallback, warns := rg.decideRing(si, g)
	rg.fixRing(si, g, ring, how, log)
	if fallback {
		log.Warn().Str("event", "sg_ring_fallback").Str("group", g.name).Ints("ring", ring).Str("reason", how).
			Msgf("SG %s keeps dp order on its ring: %s", g.name, how)
	}
	rg.warnShared(g, warns, log)
	return ring
}

// fixRing fixes g's ring (a restore's replaces a decided one) and logs it.
func (rg *rings) fixRing(si *shard.Geometry, g *groupState, ring []int, how string, log zerolog.Logger) {
	rg.mu.Lock()
	old := g.ring
	g.ring = slices.Clone(ring)
	nodes := make([]string, len(ring))
	for i, r := range ring {
		nodes[i] = g.hosts[r]
	}
	rg.mu.Unlock()
	if slices.Equal(old, ring) {
		return
	}
	dom, _ := rg.topo.DomainsOf(nodes)
	doms := make([]string, len(nodes))
	for i, n := range nodes {
		doms[i] = dom[n]
	}
	log.Info().Str("event", "sg_ring").Str("group", g.name).Ints("ring", ring).Strs("nodes", nodes).Strs("domains", doms).
		Bool("dp_order", slices.Equal(ring, si.DPOrder())).Str("how", how).Msgf("SG %s ring %v (%s)", g.name, ring, how)
}

// adoptRing fixes the ring a restored generation was saved with.
func (rg *rings) adoptRing(si *shard.Geometry, step int64, log zerolog.Logger) {
	g := rg.group(si)
	g.decide.Lock()
	defer g.decide.Unlock()
	rg.fixRing(si, g, si.Members, fmt.Sprintf("the ring step %d was saved with, restored", step), log)
}

// decideRing searches the group's members until every one is found
// registered (or a member's agent has a fixed ring), at most ringWait.
func (rg *rings) decideRing(si *shard.Geometry, g *groupState) (ring []int, how string, fallback bool, warns []sg.Warning) {
	wait := rg.waitFor()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for {
		adopted, from, hosts, why := rg.searchGroup(ctx, si, g)
		if adopted != nil {
			if _, err := si.WithRing(adopted); err == nil {
				return adopted, "adopted from node " + from + "'s agent, which fixed it first", false, localShared(rg.node, si, hosts)
			}
		}
		if len(hosts) == si.M {
			return formRing(rg.topo, rg.node, si, hosts)
		}
		if ctx.Err() != nil || why != "" && strings.HasPrefix(why, "peering is off") {
			return si.DPOrder(), missingReason(si, hosts, wait, why), true, localShared(rg.node, si, hosts)
		}
		select {
		case <-ctx.Done():
		case <-time.After(ringPoll):
		}
	}
}

// formRing computes the ring of si's group from where every member runs
// (hosts) and the site's failure domains; fallback (dp order) when the
// domains or the placement do not work.
func formRing(topo config.Topology, node string, si *shard.Geometry, hosts map[int]string) (ring []int, how string, fallback bool, warns []sg.Warning) {
	nodes := make([]string, si.M)
	for dp, r := range si.DPOrder() {
		nodes[dp] = hosts[r]
	}
	dom, err := topo.DomainsOf(nodes)
	if err != nil {
		return si.DPOrder(), fmt.Sprintf("the failure domains in reft.toml do not work: %v", err), true, localShared(node, si, hosts)
	}
	c := si.Layout.Coord(si.Rank)
	grp, w, err := sg.FormGroup(si.Layout, c.PP, c.TP, nodes, dom)
	if err != nil {
		return si.DPOrder(), err.Error(), true, localShared(node, si, hosts)
	}
	how = "spread across nodes"
	if len(dom) > 0 {
		how = "spread across failure domains and nodes"
	}
	return grp.Ranks(), how, false, w
}

// missingReason says which members no agent reported after wait, and
// why some agents did not answer.
func missingReason(si *shard.Geometry, hosts map[int]string, wait time.Duration, why string) string {
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
	return reason
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
func (rg *rings) searchGroup(ctx context.Context, si *shard.Geometry, g *groupState) (adopted []int, from string, hosts map[int]string, why string) {
	members := si.DPOrder()
	for _, h := range rg.Hosted(members) {
		rg.noteHost(g, h.Rank, rg.node)
	}
	var whys []string
	if m := rg.mesh; m == nil || m() == nil {
		if st := rg.peering(); st == nil || st.State == proto.PeeringOff {
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
				rg.noteHost(g, h.Rank, node)
				mu.Lock()
				if h.Ring != nil && adopted == nil {
					adopted, from = h.Ring, node
				}
				mu.Unlock()
			}
			if len(rep.Generations) > 0 {
				rg.mu.Lock()
				g.holders[node] = true
				rg.mu.Unlock()
			}
		})
	}
	rg.mu.Lock()
	hosts = map[int]string{}
	for _, r := range members {
		if n := g.hosts[r]; n != "" {
			hosts[r] = n
		}
	}
	g.searched = len(hosts) == len(members)
	rg.mu.Unlock()
	sort.Strings(whys)
	return adopted, from, hosts, strings.Join(whys, "; ")
}

// hostsHere maps the members of si's group registered with this agent to
// this node.
func (rg *rings) hostsHere(si *shard.Geometry) map[int]string {
	rg.mu.Lock()
	defer rg.mu.Unlock()
	out := map[int]string{}
	for _, r := range si.DPOrder() {
		if rg.hosted[r] > 0 {
			out[r] = rg.node
		}
	}
	return out
}

func (rg *rings) noteHost(g *groupState, rank int, node string) {
	rg.mu.Lock()
	g.hosts[rank] = node
	rg.mu.Unlock()
	if rg.noted != nil {
		rg.noted(rank, node) // the job's rank map, for placement
	}
}

// localShared warns about the group's members registered on this node,
// for when the full map is not known.
func localShared(node string, si *shard.Geometry, hosts map[int]string) []sg.Warning {
	var here []int
	for _, r := range si.DPOrder() {
		if hosts[r] == node {
			here = append(here, r)
		}
	}
	if len(here) < 2 {
		return nil
	}
	name := si.GroupName()
	return []sg.Warning{{Kind: sg.WarnSharedNode, Group: name, Node: node, Ranks: here,
		Msg: fmt.Sprintf("SG %s: ranks %s share node %s, so losing %s loses %d of the group's %d members at once; place a sharding group's DP ranks on different nodes",
			name, joinAnd(intStrings(here)), node, node, len(here), si.M)}}
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
func (rg *rings) warnShared(g *groupState, warns []sg.Warning, log zerolog.Logger) {
	for _, w := range warns {
		if w.Kind != sg.WarnSharedNode || w.Node != rg.node {
			continue
		}
		rg.mu.Lock()
		done := g.warned[w.Node]
		g.warned[w.Node] = true
		if !done {
			g.warnings = append(g.warnings, w.Msg)
		}
		rg.mu.Unlock()
		if !done {
			log.Warn().Str("event", "sg_shared_node").Str("group", g.name).Str("shared_node", w.Node).Ints("ranks", w.Ranks).Msg(w.Msg)
		}
	}
}

// viewNodes are the nodes a watermarks view of g asks (besides this
// one): those hosting its members and those that held its generations
// when the job was last searched; ok is false until a search found every
// member.
func (rg *rings) viewNodes(g *groupState) (nodes []string, ok bool) {
	rg.mu.Lock()
	defer rg.mu.Unlock()
	set := map[string]bool{}
	for _, n := range g.hosts {
		set[n] = true
	}
	for n := range g.holders {
		set[n] = true
	}
	delete(set, rg.node)
	for n := range set {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	return nodes, g.searched
}
