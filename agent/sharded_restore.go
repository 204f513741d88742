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
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/event"
	"github.com/reft-hpc/reft/agent/mesh"
	"github.com/reft-hpc/reft/agent/peer"
	"github.com/reft-hpc/reft/agent/persist"
	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/agent/restore"
	"github.com/reft-hpc/reft/agent/runrecord"
	"github.com/reft-hpc/reft/agent/sg"
	"github.com/reft-hpc/reft/agent/shard"
	"github.com/reft-hpc/reft/tmpfs"
)

// How long a restore waits for the job's other agents to answer with
// their watermarks, and how long one answer is reused: every rank of a
// node asks for generations and then restores within moments.
const (
	gatherWait = 3 * time.Second
	viewTTL    = 5 * time.Second
)

// views caches each sharding group's watermark view (restore.View: which
// agent holds which generation of which member), every rank of a node
// lists its generations and restores within moments. Safe for concurrent
// use: mu is held across a gathering, so the ranks of a node wait for one
// gathering rather than each asking the group, and invalidate (a commit
// or a replica made the views stale) waits for a gathering in progress.
// It calls the rings and the mesh, never the Server.
type views struct {
	*attached
	rings *rings
	mu    sync.Mutex
	cache map[string]*restore.View // by sharding group, at most viewTTL old
}

// restorer assembles the restores of sharded ranks (REFT 4.1-4.2) and
// lists what they can restore: from the node's store, the sharding
// group's agents and parity (agent/restore's Planner over the group's
// view, its Assembler over the store and the mesh) or, only when memory
// cannot, the persistent tier; and it seeds the AOR replica a restored
// rank's next commit starts from (sharded_aor.go).
//
// Its methods run on the requesting rank's connection goroutine with
// that connection's rankConn, which no other goroutine touches, and its
// ctx, cancelled when the rank goes away or the agent stops; several ranks
// restore at once. What they share is safe for concurrent use: the views,
// the rings, the rank map, the store, the mesh and the persistent tier. It
// never calls back into the Server.
type restorer struct {
	*attached
	views *views
	rings *rings
	// hosts is the replicator's rank map, forgotten at every restore (a
	// relaunch may have moved ranks).
	hosts *rankHosts
	// progressEvery is how often a running restore reports progress
	// (restoreProgressEvery; 0: at every arrival).
	progressEvery time.Duration
	log           zerolog.Logger // for the reads no rank reports (fetchInto)
}

// view returns the watermarks of si's sharding group, at most viewTTL
// old. It asks only the nodes that host the group's members or held
// their generations (ring.go), for the members' ranks only, so that a
// view is O(group) whatever the job's size; until a search of the job
// has found every member (a fresh agent), it searches first.
func (vs *views) view(ctx context.Context, si *shard.Geometry) *restore.View {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	name := si.GroupName()
	if v := vs.cache[name]; v != nil && time.Since(v.At) < viewTTL {
		return v
	}
	v := restore.NewView(time.Now())
	for _, w := range (peer.StoreSource{Store: vs.store}).Watermarks(si.DPOrder()) {
		v.Add("", w)
	}
	if m := vs.waitMesh(ctx); m == nil {
		v.Missing = append(v.Missing, "peering is off or not started (status says why): only this node's store is used")
	} else {
		gatherView(ctx, vs.rings, m, si, v)
	}
	v.SortLocalFirst()
	sort.Strings(v.Missing)
	if ctx.Err() != nil {
		return v // cut short: not for the next caller
	}
	if vs.cache == nil {
		vs.cache = map[string]*restore.View{}
	}
	vs.cache[name] = v
	return v
}

// gatherView asks the other nodes of si's group (after a search of the
// job, until one found every member) for the members' watermarks, into
// v: all at once, each for at most gatherWait. A node that does not
// answer, or whose members moved, makes the next view search again.
func gatherView(ctx context.Context, rg *rings, m *mesh.Mesh, si *shard.Geometry, v *restore.View) {
	members := si.DPOrder()
	g := rg.group(si)
	nodes, searched := rg.viewNodes(g)
	if !searched {
		rg.searchGroup(ctx, si, g)
		nodes, _ = rg.viewNodes(g)
	}
	v.Asked = nodes
	var mu sync.Mutex
	var wg sync.WaitGroup
	stale := false
	for _, n := range nodes {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, gatherWait)
			defer cancel()
			rep, err := m.Watermarks(cctx, n, members)
			mu.Lock()
			defer mu.Unlock()
			if !takeWatermarks(rg, g, v, n, rep, err) {
				stale = true
			}
		})
	}
	wg.Wait()
	if stale {
		rg.mu.Lock()
		g.searched = false
		rg.mu.Unlock()
	}
}

// takeWatermarks adds node n's reply (or its failure) to v and learns
// from it where g's members run. fresh is false when g's map went stale:
// n did not answer (its members are found again by the next search), or
// a member it hosted moved (a relaunch). The caller serializes the calls
// for one v.
func takeWatermarks(rg *rings, g *groupState, v *restore.View, n string, rep *peer.WatermarksReply, err error) (fresh bool) {
	if err != nil {
		v.Missing = append(v.Missing, fmt.Sprintf("%s: %v", n, err))
		rg.mu.Lock()
		g.forget(n)
		rg.mu.Unlock()
		return false
	}
	ranks := map[int]bool{}
	for _, w := range rep.Generations {
		v.Add(n, w)
		ranks[w.Rank] = true
	}
	hosted := map[int]bool{}
	for _, h := range rep.Hosted {
		ranks[h.Rank], hosted[h.Rank] = true, true
		rg.noteHost(g, h.Rank, n)
	}
	v.ReplyRanks[n] = len(ranks)
	rg.mu.Lock()
	defer rg.mu.Unlock()
	return !g.movedFrom(n, hosted)
}

// invalidate drops the cached watermarks (after a commit the view is
// stale; a restore after a failure must see what survives now).
func (vs *views) invalidate() {
	vs.mu.Lock()
	vs.cache = nil
	vs.mu.Unlock()
}

// restoreGroup is what the restore planner needs of si's geometry.
func restoreGroup(si *shard.Geometry) restore.Group {
	return restore.Group{Spec: si.Spec, Layout: si.Layout, World: si.World, Rank: si.Rank, Members: si.Members,
		ARC: si.ARC, Parity: si.EL != nil, Whole: si.Whole, AOR: si.AOR.StateNames(),
		Unreplicated: len(si.Other) > 0, Placed: si.Placed()}
}

// candidateSteps are the steps any member of the SG (or the rank itself)
// has, newest first.
func candidateSteps(si *shard.Geometry, v *restore.View) []int64 {
	return v.Steps(append(slices.Clone(si.Members), si.Rank))
}

// planner is the restore planner of this node: it reads AOR replicas'
// base steps through the mesh, each read bounded by 2*gatherWait and ctx.
func (rs *restorer) planner(ctx context.Context) restore.Planner {
	return restore.Planner{Node: rs.info.Node, ReadBase: func(locs []restore.Loc) (int64, error) {
		ctx, cancel := context.WithTimeout(ctx, 2*gatherWait)
		defer cancel()
		return rs.readBase(ctx, locs)
	}}
}

// shardedGenerations is the generations reply of a sharded rank: the
// steps its whole state can be assembled at from the job's memory, then
// the persisted steps every member of its SG has.
func (rs *restorer) shardedGenerations(ctx context.Context, rc *rankConn, log zerolog.Logger) []proto.GenInfo {
	si := rc.sg
	v := rs.views.view(ctx, si)
	out := []proto.GenInfo{}
	pl, g := rs.planner(ctx), restoreGroup(si)
	for _, st := range candidateSteps(si, v) {
		if p := pl.Plan(g, v, st); p.OK {
			out = append(out, proto.GenInfo{Step: st, Bytes: rc.registeredBytes(), Source: proto.SourceMemory})
		}
	}
	for _, st := range rs.persistedSteps(si, log) {
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
func (rs *restorer) persistedSteps(si *shard.Geometry, log zerolog.Logger) []int64 {
	if rs.persist == nil {
		return nil
	}
	var common map[int64]bool
	for _, r := range si.Members {
		gens, err := rs.persist.Generations(r)
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

// restoreSharded assembles the rank's state at step (< 0: the newest the
// job can restore) from the node's store, the SG's agents and parity, or,
// only when memory cannot, from the persistent directory; then serves it
// like a local restore.
func (rs *restorer) restoreSharded(ctx context.Context, rc *rankConn, step int64, log zerolog.Logger) (tmpfs.Generation, string, error) {
	si := rc.sg
	rs.hosts.forget() // a restore follows a relaunch: ranks may have moved
	v := rs.views.view(ctx, si)
	steps := candidateSteps(si, v)
	if step >= 0 {
		steps = []int64{step}
	}
	pl, rg := rs.planner(ctx), restoreGroup(si)
	chosen, first := pl.FirstRestorable(rg, v, steps)
	if err := ctx.Err(); err != nil {
		// The agent is stopping: what the view missed says nothing of
		// what survives, so no fallback on its account.
		return tmpfs.Generation{}, "", fmt.Errorf("the restore of rank %d stopped (the agent is stopping): %w", si.Rank, err)
	}
	ev := event.RestoreLocal
	var fb fallback
	if chosen == nil {
		if step >= 0 {
			// The ranks agreed on a step memory cannot give (a persisted
			// one, typically long released from memory): the reason that
			// matters is why no newer step came back from memory.
			_, first = pl.FirstRestorable(rg, v, candidateSteps(si, v))
		}
		var err error
		if fb, err = rs.fallBack(si, step, v, first, log); err != nil {
			return tmpfs.Generation{}, "", err
		}
		chosen, ev = fb.plan, event.RestorePersistent
	}
	t0 := time.Now()
	// The step's own ring, from here on: the assembly reads its shards by
	// the positions they were saved at, the AOR seed takes the successor
	// on it, and the group keeps it for the saves that follow.
	si, err := si.WithRing(chosen.Ring)
	if err != nil {
		return tmpfs.Generation{}, "", err
	}
	rc.sg, rc.ringFixed = si, false
	var st restore.Stats
	prog := newRestoreProgress(log, si.Rank, chosen.Step, rc.registeredBytes()+parityBytes(si, chosen), rs.progressEvery)
	g, err := rs.assemble(ctx, rc, si, chosen, rs.assembler(&st, prog, log))
	prog.close()
	if err == nil {
		rs.rings.adoptRing(si, chosen.Step, log)
		rs.seedRestored(ctx, rc, chosen, v, log) // before the loaded persisted generations go
	}
	if ev == event.RestorePersistent {
		dropLoaded(rs.store, si, log)
	}
	if err != nil {
		return g, "", err
	}
	ev = restoredEvent(ev, &st)
	d := time.Since(t0)
	logRestored(log, ev, si.Rank, chosen, &st, d, fb)
	rs.record(runrecord.Record{Kind: runrecord.KindRestored, Rank: si.Rank, PID: int(rc.pid), Step: rc.step, Event: ev,
		Generation: chosen.Step, Bytes: st.Local.Load() + st.Peer.Load() + st.Decoded.Load(), Duration: d, Reason: fb.reason}, log)
	return g, ev, nil
}

// fallback is a restore from the persistent tier: its plan, why memory
// could not, and what memory lost.
type fallback struct {
	plan   *restore.Plan
	reason string
	lost   []restore.LostShard
}

// fallBack loads the persisted step (step < 0: the newest every member
// has) when memory cannot restore, first being the plan to blame (nil:
// no agent holds a generation of the group), and says so
// (restore_fallback). A step the tier cannot give either is lost
// (lostError).
func (rs *restorer) fallBack(si *shard.Geometry, step int64, v *restore.View, first *restore.Plan, log zerolog.Logger) (fallback, error) {
	var fb fallback
	switch {
	case first == nil:
		fb.reason = fmt.Sprintf("no agent of the job holds a generation of SG %s", strings.Join(intStrings(si.Members), ","))
	default:
		fb.reason = strings.Join(first.Reasons, "; ")
	}
	if len(v.Missing) > 0 {
		fb.reason += " (agents that did not answer: " + strings.Join(v.Missing, "; ") + ")"
	}
	p, err := rs.loadPersisted(si, step, log)
	if err != nil {
		return fb, lostError{fmt.Sprintf("%s; %v", fb.reason, err)}
	}
	fb.plan = p
	if first != nil {
		fb.lost = first.Lost
	}
	log.Warn().Str("event", event.RestoreFallback).Int("rank", si.Rank).Int64("generation", p.Step).Str("reason", fb.reason).
		Interface("lost_shards", fb.lost).Msg("in-memory restore is impossible; restoring from the persistent directory")
	return fb, nil
}

// seedRestored sets the AOR replica the rank's next commit starts from
// (seedAOR), from the copies of the restored step: the view's, or the
// loaded persisted generations of a persistent-tier plan.
func (rs *restorer) seedRestored(ctx context.Context, rc *rankConn, p *restore.Plan, v *restore.View, log zerolog.Logger) {
	if rc.sg.AOR == nil {
		return
	}
	locs := func(r int) []restore.Loc { return v.Gens[r][p.Step] }
	if p.Loaded != nil {
		locs = func(r int) []restore.Loc {
			if l, ok := p.Loaded[r]; ok {
				return []restore.Loc{l}
			}
			return nil
		}
	}
	rs.seedAOR(ctx, rc, p.Step, locs, log)
}

// dropLoaded frees the persisted generations a persistent-tier restore
// loaded into the store.
func dropLoaded(store *tmpfs.Store, si *shard.Geometry, log zerolog.Logger) {
	for _, r := range append(slices.Clone(si.Members), si.Rank) {
		if err := store.Drop(tmpfs.Key{Rank: r, Shard: persistedKey(si.Rank)}); err != nil {
			log.Warn().Err(err).Msg("restore: freeing the loaded persisted generations")
		}
	}
}

// restoredEvent names an assembled restore by what it took: decode when
// it decoded, restore_peer when it fetched, else ev (restore_local, or
// restore_persistent whatever it took).
func restoredEvent(ev string, st *restore.Stats) string {
	if ev == event.RestorePersistent {
		return ev
	}
	switch {
	case st.Decoded.Load() > 0:
		return event.Decode
	case st.Peer.Load() > 0:
		return event.RestorePeer
	}
	return ev
}

// logRestored writes the restore event of an assembled restore.
func logRestored(log zerolog.Logger, ev string, rank int, p *restore.Plan, st *restore.Stats, d time.Duration, fb fallback) {
	total := st.Local.Load() + st.Peer.Load() + st.Decoded.Load()
	line := log.Info().Str("event", ev).Int("rank", rank).Int64("generation", p.Step).Int64("bytes", total).
		Int64("local_bytes", st.Local.Load()).Int64("peer_bytes", st.Peer.Load()).Int64("decoded_bytes", st.Decoded.Load()).
		Strs("peers", st.Peers()).Str("sources", p.Sources()).Int64("failovers", st.Failovers.Load()).Dur("duration", d).
		Float64("rate_mb_s", float64(total)/1e6/max(d.Seconds(), 1e-9))
	if fb.reason != "" {
		line = line.Str("reason", fb.reason).Interface("lost_shards", fb.lost)
	}
	line.Msg("restore assembled from the sharding group")
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
func (rs *restorer) loadPersisted(si *shard.Geometry, step int64, log zerolog.Logger) (*restore.Plan, error) {
	if rs.persist == nil {
		return nil, errors.New("persistent checkpoints are off for this job (persist= in --reft), so the state is lost: train again from the start or from your own checkpoint")
	}
	steps := rs.persistedSteps(si, log)
	if step >= 0 {
		steps = slices.DeleteFunc(steps, func(x int64) bool { return x != step })
	}
	if len(steps) == 0 {
		return nil, fmt.Errorf("and the persistent directory %s has no step that every member (ranks %s) wrote", rs.persist.Dir(), strings.Join(intStrings(si.Members), ","))
	}
	st := steps[0]
	loaded, ring, err := loadMembers(rs.persist, si, st)
	if err != nil {
		return nil, err
	}
	if ring == nil {
		ring = si.DPOrder()
	}
	si, err = si.WithRing(ring)
	if err != nil {
		return nil, err
	}
	return persistedPlan(si, st, loaded), nil
}

// loadMembers loads every member's (and the rank's own) persisted
// generation of step into this node's store, under the restoring rank's
// transient key, and returns where each is and the ring they were saved
// on (nil: none recorded).
func loadMembers(per *persist.Persister, si *shard.Geometry, step int64) (loaded map[int]restore.Loc, ring []int, err error) {
	loaded = map[int]restore.Loc{}
	for _, r := range append(slices.Clone(si.Members), si.Rank) {
		if _, ok := loaded[r]; ok {
			continue
		}
		gens, err := per.Generations(r)
		if err != nil {
			return nil, nil, err
		}
		i := slices.IndexFunc(gens, func(g persist.Generation) bool { return g.Step == step })
		if i < 0 {
			return nil, nil, fmt.Errorf("rank %d has no persisted step %d", r, step)
		}
		key := tmpfs.Key{Rank: r, Shard: persistedKey(si.Rank)}
		g, err := per.Load(gens[i], key, manifestSpec(&gens[i].Manifest))
		if err != nil {
			return nil, nil, err
		}
		loaded[r] = restore.Loc{Key: peer.GenKey{Rank: r, Shard: key.Shard, Step: g.Step, Seq: g.Seq}, Ring: g.Manifest.Ring}
		if rg := g.Manifest.Ring; rg != nil && ring != nil && !slices.Equal(rg, ring) {
			return nil, nil, fmt.Errorf("the members persisted step %d on different rings (%v and %v): their agents did not agree, so the shards do not fit together", step, ring, rg)
		} else if rg != nil {
			ring = rg
		}
	}
	return loaded, ring, nil
}

// persistedPlan is the restore plan of step from the loaded persisted
// generations: every shard, the whole buffers, the AOR state and the
// others from the persistent source.
func persistedPlan(si *shard.Geometry, step int64, loaded map[int]restore.Loc) *restore.Plan {
	p := &restore.Plan{Step: step, OK: true, Ring: si.Members, Parity: make([][]restore.Cand, si.M)}
	for q, r := range si.Members {
		src := restore.ShardSource{Pos: q, Rank: r, Source: sg.SourcePersistent, Cands: []restore.Cand{{Loc: loaded[r], Sec: secShard}}}
		p.Shards = append(p.Shards, src)
	}
	p.Loaded = loaded
	if si.Whole {
		p.Whole = []restore.Cand{{Loc: loaded[si.Rank]}}
	}
	if si.AOR != nil {
		p.Opt, p.OptSource = map[string][]restore.Cand{}, sg.SourcePersistent
		for _, name := range si.AOR.StateNames() {
			p.Opt[name] = []restore.Cand{{Loc: loaded[si.Rank], Sec: name}}
		}
	}
	if len(si.Other) > 0 {
		p.Others = []restore.Cand{{Loc: loaded[si.Rank]}}
	}
	return p
}

// assemble writes the plan's state into a fresh generation of the rank's
// restore key: the arena's sections are handed to the Assembler, and every
// chunk verified on the way.
func (rs *restorer) assemble(ctx context.Context, rc *rankConn, si *shard.Geometry, p *restore.Plan, asm *restore.Assembler) (tmpfs.Generation, error) {
	spec, err := si.RestoreSpec(rc.spec.Sources, rs.store.ChunkSize())
	if err != nil {
		return tmpfs.Generation{}, err
	}
	spec.Step = p.Step
	o, err := rs.store.Begin(tmpfs.Key{Rank: si.Rank, Shard: restoreShard}, spec)
	if err != nil {
		return tmpfs.Generation{}, fmt.Errorf("an arena for the assembled state: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			o.Abort()
		}
	}()
	t, err := restoreTarget(si, o)
	if err != nil {
		return tmpfs.Generation{}, err
	}
	if err := asm.Assemble(ctx, p, t); err != nil {
		return tmpfs.Generation{}, err
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

// restoreTarget is the assembly's view of o, an arena laid out by
// RestoreSpec: the slice, its shards and buffers, the unreplicated
// buffers, and the decoder.
func restoreTarget(si *shard.Geometry, o *tmpfs.Ongoing) (restore.Target, error) {
	rep, err := o.Buffer(secRep)
	if err != nil {
		return restore.Target{}, err
	}
	t := restore.Target{Rep: rep, Whole: si.Whole, Decoder: si.Decoder}
	for q := range si.M {
		t.Shards = append(t.Shards, si.Shard(q))
	}
	for _, b := range si.Slice {
		t.Replicated = append(t.Replicated, restore.Section{Name: b.Name, Off: b.Off, Size: b.Size})
	}
	for _, b := range si.Other {
		dst, err := o.Buffer(b.Name)
		if err != nil {
			return restore.Target{}, err
		}
		_, isAOR := si.AOR.StateOf(b.Name)
		t.Others = append(t.Others, restore.Other{Name: b.Name, Dst: dst, AOR: isAOR})
	}
	if si.EL != nil {
		t.ParitySize = si.EL.ParitySize()
	}
	return t, nil
}

// parityBytes is what a plan fetches besides the state itself: the
// parity units its decode reads.
func parityBytes(si *shard.Geometry, p *restore.Plan) int64 {
	if len(p.Decode) == 0 {
		return 0
	}
	var n int64
	for q := range si.M {
		if !slices.Contains(p.Decode, q) && len(p.Parity[q]) > 0 {
			n += int64(si.EL.ParitySize())
		}
	}
	return n
}

// assembler is this node's restore.Assembler: its store, its mesh (waited
// for up to gatherWait; nil while peering is off), each peer's lookups
// bounded by gatherWait. st and prog may be nil (a read nobody reports).
func (rs *restorer) assembler(st *restore.Stats, prog *restoreProgress, log zerolog.Logger) *restore.Assembler {
	a := &restore.Assembler{Local: restore.StoreLocal{Store: rs.store}, AskTimeout: gatherWait, Log: log, Stats: st}
	a.Peers = func(ctx context.Context) restore.Peers {
		if m := rs.waitMesh(ctx); m != nil {
			return m // not a nil *mesh.Mesh in a non-nil interface
		}
		return nil
	}
	if prog != nil {
		a.Progress = prog.add
	}
	return a
}

// fetchInto fills dst with a section that each candidate holds whole
// (restore.Assembler.Fetch), uncounted and logged to the server's log.
func (rs *restorer) fetchInto(ctx context.Context, dst []byte, cands []restore.Cand) error {
	return rs.assembler(nil, nil, rs.log).Fetch(ctx, dst, cands)
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
