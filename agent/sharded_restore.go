package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/mesh"
	"github.com/reft-hpc/reft/agent/peer"
	"github.com/reft-hpc/reft/agent/persist"
	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/agent/sg"
	"github.com/reft-hpc/reft/tmpfs"
)

// How long a restore waits for the job's other agents to answer with
// their watermarks, and how long one answer is reused: every rank of a
// node asks for generations and then restores within moments.
const (
	gatherWait = 3 * time.Second
	viewTTL    = 5 * time.Second
)

// genLoc is one place a rank's committed generation lives.
type genLoc struct {
	node string // "" for this node
	key  peer.GenKey
	ring []int // the SG ring it was saved with; nil: dp order (or unsharded)
}

// storeView is a sharding group's committed generations as the agents
// report them (commit watermarks): metadata only, O(group).
type storeView struct {
	at      time.Time
	gens    map[int]map[int64][]genLoc // rank -> step -> where, this node first
	missing []string                   // agents that did not answer, with why

	// replicas are the placement peers' copies of ranks' unreplicated
	// buffers (replicate.go): rank -> step -> where, this node first.
	replicas map[int]map[int64][]genLoc
	// asked are the other nodes asked, and replyRanks the distinct ranks
	// each reply carried (generations and hosted ranks).
	asked      []string
	replyRanks map[string]int
}

func (v *storeView) add(node string, w peer.Watermark) {
	gens := v.gens
	switch w.Shard {
	case tmpfs.DefaultShard:
	case replicaShard:
		gens = v.replicas
	default:
		return // assembled restores and loaded persisted copies
	}
	if gens[w.Rank] == nil {
		gens[w.Rank] = map[int64][]genLoc{}
	}
	gens[w.Rank][w.Step] = append(gens[w.Rank][w.Step], genLoc{node: node, key: peer.GenKey{Rank: w.Rank, Shard: w.Shard, Step: w.Step, Seq: w.Seq}, ring: w.Ring})
}

// AttachMesh gives the server the job's mesh (nil while it starts or when
// peering is off), for restores that read other agents' stores.
func (s *Server) AttachMesh(f func() *mesh.Mesh) { s.mesh = f }

// view returns the watermarks of si's sharding group, at most viewTTL
// old. It asks only the nodes that host the group's members or held
// their generations (ring.go), for the members' ranks only, so that a
// view is O(group) whatever the job's size; until a search of the job
// has found every member (a fresh agent), it searches first.
func (s *Server) view(ctx context.Context, si *sgInfo) *storeView {
	s.viewMu.Lock()
	defer s.viewMu.Unlock()
	name := si.groupName()
	if v := s.viewCache[name]; v != nil && time.Since(v.at) < viewTTL {
		return v
	}
	members := si.dpOrder()
	v := &storeView{at: time.Now(), gens: map[int]map[int64][]genLoc{}, replicas: map[int]map[int64][]genLoc{}, replyRanks: map[string]int{}}
	for _, w := range (peer.StoreSource{Store: s.store}).Watermarks(members) {
		v.add("", w)
	}
	g := s.group(si)
	m := s.waitMesh(ctx)
	if m == nil {
		v.missing = append(v.missing, "peering is off or not started (status says why): only this node's store is used")
	} else {
		nodes, searched := s.viewNodes(g)
		if !searched {
			s.searchGroup(ctx, si, g)
			nodes, _ = s.viewNodes(g)
		}
		v.asked = nodes
		var mu sync.Mutex
		var wg sync.WaitGroup
		stale := false
		for _, n := range nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cctx, cancel := context.WithTimeout(ctx, gatherWait)
				defer cancel()
				rep, err := m.Watermarks(cctx, n, members)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					v.missing = append(v.missing, fmt.Sprintf("%s: %v", n, err))
					s.groupsMu.Lock()
					delete(g.holders, n)
					for r, hn := range g.hosts {
						if hn == n {
							delete(g.hosts, r) // found again by the next search
						}
					}
					s.groupsMu.Unlock()
					stale = true
					return
				}
				ranks := map[int]bool{}
				for _, w := range rep.Generations {
					v.add(n, w)
					ranks[w.Rank] = true
				}
				hosted := map[int]bool{}
				for _, h := range rep.Hosted {
					ranks[h.Rank], hosted[h.Rank] = true, true
					s.noteHost(g, h.Rank, n)
				}
				v.replyRanks[n] = len(ranks)
				s.groupsMu.Lock()
				for r, hn := range g.hosts {
					if hn == n && !hosted[r] {
						stale = true // the member moved (a relaunch): search again next time
					}
				}
				s.groupsMu.Unlock()
			}()
		}
		wg.Wait()
		if stale {
			s.groupsMu.Lock()
			g.searched = false
			s.groupsMu.Unlock()
		}
	}
	for _, all := range []map[int]map[int64][]genLoc{v.gens, v.replicas} {
		for _, steps := range all {
			for st, locs := range steps {
				slices.SortStableFunc(locs, func(a, b genLoc) int { // this node first
					return boolInt(a.node != "") - boolInt(b.node != "")
				})
				steps[st] = locs
			}
		}
	}
	sort.Strings(v.missing)
	if s.viewCache == nil {
		s.viewCache = map[string]*storeView{}
	}
	s.viewCache[name] = v
	return v
}

// invalidateView drops the cached watermarks (after a commit the view is
// stale; a restore after a failure must see what survives now).
func (s *Server) invalidateView() {
	s.viewMu.Lock()
	s.viewCache = nil
	s.viewMu.Unlock()
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// waitMesh waits up to gatherWait for peering to start.
func (s *Server) waitMesh(ctx context.Context) *mesh.Mesh {
	if s.mesh == nil {
		return nil
	}
	deadline := time.Now().Add(gatherWait)
	for {
		if m := s.mesh(); m != nil {
			return m
		}
		if st := s.peeringStatus(); st != nil && st.State == proto.PeeringOff {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// cand is one copy of a byte range: a section of a generation somewhere.
type cand struct {
	loc genLoc
	sec string
}

// shardSource says how one shard of the slice comes back.
type shardSource struct {
	pos    int
	rank   int
	source sg.Source
	cands  []cand // plain copies, nearest first; none for aec
}

// restorePlan is how a rank's whole state at one step comes back.
type restorePlan struct {
	step    int64
	ok      bool
	shards  []shardSource
	decode  []int    // positions decoded from parity
	parity  [][]cand // per position: its parity units; nil without
	others  []cand   // the rank's unreplicated buffers: copies of its generation, or its placement peers' replicas
	reasons []string // why not ok
	// lost are the shards no in-memory source can give back, each with
	// why (the restore_fallback and restore_persistent events list them
	// all; the reasons shorten a big group's).
	lost []lostShard
	// whole: copies of generations that hold the replicated buffers
	// whole (aor without arc or aec), the rank's own first.
	whole []cand
	// opt: per AOR state buffer, its copies (section named); optSource
	// says which (local: the rank's own; aor: its predecessor's replica).
	opt       map[string][]cand
	optSource sg.Source
	loaded    map[int]genLoc // a persistent-tier plan's loaded generations

	// othersSource says where others are: local (the rank's own
	// generation, wherever it survives) or peer (replicas, replicate.go).
	othersSource sg.Source
	si           *sgInfo // the rank's group on the ring the step was saved with
}

// lostShard is one shard of a rank's state that memory lost.
type lostShard struct {
	Kind     string `json:"kind"`            // replicated, optimizer or unreplicated
	Group    string `json:"group,omitempty"` // the sharding group
	Position int    `json:"position"`        // ring position; -1 for unreplicated buffers
	Rank     int    `json:"rank"`            // the owner
	Reason   string `json:"reason"`
}

func (p restorePlan) sources() string {
	var b strings.Builder
	for _, sh := range p.shards {
		if b.Len() > 0 {
			b.WriteString(" ")
		}
		from := "decode"
		if len(sh.cands) > 0 {
			from = nodeName(sh.cands[0].loc.node)
		}
		fmt.Fprintf(&b, "%d:%s@%s", sh.pos, sh.source, from)
	}
	for name, cs := range p.opt {
		if len(cs) > 0 {
			fmt.Fprintf(&b, " %s:%s@%s", name, p.optSource, nodeName(cs[0].loc.node))
		}
	}
	if len(p.others) > 0 {
		fmt.Fprintf(&b, " unreplicated:%s@%s", p.othersSource, nodeName(p.others[0].loc.node))
	}
	return b.String()
}

func nodeName(n string) string {
	if n == "" {
		return "local"
	}
	return n
}

// stepRing is the ring the group's generations of step were saved with:
// the one their manifests record (none: dp order, as before rings). Members
// that saved the step on different rings (agents that could not agree)
// make the step unusable from memory.
func stepRing(si *sgInfo, v *storeView, step int64) ([]int, error) {
	var ring []int
	var from int
	for _, r := range si.dpOrder() {
		for _, l := range v.gens[r][step] {
			if l.ring == nil {
				continue
			}
			if ring == nil {
				ring, from = l.ring, r
			} else if !slices.Equal(ring, l.ring) {
				return nil, fmt.Errorf("SG %s saved step %d on different rings (rank %d on %v, rank %d on %v): its agents did not agree, so the copies do not fit together",
					si.groupName(), step, from, ring, r, l.ring)
			}
		}
	}
	if ring == nil {
		return si.dpOrder(), nil
	}
	return ring, nil
}

// plan decides, from the watermarks, how rank si.rank's state at step
// comes back, with agent/sg's failure analysis, on the ring the step was
// saved with (p.si).
func (s *Server) plan(si *sgInfo, v *storeView, step int64) restorePlan {
	p := restorePlan{step: step}
	ring, err := stepRing(si, v, step)
	if err == nil {
		si, err = si.withRing(ring)
	}
	if err != nil {
		p.reasons = append(p.reasons, err.Error())
		return p
	}
	p.si = si
	rankNode := map[int]string{}
	for r, steps := range v.gens {
		if locs := steps[step]; len(locs) > 0 {
			rankNode[r] = nodeName(locs[0].node)
			if locs[0].node == "" {
				rankNode[r] = s.info.Node
			}
		}
	}
	md, _, err := si.model(rankNode)
	if err != nil {
		p.reasons = append(p.reasons, fmt.Sprintf("failure analysis: %v", err))
		return p
	}
	failed := []string{}
	for r := range si.world {
		if rankNode[r] == "" {
			failed = append(failed, goneNode(r))
		}
	}
	pl, err := md.Plan(failed)
	if err != nil {
		p.reasons = append(p.reasons, fmt.Sprintf("failure analysis: %v", err))
		return p
	}
	c := si.layout.Coord(si.rank)
	group := sg.Group{PP: c.PP, TP: c.TP}.Name()
	locs := func(r int) []genLoc { return v.gens[r][step] }
	p.parity = make([][]cand, si.m)
	lost := false
	for _, sh := range pl.Shards {
		if sh.Kind == sg.Optimizer && sh.Group == group && sh.Rank == si.rank {
			p.optSource = sh.Source
		}
		if sh.Kind != sg.Replicated || sh.Group != group {
			continue
		}
		q := sh.Position
		if q < 0 || q >= si.m || si.members[q] != sh.Rank {
			p.reasons = append(p.reasons, fmt.Sprintf("the failure analysis puts rank %d at ring position %d of SG %s, the layout rank %d (a bug; report it)",
				sh.Rank, q, group, si.members[min(max(q, 0), si.m-1)]))
			return p
		}
		src := shardSource{pos: q, rank: sh.Rank, source: sh.Source}
		for _, l := range locs(sh.Rank) {
			src.cands = append(src.cands, cand{loc: l, sec: secShard})
		}
		if si.arc {
			for _, l := range locs(si.members[si.pred(q)]) {
				src.cands = append(src.cands, cand{loc: l, sec: secARC})
			}
		}
		if si.whole { // any member's whole copy
			for k := 1; k < si.m; k++ {
				for _, l := range locs(si.members[(q+k)%si.m]) {
					src.cands = append(src.cands, cand{loc: l})
				}
			}
		}
		localFirst(src.cands)
		switch sh.Source {
		case sg.SourceAEC:
			src.cands = nil
			p.decode = append(p.decode, q)
		case sg.SourcePersistent:
			lost = true
			p.lost = append(p.lost, lostShard{Kind: sg.Replicated.String(), Group: group, Position: q, Rank: sh.Rank, Reason: sh.Reason})
		}
		p.shards = append(p.shards, src)
	}
	if lost {
		for _, r := range pl.Reasons {
			if strings.HasPrefix(r, "SG "+group+" ") {
				p.reasons = append(p.reasons, r)
			}
		}
	}
	if len(p.shards) != si.m {
		p.reasons = append(p.reasons, fmt.Sprintf("the failure analysis gave %d shards of SG %s, want %d", len(p.shards), group, si.m))
	}
	if si.el != nil {
		for q, r := range si.members {
			for _, l := range locs(r) {
				p.parity[q] = append(p.parity[q], cand{loc: l, sec: secParity})
			}
		}
	}
	if si.whole {
		for _, sh := range p.shards {
			if sh.rank == si.rank {
				p.whole = sh.cands
			}
		}
	}
	if si.aor != nil {
		s.planAOR(si, &p, pl, group, locs, step)
	}
	if len(si.other) > 0 {
		s.planOthers(si, v, &p, locs)
	}
	p.ok = len(p.reasons) == 0
	return p
}

// planOthers decides where the rank's unreplicated buffers at p.step come
// from: its own generation where one survives, else a placement peer's
// replica of that very step (never another step: a restore does not mix
// generations).
func (s *Server) planOthers(si *sgInfo, v *storeView, p *restorePlan, locs func(int) []genLoc) {
	p.othersSource = sg.SourceLocal
	for _, l := range locs(si.rank) {
		p.others = append(p.others, cand{loc: l})
	}
	names := si.placed()
	if len(p.others) > 0 || len(names) == 0 {
		return
	}
	p.othersSource = sg.SourcePeer
	for _, l := range v.replicas[si.rank][p.step] {
		p.others = append(p.others, cand{loc: l})
	}
	if len(p.others) > 0 {
		return
	}
	what := fmt.Sprintf("rank %d's unreplicated buffers (%s) of step %d lived only on its own node, which no agent serves any more,", si.rank, strings.Join(names, ", "), p.step)
	steps := v.replicaSteps(si.rank)
	switch {
	case len(steps) == 0:
		p.reasons = append(p.reasons, what+" and no placement peer holds a replica of them (background replication had not copied any generation, or the peers holding one are lost too)")
	case steps[0] < p.step:
		p.reasons = append(p.reasons, fmt.Sprintf("%s and the newest replica on its placement peers is of step %d, older than step %d (background replication lags behind the commits)",
			what, steps[0], p.step))
	default:
		p.reasons = append(p.reasons, fmt.Sprintf("%s and its placement peers hold replicas of steps %v, not of step %d", what, steps, p.step))
	}
	p.lost = append(p.lost, lostShard{Kind: "unreplicated", Position: -1, Rank: si.rank, Reason: p.reasons[len(p.reasons)-1]})
}

// candidateSteps are the steps any member of the SG (or the rank itself)
// has, newest first.
func (si *sgInfo) candidateSteps(v *storeView) []int64 {
	set := map[int64]bool{}
	for _, r := range append(slices.Clone(si.members), si.rank) {
		for st := range v.gens[r] {
			set[st] = true
		}
	}
	out := slices.Collect(maps.Keys(set))
	slices.SortFunc(out, func(a, b int64) int { return int(b - a) })
	return out
}

// shardedGenerations is the generations reply of a sharded rank: the
// steps its whole state can be assembled at from the job's memory, then
// the persisted steps every member of its SG has.
func (s *Server) shardedGenerations(rc *rankConn, log zerolog.Logger) []proto.GenInfo {
	si := rc.sg
	v := s.view(context.Background(), si)
	out := []proto.GenInfo{}
	for _, st := range si.candidateSteps(v) {
		if p := s.plan(si, v, st); p.ok {
			out = append(out, proto.GenInfo{Step: st, Bytes: rc.registeredBytes(), Source: proto.SourceMemory})
		}
	}
	for _, st := range s.persistedSteps(si, log) {
		if !slices.ContainsFunc(out, func(g proto.GenInfo) bool { return g.Step == st }) {
			out = append(out, proto.GenInfo{Step: st, Bytes: rc.registeredBytes(), Source: proto.SourcePersistent})
		}
	}
	slices.SortStableFunc(out, func(a, b proto.GenInfo) int { return int(b.Step - a.Step) })
	return out
}

func (rc *rankConn) registeredBytes() int64 {
	var n int64
	for _, b := range rc.bufs {
		n += b.Size
	}
	return n
}

// persistedSteps are the steps every SG member (and the rank, for its
// unreplicated buffers) has in the persistent directory, newest first.
func (s *Server) persistedSteps(si *sgInfo, log zerolog.Logger) []int64 {
	if s.persist == nil {
		return nil
	}
	var common map[int64]bool
	for _, r := range si.members {
		gens, err := s.persist.Generations(r)
		if err != nil {
			log.Warn().Err(err).Int("rank", r).Msg("the persistent directory cannot be listed")
			return nil
		}
		have := map[int64]bool{}
		for _, g := range gens {
			if common == nil || common[g.Step] {
				have[g.Step] = true
			}
		}
		common = have
	}
	out := slices.Collect(maps.Keys(common))
	slices.SortFunc(out, func(a, b int64) int { return int(b - a) })
	return out
}

// restoreStats is what an assembled restore did.
type restoreStats struct {
	local, peer, decoded atomic.Int64
	// failovers counts the chunks (and local sections) that a copy
	// failed, a checksum mismatch or a lost peer, and another gave.
	failovers atomic.Int64
	peers     sync.Map         // node -> struct{}
	prog      *restoreProgress // nil: not reported
	log       *zerolog.Logger  // the restore's; nil: the server's
}

// restoreSharded assembles the rank's state at step (< 0: the newest the
// job can restore) from the node's store, the SG's agents and parity, or,
// only when memory cannot, from the persistent directory; then serves it
// like a local restore.
func (s *Server) restoreSharded(rc *rankConn, step int64, log zerolog.Logger) (tmpfs.Generation, string, error) {
	si := rc.sg
	ctx := context.Background()
	s.repl.hosts.forget() // a restore follows a relaunch: ranks may have moved
	v := s.view(ctx, si)
	steps := si.candidateSteps(v)
	if step >= 0 {
		steps = []int64{step}
	}
	chosen, first := s.firstRestorable(si, v, steps)
	event := "restore_local"
	var reason string
	var lost []lostShard // what memory lost, when the persistent tier restores
	if chosen == nil {
		if step >= 0 {
			// The ranks agreed on a step memory cannot give (a persisted
			// one, typically long released from memory): the reason that
			// matters is why no newer step came back from memory.
			_, first = s.firstRestorable(si, v, si.candidateSteps(v))
		}
		// Memory cannot: the persistent tier.
		switch {
		case first == nil:
			reason = fmt.Sprintf("no agent of the job holds a generation of SG %s", strings.Join(intStrings(si.members), ","))
		default:
			reason = strings.Join(first.reasons, "; ")
		}
		if len(v.missing) > 0 {
			reason += " (agents that did not answer: " + strings.Join(v.missing, "; ") + ")"
		}
		p, err := s.loadPersisted(si, step, log)
		if err != nil {
			return tmpfs.Generation{}, "", lostError{fmt.Sprintf("%s; %v", reason, err)}
		}
		chosen, event = p, "restore_persistent"
		if first != nil {
			lost = first.lost
		}
		log.Warn().Str("event", "restore_fallback").Int("rank", si.rank).Int64("generation", p.step).Str("reason", reason).
			Interface("lost_shards", lost).Msg("in-memory restore is impossible; restoring from the persistent directory")
	}
	t0 := time.Now()
	// The step's own ring, from here on: the assembly reads its shards by
	// the positions they were saved at, the AOR seed takes the successor
	// on it, and the group keeps it for the saves that follow.
	si = chosen.si
	rc.sg, rc.ringFixed = si, false
	st := restoreStats{prog: newRestoreProgress(log, si.rank, chosen.step, rc.registeredBytes()+chosen.parityBytes(si), s.progressEvery), log: &log}
	g, err := s.assemble(ctx, rc, si, chosen, &st, log)
	st.prog.close()
	if err == nil {
		s.adoptRing(si, chosen.step, log)
	}
	if err == nil && si.aor != nil { // before the loaded persisted generations go
		locs := func(r int) []genLoc { return v.gens[r][chosen.step] }
		if chosen.loaded != nil {
			locs = func(r int) []genLoc {
				if l, ok := chosen.loaded[r]; ok {
					return []genLoc{l}
				}
				return nil
			}
		}
		s.seedAOR(ctx, rc, chosen.step, locs, log)
	}
	if event == "restore_persistent" {
		for _, r := range append(slices.Clone(si.members), si.rank) {
			if err := s.store.Drop(tmpfs.Key{Rank: r, Shard: persistedKey(si.rank)}); err != nil {
				log.Warn().Err(err).Msg("restore: freeing the loaded persisted generations")
			}
		}
	}
	if err != nil {
		return g, "", err
	}
	if event != "restore_persistent" {
		switch {
		case st.decoded.Load() > 0:
			event = "decode"
		case st.peer.Load() > 0:
			event = "restore_peer"
		}
	}
	var peers []string
	st.peers.Range(func(k, _ any) bool { peers = append(peers, k.(string)); return true })
	sort.Strings(peers)
	d := time.Since(t0)
	total := st.local.Load() + st.peer.Load() + st.decoded.Load()
	ev := log.Info().Str("event", event).Int("rank", si.rank).Int64("generation", chosen.step).Int64("bytes", total).
		Int64("local_bytes", st.local.Load()).Int64("peer_bytes", st.peer.Load()).Int64("decoded_bytes", st.decoded.Load()).
		Strs("peers", peers).Str("sources", chosen.sources()).Int64("failovers", st.failovers.Load()).Dur("duration", d).
		Float64("rate_mb_s", float64(total)/1e6/max(d.Seconds(), 1e-9))
	if reason != "" {
		ev = ev.Str("reason", reason).Interface("lost_shards", lost)
	}
	ev.Msg("restore assembled from the sharding group")
	return g, event, nil
}

// firstRestorable plans steps in order and returns the first plan that
// works, and the plan to blame should none: that of the step the fewest
// members lack (the newest such), since a step only some survivors reached
// would blame them too.
func (s *Server) firstRestorable(si *sgInfo, v *storeView, steps []int64) (chosen, blame *restorePlan) {
	bestMissing := -1
	for _, st := range steps {
		p := s.plan(si, v, st)
		missing := 0
		for _, r := range si.members {
			if len(v.gens[r][st]) == 0 {
				missing++
			}
		}
		if blame == nil || missing < bestMissing {
			blame, bestMissing = &p, missing
		}
		if p.ok {
			return &p, blame
		}
	}
	return nil, blame
}

func intStrings(v []int) []string {
	out := make([]string, len(v))
	for i, x := range v {
		out[i] = fmt.Sprint(x)
	}
	return out
}

// loadPersisted loads the newest persisted step (or step) that every SG
// member has into this node's store and plans the restore from it.
func (s *Server) loadPersisted(si *sgInfo, step int64, log zerolog.Logger) (*restorePlan, error) {
	if s.persist == nil {
		return nil, errors.New("persistent checkpoints are off for this job (persist= in --reft), so the state is lost: train again from the start or from your own checkpoint")
	}
	steps := s.persistedSteps(si, log)
	if step >= 0 {
		steps = slices.DeleteFunc(steps, func(x int64) bool { return x != step })
	}
	if len(steps) == 0 {
		return nil, fmt.Errorf("and the persistent directory %s has no step that every member (ranks %s) wrote", s.persist.Dir(), strings.Join(intStrings(si.members), ","))
	}
	st := steps[0]
	loaded := map[int]genLoc{}
	var ring []int
	for _, r := range append(slices.Clone(si.members), si.rank) {
		if _, ok := loaded[r]; ok {
			continue
		}
		gens, err := s.persist.Generations(r)
		if err != nil {
			return nil, err
		}
		i := slices.IndexFunc(gens, func(g persist.Generation) bool { return g.Step == st })
		if i < 0 {
			return nil, fmt.Errorf("rank %d has no persisted step %d", r, st)
		}
		key := tmpfs.Key{Rank: r, Shard: persistedKey(si.rank)}
		g, err := s.persist.Load(gens[i], key, manifestSpec(&gens[i].Manifest))
		if err != nil {
			return nil, err
		}
		loaded[r] = genLoc{key: peer.GenKey{Rank: r, Shard: key.Shard, Step: g.Step, Seq: g.Seq}, ring: g.Manifest.Ring}
		if rg := g.Manifest.Ring; rg != nil && ring != nil && !slices.Equal(rg, ring) {
			return nil, fmt.Errorf("the members persisted step %d on different rings (%v and %v): their agents did not agree, so the shards do not fit together", st, ring, rg)
		} else if rg != nil {
			ring = rg
		}
	}
	if ring == nil {
		ring = si.dpOrder()
	}
	si, err := si.withRing(ring)
	if err != nil {
		return nil, err
	}
	p := &restorePlan{step: st, ok: true, parity: make([][]cand, si.m), si: si}
	for q, r := range si.members {
		src := shardSource{pos: q, rank: r, source: sg.SourcePersistent, cands: []cand{{loc: loaded[r], sec: secShard}}}
		p.shards = append(p.shards, src)
	}
	p.loaded = loaded
	if si.whole {
		p.whole = []cand{{loc: loaded[si.rank]}}
	}
	if si.aor != nil {
		p.opt, p.optSource = map[string][]cand{}, sg.SourcePersistent
		for _, name := range si.aorStateNames() {
			p.opt[name] = []cand{{loc: loaded[si.rank], sec: name}}
		}
	}
	if len(si.other) > 0 {
		p.others = []cand{{loc: loaded[si.rank]}}
	}
	return p, nil
}

// assemble writes the plan's state into a fresh generation of the rank's
// restore key, every chunk verified on the way.
func (s *Server) assemble(ctx context.Context, rc *rankConn, si *sgInfo, p *restorePlan, st *restoreStats, log zerolog.Logger) (tmpfs.Generation, error) {
	spec, err := si.restoreSpec(rc.spec.Sources, s.store.ChunkSize())
	if err != nil {
		return tmpfs.Generation{}, err
	}
	spec.Step = p.step
	o, err := s.store.Begin(tmpfs.Key{Rank: si.rank, Shard: restoreShard}, spec)
	if err != nil {
		return tmpfs.Generation{}, fmt.Errorf("an arena for the assembled state: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			o.Abort()
		}
	}()
	rep, err := o.Buffer(secRep)
	if err != nil {
		return tmpfs.Generation{}, err
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	for _, b := range si.slice {
		if !si.whole || b.size == 0 {
			continue
		}
		var cs []cand
		for _, c := range p.whole {
			cs = append(cs, cand{loc: c.loc, sec: b.name})
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.fetchInto(ctx, rep[b.off:b.off+b.size], cs, st); err != nil {
				fail(fmt.Errorf("buffer %q: %w", b.name, err))
			}
		}()
	}
	for _, sh := range p.shards {
		if len(sh.cands) == 0 || si.whole {
			continue // decoded below, or fetched whole above
		}
		r := si.shard(sh.pos)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.fetchInto(ctx, rep[r.Off:r.End()], sh.cands, st); err != nil {
				fail(fmt.Errorf("shard %d (rank %d, %s): %w", sh.pos, sh.rank, sh.source, err))
			}
		}()
	}
	for _, b := range si.other {
		dst, err := o.Buffer(b.Name)
		if err != nil {
			return tmpfs.Generation{}, err
		}
		var cs []cand
		for _, c := range p.others {
			cs = append(cs, cand{loc: c.loc, sec: b.Name})
		}
		if _, ok := si.aorStateOf(b.Name); ok {
			cs = p.opt[b.Name]
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.fetchInto(ctx, dst, cs, st); err != nil {
				fail(fmt.Errorf("buffer %q: %w", b.Name, err))
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return tmpfs.Generation{}, errors.Join(errs...)
	}
	if len(p.decode) > 0 {
		if err := s.decode(ctx, si, p, rep, st); err != nil {
			return tmpfs.Generation{}, err
		}
	}
	for _, b := range spec.Buffers {
		if err := o.ComputeChecksums(b.Name); err != nil {
			return tmpfs.Generation{}, err
		}
	}
	g, err := o.Commit()
	if err != nil {
		return g, err
	}
	ok = true
	return g, nil
}

// parityBytes is what a plan fetches besides the state itself: the
// parity units its decode reads.
func (p *restorePlan) parityBytes(si *sgInfo) int64 {
	if len(p.decode) == 0 {
		return 0
	}
	var n int64
	for q := range si.m {
		if !slices.Contains(p.decode, q) && len(p.parity[q]) > 0 {
			n += int64(si.el.ParitySize())
		}
	}
	return n
}

// decode rebuilds the plan's lost shards in rep from the other shards
// (already in rep) and the surviving members' parity.
func (s *Server) decode(ctx context.Context, si *sgInfo, p *restorePlan, rep []byte, st *restoreStats) error {
	shards := make([][]byte, si.m)
	for q := range si.m {
		r := si.shard(q)
		shards[q] = rep[r.Off:r.End()]
	}
	parities := make([][]byte, si.m)
	var wg sync.WaitGroup
	for q := range si.m {
		if slices.Contains(p.decode, q) || len(p.parity[q]) == 0 {
			continue
		}
		buf := make([]byte, si.el.ParitySize())
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.fetchInto(ctx, buf, p.parity[q], st); err == nil {
				parities[q] = buf
			}
		}()
	}
	wg.Wait()
	if err := si.decoder.Reconstruct(p.decode, shards, parities); err != nil {
		return fmt.Errorf("decoding shards %v from parity: %w", p.decode, err)
	}
	for _, q := range p.decode {
		st.decoded.Add(si.shard(q).Len)
		st.prog.add(si.shard(q).Len)
	}
	return nil
}

// fetchInto fills dst with a section that each candidate holds whole:
// from this node's store if a local copy verifies, else from the peers, a
// chunk that fails its checksum taken from the next copy. Every copy that
// failed while another delivered is logged (chunk_failover) and counted.
func (s *Server) fetchInto(ctx context.Context, dst []byte, cands []cand, st *restoreStats) error {
	var lastErr error
	var remote []cand
	var localBad []string // local copies that failed, with why
	for _, c := range cands {
		if c.loc.node != "" {
			remote = append(remote, c)
			continue
		}
		if err := s.copyLocal(dst, c); err != nil {
			lastErr = err
			localBad = append(localBad, err.Error())
			continue
		}
		st.local.Add(int64(len(dst)))
		st.prog.add(int64(len(dst)))
		s.logFailover(st, c, localBad, nil, nil, "this node")
		return nil
	}
	if len(remote) == 0 {
		if lastErr == nil {
			lastErr = errors.New("no copy of it survives")
		}
		return lastErr
	}
	m := s.waitMesh(ctx)
	if m == nil {
		return errors.Join(lastErr, errors.New("peering is off: the copies on other nodes cannot be read"))
	}
	var spec peer.FetchSpec
	nodeOf := map[string]string{} // source address -> node
	for _, c := range remote {
		cctx, cancel := context.WithTimeout(ctx, gatherWait)
		info, err := m.Manifest(cctx, c.loc.node, c.loc.key)
		var src peer.Source
		if err == nil {
			src, err = m.Source(cctx, c.loc.node, peer.ChunkKey{GenKey: c.loc.key, Buffer: c.sec})
		}
		cancel()
		if err != nil {
			lastErr = err
			localBad = append(localBad, fmt.Sprintf("%s on %s: %v", c.sec, c.loc.node, err))
			continue
		}
		b := info.Buffer(c.sec)
		if b == nil || b.Size != int64(len(dst)) {
			lastErr = fmt.Errorf("%s on %s has no section %s of %d bytes", c.loc.key, c.loc.node, c.sec, len(dst))
			localBad = append(localBad, lastErr.Error())
			continue
		}
		if spec.Sources == nil {
			spec = peer.FetchSpec{ChunkSize: info.ChunkSize, Size: int64(len(dst)), CRC: b.CRC32C, Dst: dst, Progress: st.prog.add}
		} else if info.ChunkSize != spec.ChunkSize {
			continue // another chunking: its checksums do not compare
		}
		spec.Sources = append(spec.Sources, src)
		nodeOf[src.Addr] = c.loc.node
		st.peers.Store(c.loc.node, struct{}{})
	}
	if len(spec.Sources) == 0 {
		return lastErr
	}
	if len(dst) == 0 {
		return nil
	}
	fs, err := m.Fetch(ctx, spec)
	if err != nil {
		return err
	}
	st.peer.Add(int64(len(dst)))
	s.logFailover(st, cands[0], localBad, fs.Recovered, nodeOf, "peers")
	return nil
}

// chunkFailover is one chunk that a copy failed and another delivered.
type chunkFailover struct {
	Chunk  int      `json:"chunk"`
	Failed []string `json:"failed"` // "node: why", in the order tried
	From   string   `json:"from"`   // the node that delivered it
}

// logFailover says, once per section, which copies failed (whole:
// local copies and peers that could not serve the section; chunks: the
// chunks a peer failed and another delivered) and counts them.
func (s *Server) logFailover(st *restoreStats, c cand, whole []string, chunks []peer.ChunkRecovery, nodeOf map[string]string, by string) {
	if len(whole) == 0 && len(chunks) == 0 {
		return
	}
	n := len(whole)
	fo := make([]chunkFailover, len(chunks))
	for i, rc := range chunks {
		fo[i] = chunkFailover{Chunk: rc.Chunk, From: nodeOf[rc.From.Addr]}
		for _, a := range rc.Attempts {
			fo[i].Failed = append(fo[i].Failed, fmt.Sprintf("%s: %v", nodeOf[a.Source.Addr], a.Err))
		}
		n += len(rc.Attempts)
	}
	st.failovers.Add(int64(n))
	log := s.log
	if st.log != nil {
		log = *st.log
	}
	log.Warn().Str("event", "chunk_failover").Int("owner_rank", c.loc.key.Rank).Int64("generation", c.loc.key.Step).Str("section", c.sec).
		Strs("copies_failed", whole).Interface("chunks", fo).Int("failovers", n).
		Msgf("restore: %d read(s) of section %s failed (a checksum mismatch or a copy that could not be read); another copy served them (%s)", n, c.sec, by)
}

// copyLocal copies a section of a generation in this node's store,
// verifying every chunk.
func (s *Server) copyLocal(dst []byte, c cand) error {
	k := tmpfs.Key{Rank: c.loc.key.Rank, Shard: c.loc.key.Shard}
	i := slices.IndexFunc(s.store.Generations(k), func(g tmpfs.Generation) bool {
		return g.Step == c.loc.key.Step && g.Seq == c.loc.key.Seq && !g.Bad
	})
	if i < 0 {
		return fmt.Errorf("%s is no longer in this node's store", c.loc.key)
	}
	r, err := s.store.Open(s.store.Generations(k)[i])
	if err != nil {
		return err
	}
	defer r.Close()
	if b := slices.IndexFunc(r.Manifest().Buffers, func(b tmpfs.Buffer) bool { return b.Name == c.sec }); b < 0 || r.Manifest().Buffers[b].Size != int64(len(dst)) {
		return fmt.Errorf("%s has no section %s of %d bytes: the sharding group's members registered different replicated buffers (is the layout, dp= pp= tp=, the trainer's?)", c.loc.key, c.sec, len(dst))
	}
	var off int64
	for n := 0; off < int64(len(dst)); n++ {
		b, crc, err := r.Chunk(c.sec, n)
		if err != nil {
			return err
		}
		if tmpfs.CRC(b) != crc {
			return fmt.Errorf("%s section %s chunk %d: %w", c.loc.key, c.sec, n, tmpfs.ErrCorrupt)
		}
		if off+int64(len(b)) > int64(len(dst)) {
			return fmt.Errorf("%s section %s is larger than %d bytes", c.loc.key, c.sec, len(dst))
		}
		copy(dst[off:], b)
		off += int64(len(b))
	}
	return nil
}

// lostError is a state that neither memory nor the persistent tier can
// give back: the protocol's not_found.
type lostError struct{ msg string }

func (e lostError) Error() string { return e.msg }
func (e lostError) Unwrap() error { return tmpfs.ErrNoGeneration }

// persistedKey is the store shard under which rank's persistent-tier
// restore loads the SG members' generations: one per restoring rank, so
// the ranks of a node restore side by side.
func persistedKey(rank int) string { return persistedShard + "-for-" + strconv.Itoa(rank) }

// planAOR decides where the rank's AOR state buffers come from at step,
// as the failure analysis says: its own generation (local), or its ring
// predecessor's replica (aor) when that is valid for the step.
func (s *Server) planAOR(si *sgInfo, p *restorePlan, pl sg.Plan, group string, locs func(int) []genLoc, step int64) {
	names := si.aorStateNames()
	p.opt = map[string][]cand{}
	had := len(p.reasons)
	defer func() {
		if len(p.reasons) > had {
			p.lost = append(p.lost, lostShard{Kind: sg.Optimizer.String(), Group: group, Position: si.pos, Rank: si.rank,
				Reason: strings.Join(p.reasons[had:], "; ")})
		}
	}()
	switch p.optSource {
	case sg.SourceLocal:
		for _, n := range names {
			for _, l := range locs(si.rank) {
				p.opt[n] = append(p.opt[n], cand{loc: l, sec: n})
			}
		}
	case sg.SourceAOR:
		pred := si.members[si.pred(si.pos)]
		ctx, cancel := context.WithTimeout(context.Background(), 2*gatherWait)
		defer cancel()
		b, err := s.readBase(ctx, locs(pred))
		switch {
		case err != nil:
			p.reasons = append(p.reasons, fmt.Sprintf("rank %d's optimizer state (%s) of step %d lived only on its node; the AOR replica rank %d keeps cannot be read: %v",
				si.rank, strings.Join(names, ", "), step, pred, err))
		case b != step:
			p.reasons = append(p.reasons, fmt.Sprintf("rank %d's optimizer state (%s) of step %d lived only on its node, and the AOR replica rank %d keeps is not valid for that step (it could not be brought forward: a step was not saved, or rank %d restored without a replica; its agent's aor_invalid event says why)",
				si.rank, strings.Join(names, ", "), step, pred, pred))
		default:
			for _, n := range names {
				for _, l := range locs(pred) {
					p.opt[n] = append(p.opt[n], cand{loc: l, sec: secAOR + n})
				}
			}
		}
	case sg.SourcePersistent:
		for _, r := range pl.Reasons {
			if strings.HasPrefix(r, "SG "+group+" ") && strings.Contains(r, "optimizer shard") && !slices.Contains(p.reasons, r) {
				p.reasons = append(p.reasons, r)
			}
		}
		if len(p.reasons) == 0 {
			p.reasons = append(p.reasons, fmt.Sprintf("rank %d's optimizer state and its AOR replica of step %d are both gone", si.rank, step))
		}
	default:
		p.reasons = append(p.reasons, fmt.Sprintf("the failure analysis gave no source for rank %d's optimizer shard (a bug; report it)", si.rank))
	}
	for _, n := range names {
		localFirst(p.opt[n])
	}
}

// localFirst orders copies on this node before those on peers, keeping
// the order otherwise.
func localFirst(cs []cand) {
	slices.SortStableFunc(cs, func(a, b cand) int { return boolInt(a.loc.node != "") - boolInt(b.loc.node != "") })
}
