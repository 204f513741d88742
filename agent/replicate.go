package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/agent/mesh"
	"github.com/reft-hpc/reft/agent/peer"
	"github.com/reft-hpc/reft/agent/sg"
	"github.com/reft-hpc/reft/tmpfs"
)

// Background replication of unreplicated buffers (GEMINI, sections 4-5).
//
// Under the sharded layout a rank's unreplicated buffers that AOR does not
// cover (ZeRO-1 moments without aor, TP/PP slices, RNG state) live only in
// its own generation. After each such generation commits, the owner's
// agent pushes a `replicate` request (docs/PEER_PROTOCOL.md) to its node's
// placement peers: sg.Place over the job's nodes in allocation order, with
// the SPEC's tolerance as the number of peer copies (at least one). Each
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
// on both ends of every fetch, and paused while any local rank reports a
// communication phase (the `comm` message): replication fills the gaps
// between the trainer's collectives.

// replicaShard is the store key's shard of the replicas a node keeps of
// other nodes' ranks.
const replicaShard = "replica"

// replicaWindow is how many chunks a background fetch keeps in flight:
// few, so that a pause stops the network within a couple of chunks.
const replicaWindow = 2

// replicator is the agent's side of background replication: the requests
// it sends as an owner and the copies it makes as a placement peer.
type replicator struct {
	s   *Server
	lim *peer.Limiter

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu   sync.Mutex
	out  map[int]*pendingOut // owner side, per local rank
	in   map[int]*pendingIn  // peer side, per owner rank
	comm int                 // connections in a communication phase
	once sync.Map            // warnings said once, by key

	// Counters, for the status and the tests.
	requested   atomic.Int64 // replicate requests received
	pausedWaits atomic.Int64 // copies that found the limiter paused before a section
	fetching    atomic.Int64 // sections whose fetch started
	committed   atomic.Int64 // replicas committed
}

type pendingOut struct {
	next    *peer.ReplicateRequest // the newest commit not yet announced
	copies  int
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

func newReplicator(s *Server) *replicator {
	d := config.Default().Protect
	r := &replicator{s: s, lim: peer.NewLimiter(int64(d.BackgroundRate), int64(d.BackgroundBurst)),
		out: map[int]*pendingOut{}, in: map[int]*pendingIn{}}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	return r
}

// stop cancels the copies and requests in flight and waits for them (the
// store must outlive them).
func (r *replicator) stop() {
	r.mu.Lock() // no goroutine starts after this: they start under mu, after checking ctx
	r.cancel()
	r.mu.Unlock()
	r.wg.Wait()
}

// SetBackgroundRate sets the pace of background replication (reft.toml
// [protect]); rate 0 is unlimited.
func (s *Server) SetBackgroundRate(rate, burst int64) { s.repl.lim.SetRate(rate, burst) }

// PeerHooks fills what the peer transport needs from the server: the
// background limiter and the handler of replicate requests. Call it on the
// mesh's peer.Config before the mesh starts.
func (s *Server) PeerHooks(pc *peer.Config) {
	pc.Background = s.repl.lim
	pc.Replicate = s.repl.receive
}

// commPhase records that connection rc entered (active) or left a
// communication phase; background replication pauses while any has.
func (s *Server) commPhase(rc *rankConn, active bool, log zerolog.Logger) {
	r := s.repl
	r.mu.Lock()
	defer r.mu.Unlock()
	if rc.comm == active {
		return
	}
	rc.comm = active
	if active {
		r.comm++
		if r.comm == 1 {
			r.lim.Pause()
			log.Trace().Str("event", "background_paused").Int("rank", rc.key.Rank).Msg("a communication phase began: background replication paused")
		}
		return
	}
	r.comm--
	if r.comm == 0 {
		r.lim.Resume()
		log.Trace().Str("event", "background_resumed").Int("rank", rc.key.Rank).Msg("communication phases ended: background replication resumed")
	}
}

// warnOnce logs a warning the first time key is seen, later ones at debug.
func (r *replicator) warnOnce(log zerolog.Logger, key string) *zerolog.Event {
	if _, seen := r.once.LoadOrStore(key, true); seen {
		return log.Debug()
	}
	return log.Warn()
}

// placed are the unreplicated buffers that get peer copies: those AOR
// does not cover.
func (si *sgInfo) placed() []string {
	var out []string
	for _, b := range si.other {
		if _, ok := si.aorStateOf(b.Name); !ok {
			out = append(out, b.Name)
		}
	}
	return out
}

// copies is how many peer copies of the placed buffers the SPEC asks
// for: as many failed nodes as its modes tolerate, at least one (the
// failure analysis's count, agent/sg).
func (si *sgInfo) copies() int {
	n := si.k
	if si.arc {
		n++
	}
	return max(n, 1)
}

// holders are the nodes that keep copies of self's placed state: GEMINI
// placement over the job's nodes in allocation order.
func holders(nodes []mesh.Node, self string, copies int) ([]string, error) {
	names := make([]string, len(nodes))
	for i, n := range nodes {
		names[i] = n.Name
	}
	if len(names) < 2 {
		return nil, fmt.Errorf("the job has %d node(s): no other node can keep a copy", len(names))
	}
	p, err := sg.Place(names, min(copies, len(names)-1)+1)
	if err != nil {
		return nil, err
	}
	return p.Holders[self], nil
}

// announce queues generation g of a rank for its placement peers; it
// never blocks the commit.
func (s *Server) announce(rc *rankConn, g tmpfs.Generation, log zerolog.Logger) {
	secs := rc.sg.placed()
	if len(secs) == 0 {
		return
	}
	r := s.repl
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
	po.next, po.copies = req, rc.sg.copies()
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
		req, copies := po.next, po.copies
		po.next = nil
		if req == nil || r.ctx.Err() != nil {
			po.running = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		r.send(*req, copies, log)
	}
}

// send tells every placement peer of this node about req.
func (r *replicator) send(req peer.ReplicateRequest, copies int, log zerolog.Logger) {
	m := r.s.meshNow()
	if m == nil {
		r.warnOnce(log, "send:nomesh").Str("event", "replica_off").Int("rank", req.Rank).
			Msg("background replication waits for peering (status says why it is not on): the rank's unreplicated buffers have no peer copy yet")
		return
	}
	hs, err := holders(m.Nodes(), m.Self().Name, copies)
	if err != nil {
		r.warnOnce(log, "send:place").Str("event", "replica_off").Err(err).Int("rank", req.Rank).
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
				r.warnOnce(log, "send:"+h+":"+causeOf(err)).Str("event", "replica_request_failed").Str("holder", h).
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

// meshNow is the mesh if it runs, without waiting.
func (s *Server) meshNow() *mesh.Mesh {
	if s.mesh == nil {
		return nil
	}
	return s.mesh()
}

// receive is the peer transport's replicate handler: it queues the request
// and returns at once.
func (r *replicator) receive(from string, req peer.ReplicateRequest) error {
	switch {
	case r.s.store == nil:
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
	log := r.s.log
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
			r.s.invalidateView()
			log.Debug().Str("event", "replica_committed").Int("rank", g.Key.Rank).Int64("step", g.Step).Str("owner", rq.from).
				Int64("bytes", payloadBytes(g.Manifest.Buffers)).Dur("duration", time.Since(t0)).Msg("replica of a rank's unreplicated buffers committed")
		case r.ctx.Err() != nil:
		case errors.Is(err, peer.ErrNotFound):
			// The owner released that generation while we were busy: the
			// next request names a newer one.
			log.Debug().Str("event", "replica_skipped").Int("rank", rq.req.Rank).Int64("step", rq.req.Step).Str("owner", rq.from).Err(err).
				Msg("the owner no longer has the generation to replicate")
		default:
			r.warnOnce(log, "copy:"+rq.from+":"+causeOf(err)).Str("event", "replica_failed").Int("rank", rq.req.Rank).Int64("step", rq.req.Step).
				Str("owner", rq.from).Err(err).Msg("copying a rank's unreplicated buffers failed; the previous replica stays, and the next commit tries again")
		}
	}
}

// copy fetches the request's sections into a new replica generation and
// commits it.
func (r *replicator) copy(rq *replicaReq) (tmpfs.Generation, error) {
	m := r.s.meshNow()
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
	spec := tmpfs.Spec{Step: rq.req.Step, ChunkSize: info.ChunkSize,
		Layout: fmt.Sprintf("reft-replica rank=%d step=%d seq=%d node=%s", rq.req.Rank, rq.req.Step, rq.req.Seq, rq.from)}
	bufs := make([]*peer.BufferInfo, len(rq.req.Sections))
	var size int64
	for i, sec := range rq.req.Sections {
		if bufs[i] = info.Buffer(sec); bufs[i] == nil {
			return tmpfs.Generation{}, fmt.Errorf("%s on %s has no section %q (the owner's registration changed?)", rq.req.GenKey, rq.from, sec)
		}
		spec.Buffers = append(spec.Buffers, tmpfs.BufferSpec{Name: sec, Size: bufs[i].Size})
		size += bufs[i].Size
	}
	o, err := r.s.store.Begin(tmpfs.Key{Rank: rq.req.Rank, Shard: replicaShard}, spec)
	if err != nil {
		return tmpfs.Generation{}, fmt.Errorf("an arena for the replica of rank %d (%d bytes; the job's memory budget on this node holds the replicas too): %w", rq.req.Rank, size, err)
	}
	ok := false
	defer func() {
		if !ok {
			o.Abort()
		}
	}()
	for i, b := range bufs {
		dst, err := o.Buffer(b.Name)
		if err != nil {
			return tmpfs.Generation{}, err
		}
		if len(dst) > 0 {
			if err := r.waitResume(ctx); err != nil {
				return tmpfs.Generation{}, err
			}
			src, err := m.Source(ctx, rq.from, peer.ChunkKey{GenKey: rq.req.GenKey, Buffer: b.Name})
			if err != nil {
				return tmpfs.Generation{}, err
			}
			r.fetching.Add(1)
			if _, err := m.Fetch(ctx, peer.FetchSpec{ChunkSize: info.ChunkSize, Size: b.Size, CRC: b.CRC32C, Dst: dst,
				Sources: []peer.Source{src}, Background: true, Window: replicaWindow * info.ChunkSize}); err != nil {
				return tmpfs.Generation{}, fmt.Errorf("section %s: %w", rq.req.Sections[i], err)
			}
		}
		// Every chunk was verified against these on arrival.
		if err := o.SetChecksums(b.Name, b.CRC32C); err != nil {
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
	return r.lim.Wait(ctx, 0)
}

// replicaSteps lists, newest first, the steps of rank's replicas in v.
func (v *storeView) replicaSteps(rank int) []int64 {
	out := make([]int64, 0, len(v.replicas[rank]))
	for st := range v.replicas[rank] {
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b int64) int { return int(b - a) })
	return out
}
