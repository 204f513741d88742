package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/agent/mesh"
	"github.com/reft-hpc/reft/agent/metrics"
	"github.com/reft-hpc/reft/agent/netsched"
	"github.com/reft-hpc/reft/agent/peer"
	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/agent/sg"
	"github.com/reft-hpc/reft/agent/shard"
	"github.com/reft-hpc/reft/tmpfs"
)

// Background replication of unreplicated buffers (GEMINI, sections 4-5).
//
// Under the sharded layout a rank's unreplicated buffers that AOR does not
// cover (ZeRO-1 moments without aor, TP/PP slices, RNG state) live only in
// its own generation. After each such generation commits, the owner's
// agent pushes a `replicate` request (docs/PEER_PROTOCOL.md) to its node's
// placement peers: the placement `reft explain` prints (sg.Model), that is
// sg.PlaceSpread over the nodes that host ranks (spares keep no copies),
// in allocation order spread across the failure domains of [topology],
// with the SPEC's tolerance as the number of peer copies (at least one).
// Which nodes host ranks the agents say themselves (rankHosts). Each
// peer copies the sections with background fetches into its own store
// under (rank, replicaShard) and commits them atomically, so a replica is
// always one whole committed generation of the owner, possibly older than
// the owner's newest. The store's retention keeps the newest replica and
// releases the previous one only after a newer one commits.
//
// Push, not watermark polling: only the owner knows which sections need a
// copy (the peer transport does not carry registrations), the copy starts
// as soon as the generation exists, and an idle job costs nothing. A
// request that is lost (the peer restarting) is made good by the next
// commit's; requests for one rank that arrive while its copy runs replace
// each other, so a slow peer skips steps instead of queueing them.
//
// The traffic is paced by one peer.Limiter per agent (reft.toml [protect]),
// on both ends of every fetch, and scheduled around the local ranks'
// communication phases (the `comm` message) by [protect]
// background_schedule: "paused" (the default) stops it while any rank is
// in a phase; "idle" learns the node's communication timeline and admits
// a chunk only if it fits the predicted idle span (agent/netsched, the
// limiter's gate); "unscheduled" ignores the phases.

// replicaShard is the store key's shard of the replicas a node keeps of
// other nodes' ranks.
const replicaShard = shard.Replica

// replicaWindow is how many chunks a background fetch keeps in flight:
// few, so that a pause stops the network within a couple of chunks.
const replicaWindow = 2

// replicator is the agent's side of background replication: the requests
// it sends as an owner and the copies it makes as a placement peer.
//
// Its methods are safe for concurrent use: the connections' goroutines
// announce commits and report communication phases, the peer transport's
// goroutines hand it requests, and its own goroutines (sendLoop, copyLoop,
// started under mu, waited for by stop) send and copy. mu guards the
// pending work, the phase count and the schedule; no method holds it
// across a network call. It reads what was attached, the rings and the
// rank map, and invalidates the views after a copy; it never calls back
// into the Server.
type replicator struct {
	*attached
	rings  *rings
	views  *views
	met    *metrics.Recorder
	log    zerolog.Logger
	warned *onceWarnings // shared with the snapshot service
	lim    *peer.Limiter

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu   sync.Mutex
	out  map[int]*pendingOut // owner side, per local rank
	in   map[int]*pendingIn  // peer side, per owner rank
	comm int                 // connections in a communication phase
	// policy is [protect] background_schedule; sched its schedule
	// ("idle" only), fed the node's phase changes under mu.
	policy string
	sched  *netsched.Scheduler

	hosts  *rankHosts // where the job's ranks run, for the placement
	placed string     // the placement last logged (replica_placement)

	// Counters, for the status and the tests.
	requested   atomic.Int64 // replicate requests received
	pausedWaits atomic.Int64 // copies that found the limiter paused before a section
	fetching    atomic.Int64 // sections whose fetch started
	committed   atomic.Int64 // replicas committed
	statsLogged atomic.Bool  // replication_schedule_stats said
}

type pendingOut struct {
	next    *peer.ReplicateRequest // the newest commit not yet announced
	copies  int
	world   int
	running bool
}

type pendingIn struct {
	next    *replicaReq
	running bool
}

type replicaReq struct {
	from string
	req  peer.ReplicateRequest
}

func newReplicator(a *attached, rg *rings, vs *views, hosts *rankHosts, warned *onceWarnings, met *metrics.Recorder, log zerolog.Logger) *replicator {
	d := config.Default().Protect
	r := &replicator{attached: a, rings: rg, views: vs, hosts: hosts, warned: warned, met: met, log: log, lim: peer.NewLimiter(int64(d.BackgroundRate), int64(d.BackgroundBurst)),
		out: map[int]*pendingOut{}, in: map[int]*pendingIn{}, policy: d.BackgroundSchedule}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	return r
}

// stop cancels the copies and requests in flight and waits for them (the
// store must outlive them), and logs what the idle-span schedule did.
func (r *replicator) stop() {
	r.mu.Lock() // no goroutine starts after this: they start under mu, after checking ctx
	r.cancel()
	sched := r.sched
	r.mu.Unlock()
	r.wg.Wait()
	if sched != nil && r.statsLogged.CompareAndSwap(false, true) { // the server stops it more than once
		logSchedStats(r.log.Info(), sched.Stats()).Str("event", "replication_schedule_stats").
			Msg("what the idle-span schedule of background replication did")
	}
}

// schedMetrics adds the idle-span schedule's counts to the status reply's
// metrics section m (nil: none).
func (r *replicator) schedMetrics(m *proto.Metrics) *proto.Metrics {
	r.mu.Lock()
	sched := r.sched
	r.mu.Unlock()
	if m == nil || sched == nil {
		return m
	}
	st := sched.Stats()
	m.ReplicationSchedule = &proto.ReplicationSchedule{Chunks: uint64(st.Chunks), Unplanned: uint64(st.Unplanned), Oversize: uint64(st.Oversize),
		SpansSkipped: uint64(st.Skipped), PhasesOverrun: uint64(st.Overran), Reprofiles: uint64(st.Reprofiles)}
	return m
}

func logSchedStats(e *zerolog.Event, st netsched.Stats) *zerolog.Event {
	return e.Bool("profiled", st.Profiled).Float64("bandwidth_bytes_per_s", st.Bandwidth).
		Int64("chunks_in_idle_spans", st.Chunks).Int64("bytes_in_idle_spans", st.Bytes).
		Int64("chunks_unplanned", st.Unplanned).Int64("idle_spans_skipped", st.Skipped).
		Int64("phases_overrun", st.Overran).Int64("chunks_oversize", st.Oversize).Int64("reprofiles", st.Reprofiles)
}

// setSchedule sets [protect] background_schedule (config.Schedule*);
// rate, the configured background rate (0: unlimited), is the idle
// schedule's bandwidth until one is measured; link, [protect]
// link_bandwidth, when set, is its bandwidth for good. Call it before
// peering starts.
func (r *replicator) setSchedule(policy string, rate, link int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch policy {
	case config.SchedulePaused, config.ScheduleUnscheduled:
		r.sched = nil
		r.lim.SetGate(nil)
	case config.ScheduleIdle:
		c := netsched.Config{Bandwidth: float64(rate)}
		if link > 0 {
			c.Bandwidth, c.FixedBandwidth = float64(link), true
		}
		r.sched = netsched.New(c)
		r.lim.SetGate(r.sched)
	default:
		return fmt.Errorf("background replication schedule %q: want %q, %q or %q", policy, config.SchedulePaused, config.ScheduleIdle, config.ScheduleUnscheduled)
	}
	if r.comm > 0 && policy != config.SchedulePaused {
		r.lim.Resume()
	} else if r.comm > 0 {
		r.lim.Pause()
	}
	r.policy = policy
	return nil
}

// SetBackground sets the pace (background_rate, 0: unlimited;
// background_burst) and the schedule (background_schedule) of background
// replication from reft.toml [protect]. Call it before peering starts.
func (s *Server) SetBackground(p config.Protect) error {
	s.repl.lim.SetRate(int64(p.BackgroundRate), int64(p.BackgroundBurst))
	return s.repl.setSchedule(p.BackgroundSchedule, int64(p.BackgroundRate), int64(p.LinkBandwidth))
}

// PeerHooks fills what the peer transport needs from the server: the
// background limiter and the handler of replicate requests. Call it on the
// mesh's peer.Config before the mesh starts.
func (s *Server) PeerHooks(pc *peer.Config) {
	pc.Background = s.repl.lim
	pc.Replicate = s.repl.receive
}

// commPhase records that connection rc entered (active) or left a
// communication phase; background replication pauses while any has.
func (r *replicator) commPhase(rc *rankConn, active bool, log zerolog.Logger) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rc.comm == active {
		return
	}
	rc.comm = active
	if active {
		r.comm++
		if r.comm == 1 {
			r.nodePhase(true, rc.key.Rank, log)
		}
		return
	}
	r.comm--
	if r.comm == 0 {
		r.nodePhase(false, rc.key.Rank, log)
	}
}

// nodePhase applies the schedule to the node entering (active) or
// leaving its communication phase (the first rank in, the last out).
// Called under mu, so the scheduler sees the changes in order.
func (r *replicator) nodePhase(active bool, rank int, log zerolog.Logger) {
	switch r.policy {
	case config.SchedulePaused:
		if active {
			r.lim.Pause()
			log.Trace().Str("event", "background_paused").Int("rank", rank).Msg("a communication phase began: background replication paused")
		} else {
			r.lim.Resume()
			log.Trace().Str("event", "background_resumed").Int("rank", rank).Msg("communication phases ended: background replication resumed")
		}
	case config.ScheduleIdle:
		ev := r.sched.Comm(time.Now(), active)
		switch ev.Kind {
		case netsched.Learned:
			logSchedStats(log.Info(), r.sched.Stats()).Str("event", "replication_schedule_learned").Stringer("profile", ev.Profile).
				Msgf("learned the job's communication timeline (%s): background replication now sends only chunks that fit its idle spans", ev.Profile)
		case netsched.Reprofiled:
			logSchedStats(log.Info(), r.sched.Stats()).Str("event", "replication_schedule_reprofile").Dur("profiled_step", ev.Profile.Step).
				Dur("measured_step", ev.Measured).Float64("change", ev.Change()).
				Msgf("the step time changed by %+.0f%% (%s -> %s): learning the communication timeline again; meanwhile background replication pauses only during phases",
					100*ev.Change(), ev.Profile.Step, ev.Measured)
		}
	}
}

// onceWarnings are the warnings said once: a degraded mode is said once
// and why, its repeats go to debug. Safe for concurrent use.
type onceWarnings struct {
	seen sync.Map // key -> true
}

// warn logs a warning the first time key is seen, later ones at debug.
func (w *onceWarnings) warn(log zerolog.Logger, key string) *zerolog.Event {
	if _, seen := w.seen.LoadOrStore(key, true); seen {
		return log.Debug()
	}
	return log.Warn()
}

// holders are the nodes that keep copies of self's placed state: GEMINI
// placement as reft explain computes it (sg.Model.Placement), over the
// nodes of alloc (allocation order) that host ranks, spread across the
// failure domains dom (sg.PlaceSpread), with copies cut to the nodes there
// are. hosting nil counts every node of alloc (the placement while the
// rank map is incomplete).
func holders(alloc []string, hosting map[string]bool, dom map[string]string, self string, copies int) ([]string, sg.Placement, error) {
	var names []string
	for _, n := range alloc {
		if hosting == nil || hosting[n] {
			names = append(names, n)
		}
	}
	if !slices.Contains(names, self) {
		return nil, sg.Placement{}, fmt.Errorf("this node (%s) is not among the nodes that host the job's ranks (%s)", self, strings.Join(names, ","))
	}
	if len(names) < 2 {
		return nil, sg.Placement{}, fmt.Errorf("the job's ranks run on %d node(s): no other node can keep a copy", len(names))
	}
	p, err := sg.PlaceSpread(names, dom, min(copies, len(names)-1)+1)
	if err != nil {
		return nil, sg.Placement{}, err
	}
	return p.Holders[self], p, nil
}

// rankHosts is where the job's ranks run, as their agents report them
// (the hosted ranks of watermarks replies, as for rings): a node with no
// rank (a spare) keeps no copies, as in reft explain.
type rankHosts struct {
	mu       sync.Mutex
	nodes    map[int]string // rank -> node
	searched time.Time      // the last search of the job's agents
	waited   bool           // the first bounded wait for a full map is over
}

// hostsSearchPace spaces the searches for ranks not found yet.
const hostsSearchPace = time.Second

// note records that rank runs on node (ring searches learn it too).
func (h *rankHosts) note(rank int, node string) {
	h.mu.Lock()
	if h.nodes == nil {
		h.nodes = map[int]string{}
	}
	h.nodes[rank] = node
	h.mu.Unlock()
}

// forget drops the map: ranks may move when a job is relaunched, which a
// restore follows.
func (h *rankHosts) forget() {
	h.mu.Lock()
	h.nodes, h.searched, h.waited = nil, time.Time{}, false
	h.mu.Unlock()
}

// missing lists the ranks below world not in the map.
func (h *rankHosts) missing(world int) []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []int
	for r := range world {
		if h.nodes[r] == "" {
			out = append(out, r)
		}
	}
	return out
}

// hosting returns the nodes that host the job's ranks, searching the
// job's agents for ranks it has not found. The first time it waits (at
// most ringWait) for every rank to register; later it searches at most
// once per hostsSearchPace. missing lists the ranks not found, and why
// the agents that did not answer.
func (r *replicator) hosting(m *mesh.Mesh, world int) (nodes map[string]bool, missing []int, why string) {
	for _, h := range r.rings.Hosted(nil) {
		r.hosts.note(h.Rank, r.info.Node)
	}
	wait := r.rings.waitFor()
	deadline := time.Now().Add(wait)
	for {
		missing = r.hosts.missing(world)
		if len(missing) == 0 {
			break
		}
		r.hosts.mu.Lock()
		due := time.Since(r.hosts.searched) >= hostsSearchPace || !r.hosts.waited
		first := !r.hosts.waited
		r.hosts.mu.Unlock()
		if !due {
			break
		}
		why = r.hosts.search(r.ctx, m, missing)
		r.hosts.mu.Lock()
		r.hosts.searched = time.Now()
		r.hosts.mu.Unlock()
		if len(r.hosts.missing(world)) == 0 || !first || time.Now().After(deadline) || r.ctx.Err() != nil {
			r.hosts.mu.Lock()
			r.hosts.waited = true
			r.hosts.mu.Unlock()
			missing = r.hosts.missing(world)
			break
		}
		select {
		case <-r.ctx.Done():
		case <-time.After(ringPoll):
		}
	}
	r.hosts.mu.Lock()
	defer r.hosts.mu.Unlock()
	nodes = map[string]bool{}
	for rank, n := range r.hosts.nodes {
		if rank < world {
			nodes[n] = true
		}
	}
	return nodes, missing, why
}

// search asks the job's other agents which of the missing ranks run on
// their nodes (a node may host found ranks and missing ones), within ctx;
// it returns why some did not answer.
func (h *rankHosts) search(ctx context.Context, m *mesh.Mesh, missing []int) string {
	whys := askOthers(ctx, m, missing, func(node string, rep *peer.WatermarksReply) {
		for _, hr := range rep.Hosted {
			if slices.Contains(missing, hr.Rank) {
				h.note(hr.Rank, node)
			}
		}
	})
	return strings.Join(whys, "; ")
}

// askOthers asks every other agent of the job, at once and each within
// gatherWait, for its watermarks of ranks, and hands each reply to got
// (called concurrently). It returns why the agents that did not answer
// did not, sorted.
func askOthers(ctx context.Context, m *mesh.Mesh, ranks []int, got func(node string, rep *peer.WatermarksReply)) []string {
	var mu sync.Mutex
	var whys []string
	var wg sync.WaitGroup
	for _, n := range m.Nodes() {
		if n.Name == m.Self().Name {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, gatherWait)
			defer cancel()
			rep, err := m.Watermarks(cctx, n.Name, ranks)
			if err != nil {
				mu.Lock()
				whys = append(whys, fmt.Sprintf("%s: %v", n.Name, err))
				mu.Unlock()
				return
			}
			got(n.Name, rep)
		}()
	}
	wg.Wait()
	sort.Strings(whys)
	return whys
}

// placement returns this node's placement peers for the state of a rank
// of a job of world ranks, logging the placement when it changes.
func (r *replicator) placement(m *mesh.Mesh, world, copies int, log zerolog.Logger) ([]string, error) {
	var alloc []string
	for _, n := range m.Nodes() {
		alloc = append(alloc, n.Name)
	}
	hosting, missing, why := r.hosting(m, world)
	if len(missing) > 0 {
		reason := fmt.Sprintf("ranks %s are not registered with any agent that answered", strings.Join(intStrings(missing), ","))
		if why != "" {
			reason += " (" + why + ")"
		}
		r.warned.warn(log, "place:partial").Str("event", "replica_placement_partial").Ints("missing_ranks", missing).Str("reason", reason).
			Msg("placing the copies of unreplicated buffers over all the job's nodes, spares included, until every rank's node is known: reft explain's placement needs the rank-to-node map")
		hosting = nil
	}
	var names []string
	for _, n := range alloc {
		if hosting == nil || hosting[n] {
			names = append(names, n)
		}
	}
	dom, err := r.rings.topo.DomainsOf(names)
	if err != nil {
		r.warned.warn(log, "place:domains").Str("event", "replica_placement_domains").Err(err).
			Msg("the failure domains in reft.toml do not work: copies of unreplicated buffers are placed without them")
		dom = nil
	}
	hs, p, err := holders(alloc, hosting, dom, m.Self().Name, copies)
	if err != nil {
		return nil, err
	}
	key := fmt.Sprint(names, p.Replicas, hs, p.Groups, p.Ring)
	r.mu.Lock()
	changed := key != r.placed
	r.placed = key
	r.mu.Unlock()
	if changed {
		log.Info().Str("event", "replica_placement").Strs("nodes", names).Str("strategy", p.Strategy).Int("replicas", p.Replicas).
			Strs("holders", hs).Interface("groups", p.Groups).Strs("ring", p.Ring).
			Msgf("copies of this node's unreplicated buffers go to %s (GEMINI %s placement over the nodes that host ranks, as reft explain prints)", strings.Join(hs, ","), p.Strategy)
	}
	return hs, nil
}

// announce queues generation g of a rank for its placement peers; it
// never blocks the commit.
func (r *replicator) announce(rc *rankConn, g tmpfs.Generation, log zerolog.Logger) {
	secs := rc.sg.Placed()
	if len(secs) == 0 {
		return
	}
	req := &peer.ReplicateRequest{GenKey: peer.GenKey{Rank: g.Key.Rank, Shard: g.Key.Shard, Step: g.Step, Seq: g.Seq}, Sections: secs}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ctx.Err() != nil {
		return
	}
	po := r.out[g.Key.Rank]
	if po == nil {
		po = &pendingOut{}
		r.out[g.Key.Rank] = po
	}
	po.next, po.copies, po.world = req, rc.sg.Copies(), rc.sg.World
	if po.running {
		return
	}
	po.running = true
	r.wg.Add(1)
	go r.sendLoop(po, log)
}

// sendLoop announces a rank's newest commit until none is pending.
func (r *replicator) sendLoop(po *pendingOut, log zerolog.Logger) {
	defer r.wg.Done()
	for {
		r.mu.Lock()
		req, copies, world := po.next, po.copies, po.world
		po.next = nil
		if req == nil || r.ctx.Err() != nil {
			po.running = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		r.send(*req, copies, world, log)
	}
}

// send tells every placement peer of this node about req.
func (r *replicator) send(req peer.ReplicateRequest, copies, world int, log zerolog.Logger) {
	m := r.meshNow()
	if m == nil {
		r.warned.warn(log, "send:nomesh").Str("event", "replica_off").Int("rank", req.Rank).
			Msg("background replication waits for peering (status says why it is not on): the rank's unreplicated buffers have no peer copy yet")
		return
	}
	hs, err := r.placement(m, world, copies, log)
	if err != nil {
		r.warned.warn(log, "send:place").Str("event", "replica_off").Err(err).Int("rank", req.Rank).
			Msg("background replication is off: a lost node's unreplicated buffers come only from the persistent tier")
		return
	}
	var wg sync.WaitGroup
	for _, h := range hs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(r.ctx, gatherWait)
			defer cancel()
			if err := m.Replicate(ctx, h, req); err != nil && r.ctx.Err() == nil {
				r.warned.warn(log, "send:"+h+":"+causeOf(err)).Str("event", "replica_request_failed").Str("holder", h).
					Int("rank", req.Rank).Int64("step", req.Step).Err(err).
					Msg("a placement peer did not take a replicate request: its copy of the rank's unreplicated buffers lags until a later commit reaches it")
			}
		}()
	}
	wg.Wait()
}

// causeOf is a short key of an error, for saying each kind once.
func causeOf(err error) string {
	var pe *peer.Error
	if errors.As(err, &pe) {
		return pe.Code
	}
	var ce *peer.ConnError
	if errors.As(err, &ce) {
		return "conn"
	}
	return "other"
}

// receive is the peer transport's replicate handler: it queues the request
// and returns at once.
func (r *replicator) receive(from string, req peer.ReplicateRequest) error {
	switch {
	case r.store == nil:
		return errors.New("this agent has no snapshot store")
	case from == "":
		return errors.New("the requesting agent did not name its node")
	case req.Shard != tmpfs.DefaultShard || req.Rank < 0 || req.Step < 0:
		return fmt.Errorf("%s is not a rank's generation", req.GenKey)
	case len(req.Sections) == 0:
		return errors.New("no sections to copy")
	}
	for _, sec := range req.Sections {
		if sec == "" || strings.Contains(sec, "@") {
			return fmt.Errorf("section %q is not an unreplicated buffer", sec)
		}
	}
	r.requested.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ctx.Err() != nil {
		return errors.New("this agent is stopping")
	}
	pi := r.in[req.Rank]
	if pi == nil {
		pi = &pendingIn{}
		r.in[req.Rank] = pi
	}
	pi.next = &replicaReq{from: from, req: req}
	if !pi.running {
		pi.running = true
		r.wg.Add(1)
		go r.copyLoop(pi)
	}
	return nil
}

// copyLoop copies a rank's newest requested generation until none is
// pending.
func (r *replicator) copyLoop(pi *pendingIn) {
	defer r.wg.Done()
	log := r.log
	for {
		r.mu.Lock()
		rq := pi.next
		pi.next = nil
		if rq == nil || r.ctx.Err() != nil {
			pi.running = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		t0 := time.Now()
		g, err := r.copy(rq)
		switch {
		case err == nil:
			r.committed.Add(1)
			r.met.Replicated(payloadBytes(g.Manifest.Buffers), time.Since(t0).Seconds())
			r.views.invalidate()
			log.Debug().Str("event", "replica_committed").Int("rank", g.Key.Rank).Int64("step", g.Step).Str("owner", rq.from).
				Int64("bytes", payloadBytes(g.Manifest.Buffers)).Dur("duration", time.Since(t0)).Msg("replica of a rank's unreplicated buffers committed")
		case r.ctx.Err() != nil:
		case errors.Is(err, peer.ErrNotFound):
			// The owner released that generation while we were busy: the
			// next request names a newer one.
			log.Debug().Str("event", "replica_skipped").Int("rank", rq.req.Rank).Int64("step", rq.req.Step).Str("owner", rq.from).Err(err).
				Msg("the owner no longer has the generation to replicate")
		default:
			r.warned.warn(log, "copy:"+rq.from+":"+causeOf(err)).Str("event", "replica_failed").Int("rank", rq.req.Rank).Int64("step", rq.req.Step).
				Str("owner", rq.from).Err(err).Msg("copying a rank's unreplicated buffers failed; the previous replica stays, and the next commit tries again")
		}
	}
}

// replicaSpec is the replica generation's spec for rq: the requested
// sections of the owner's generation info, their buffers there, and
// their total size.
func replicaSpec(rq *replicaReq, info *peer.GenInfo) (tmpfs.Spec, []*peer.BufferInfo, int64, error) {
	spec := tmpfs.Spec{Step: rq.req.Step, ChunkSize: info.ChunkSize,
		Layout: fmt.Sprintf("reft-replica rank=%d step=%d seq=%d node=%s", rq.req.Rank, rq.req.Step, rq.req.Seq, rq.from)}
	bufs := make([]*peer.BufferInfo, len(rq.req.Sections))
	var size int64
	for i, sec := range rq.req.Sections {
		if bufs[i] = info.Buffer(sec); bufs[i] == nil {
			return spec, nil, 0, fmt.Errorf("%s on %s has no section %q (the owner's registration changed?)", rq.req.GenKey, rq.from, sec)
		}
		spec.Buffers = append(spec.Buffers, tmpfs.BufferSpec{Name: sec, Size: bufs[i].Size})
		size += bufs[i].Size
	}
	return spec, bufs, size, nil
}

// fetchSection fetches the owner's section b into the replica o (in the
// background class, after any communication phase), and sets the
// checksums every chunk was verified against on arrival.
func (r *replicator) fetchSection(ctx context.Context, m *mesh.Mesh, rq *replicaReq, chunkSize int64, b *peer.BufferInfo, o *tmpfs.Ongoing) error {
	dst, err := o.Buffer(b.Name)
	if err != nil {
		return err
	}
	if len(dst) > 0 {
		if err := r.waitResume(ctx); err != nil {
			return err
		}
		src, err := m.Source(ctx, rq.from, peer.ChunkKey{GenKey: rq.req.GenKey, Buffer: b.Name})
		if err != nil {
			return err
		}
		r.fetching.Add(1)
		if _, err := m.Fetch(ctx, peer.FetchSpec{ChunkSize: chunkSize, Size: b.Size, CRC: b.CRC32C, Dst: dst,
			Sources: []peer.Source{src}, Background: true, Window: replicaWindow * chunkSize}); err != nil {
			return fmt.Errorf("section %s: %w", b.Name, err)
		}
	}
	return o.SetChecksums(b.Name, b.CRC32C)
}

// copy fetches the request's sections into a new replica generation and
// commits it.
func (r *replicator) copy(rq *replicaReq) (tmpfs.Generation, error) {
	m := r.meshNow()
	if m == nil {
		return tmpfs.Generation{}, errors.New("peering is off")
	}
	ctx := r.ctx
	if err := r.waitResume(ctx); err != nil {
		return tmpfs.Generation{}, err
	}
	cctx, cancel := context.WithTimeout(ctx, gatherWait)
	info, err := m.Manifest(cctx, rq.from, rq.req.GenKey)
	cancel()
	if err != nil {
		return tmpfs.Generation{}, fmt.Errorf("manifest of %s on %s: %w", rq.req.GenKey, rq.from, err)
	}
	spec, bufs, size, err := replicaSpec(rq, info)
	if err != nil {
		return tmpfs.Generation{}, err
	}
	o, err := r.store.Begin(tmpfs.Key{Rank: rq.req.Rank, Shard: replicaShard}, spec)
	if err != nil {
		return tmpfs.Generation{}, fmt.Errorf("an arena for the replica of rank %d (%d bytes; the job's memory budget on this node holds the replicas too): %w", rq.req.Rank, size, err)
	}
	ok := false
	defer func() {
		if !ok {
			o.Abort()
		}
	}()
	for _, b := range bufs {
		if err := r.fetchSection(ctx, m, rq, info.ChunkSize, b, o); err != nil {
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

// waitResume blocks while the limiter is paused, so that a copy starts no
// new section during a communication phase (the fetch itself is paced per
// chunk).
func (r *replicator) waitResume(ctx context.Context) error {
	if r.lim.Paused() {
		r.pausedWaits.Add(1)
	}
	return r.lim.Wait(ctx, netsched.Inbound, 0)
}
