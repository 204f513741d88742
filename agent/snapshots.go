package agent

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/event"
	"github.com/reft-hpc/reft/agent/metrics"
	"github.com/reft-hpc/reft/agent/msglog"
	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/agent/runrecord"
	"github.com/reft-hpc/reft/agent/shard"
	"github.com/reft-hpc/reft/spank/spec"
	"github.com/reft-hpc/reft/tmpfs"
)

// snapshots serves the ranks' snapshot requests (docs/PROTOCOL.md,
// "Snapshots"): each rank's state machine of register, save, commit,
// abort, generations, restore and release over the node's store, with
// sharded restores handed to the restorer and commits to the persistent
// tier, the views and the replicator.
//
// A request runs on its rank's connection goroutine with that
// connection's rankConn, which only that goroutine touches (but the
// replicator's comm flag, under the replicator's lock), and the
// connection's ctx; the ranks of a node run side by side. What they share
// is safe for concurrent use: the store, the persistent tier, the
// registry, rings, views, restorer, replicator, progress table and
// metrics. It never calls back into the Server.
type snapshots struct {
	*attached
	rs       *restorer
	views    *views
	rings    *rings
	repl     *replicator
	regs     *registry
	progress *progressTable
	met      *metrics.Recorder
	warned   *onceWarnings
	// degraded is what commit replies say of the node's protection
	// (degraded.go).
	degraded *degradedState
	// layout lays registered buffers out in the arena; nil: identity
	// (SetTestLayout).
	layout layoutFunc
}

// maxChunkSize bounds a client's checksum chunk: a corrupt chunk is
// refetched whole, so chunks stay small.
const maxChunkSize = 256 << 20

// rankConn is the snapshot state of one client connection: one rank
// (docs/PROTOCOL.md, "Snapshots").
type rankConn struct {
	pid int32 // the client process (SO_PEERCRED), for the fence's messages
	// slurmStep is the client's Slurm step id, from its hello (0: none, or
	// batch/extern): the epoch of its persistent writes (persist.Epoch).
	slurmStep int
	// step is the Slurm step the client's hello named ("" none), for the
	// run record.
	step       string
	registered bool
	key        tmpfs.Key
	spec       tmpfs.Spec         // sections, sources and regions of every save
	bufs       []proto.BufferSpec // as registered
	layout     replyLayout        // of every save, in its replies
	arenaSize  int64
	open       *tmpfs.Ongoing
	openedAt   time.Time // the open save's request, for its duration
	restored   map[int64]*tmpfs.Reader
	sg         *shard.Geometry // the sharded layout's geometry; nil: identity
	req        proto.Register  // the registration, to lay saves out again on another ring
	// ringFixed: the saves are laid out on the group's fixed ring (ring.go).
	ringFixed bool
	// AOR (sharded_aor.go): the replica a restore seeded, whether this
	// connection restored (and why no seed), and whether the last commit's
	// replica was invalid.
	aorSeed     *aorSeed
	aorSeedWhy  string
	aorRestored bool
	aorInvalid  bool
	// comm: the connection is in a communication phase (replicate.go);
	// guarded by the replicator's mutex.
	comm bool
	// watch is set once the connection sent watch (notices.go).
	watch *watcher
	// logPending is the connection's message log append whose bytes the
	// client is copying (msglog.go); nil: none.
	logPending *msglog.Pending
	// verifyTooBig: a restore's checksums did not fit in its reply, which
	// was logged once; the agent verifies such restores itself.
	verifyTooBig bool
}

// close aborts the connection's unfinished save and drops its restore pins.
func (rc *rankConn) close() {
	if rc.logPending != nil {
		rc.logPending.Abort()
		rc.logPending = nil
	}
	if rc.open != nil {
		rc.open.Abort() // a no-op when a newer save already discarded it
		rc.open = nil
	}
	for step, r := range rc.restored {
		r.Close()
		delete(rc.restored, step)
	}
}

// replyErr sends an error reply with code and a one-line message.
func replyErr(c net.Conn, id uint32, code, format string, args ...any) error {
	return proto.WriteMsg(c, proto.TError, id, proto.Error{Code: code, Message: fmt.Sprintf(format, args...)})
}

// badChunks says which bytes of the caller's buffers the corrupt chunks of
// a generation with manifest m held: each chunk (a range of a section)
// split over the regions that map buffers into that section, in arena
// order.
func badChunks(m *tmpfs.Manifest, bad []tmpfs.BadChunk) []proto.BadChunk {
	secOff := make(map[string]int64, len(m.Buffers))
	for _, b := range m.Buffers {
		secOff[b.Name] = b.Offset
	}
	regions := slices.Clone(m.RegionList())
	slices.SortFunc(regions, func(a, b tmpfs.Region) int { return cmp.Compare(a.ArenaOffset, b.ArenaOffset) })
	var out []proto.BadChunk
	for _, c := range bad {
		lo := secOff[c.Buffer] + c.Offset // the chunk in the arena
		hi := lo + c.Length
		n := len(out)
		for _, r := range regions {
			a, b := max(lo, r.ArenaOffset), min(hi, r.ArenaOffset+r.Size)
			if a < b {
				out = append(out, proto.BadChunk{Buffer: r.Buffer, Section: c.Buffer, Chunk: c.Index,
					Offset: r.Offset + a - r.ArenaOffset, Length: b - a})
			}
		}
		if len(out) == n { // agent-only bytes: no client buffer holds them
			out = append(out, proto.BadChunk{Section: c.Buffer, Chunk: c.Index, Offset: c.Offset, Length: c.Length})
		}
	}
	return out
}

// storeErr maps a store failure to the protocol's error code.
func storeErr(err error) string {
	var cerr *tmpfs.ChecksumError
	switch {
	case errors.As(err, &cerr), errors.Is(err, tmpfs.ErrCorrupt):
		return proto.CodeCorrupt
	case errors.Is(err, tmpfs.ErrNoSpace), errors.Is(err, tmpfs.ErrOverBudget):
		return proto.CodeNoSpace
	case errors.Is(err, tmpfs.ErrNoGeneration):
		return proto.CodeNotFound
	}
	return proto.CodeInternal
}

// handle serves one snapshot request of rc's rank (register,
// generations, save, commit, abort, restore, release) on the connection's
// goroutine, after refusal admitted it.
func (s *snapshots) handle(ctx context.Context, c net.Conn, rc *rankConn, f proto.Frame, log zerolog.Logger) error {
	if code, msg := s.refusal(rc, f); code != "" {
		return replyErr(c, f.ID, code, "%s", msg)
	}
	switch f.Type {
	case proto.TRegister:
		return decoded(c, f, proto.Register{}, func(req proto.Register) error { return s.register(c, rc, f.ID, req, log) })
	case proto.TGenerations:
		gens := []proto.GenInfo(nil)
		if rc.sg != nil {
			gens = s.rs.shardedGenerations(ctx, rc, log)
		} else {
			gens = s.generationList(rc.key.Rank, log)
		}
		out := proto.GenerationsReply{Rank: rc.key.Rank, Generations: gens}
		return proto.WriteMsg(c, f.Type|proto.ReplyBit, f.ID, out)
	case proto.TCommit:
		return decoded(c, f, proto.Commit{}, func(req proto.Commit) error { return s.commit(c, rc, f.ID, req, log) })
	case proto.TRestore:
		return decoded(c, f, proto.Restore{Step: -1}, func(req proto.Restore) error {
			return s.restore(ctx, c, rc, f.ID, req.Step, req.Verify == proto.VerifyClient, log)
		})
	case proto.TRelease:
		return decoded(c, f, proto.Release{}, func(req proto.Release) error { return s.release(c, rc, f.ID, req, log) })
	case proto.TSave:
		return decoded(c, f, proto.StepReq{Step: -1}, func(req proto.StepReq) error { return s.save(c, rc, f.ID, req.Step, log) })
	case proto.TAbort:
		return decoded(c, f, proto.StepReq{Step: -1}, func(req proto.StepReq) error { return rc.abortSave(c, f, req, log) })
	}
	// A payload that is not even a step request is malformed before it is
	// of an unknown type (the order the checks always had).
	return decoded(c, f, proto.StepReq{Step: -1}, func(proto.StepReq) error {
		return replyErr(c, f.ID, proto.CodeUnknownType, "unknown message type %s", f.Type)
	})
}

// decoded unmarshals f's payload over req (its defaults) and passes it to
// serve, or replies malformed.
func decoded[T any](c net.Conn, f proto.Frame, req T, serve func(T) error) error {
	if err := f.Unmarshal(&req); err != nil {
		return replyErr(c, f.ID, proto.CodeMalformed, "%v", err)
	}
	return serve(req)
}

// refusal says why a snapshot request of rc may not be served
// (code "" when it may): the job has no store, the rank is not
// registered, or a newer registration of the rank fenced this connection.
func (s *snapshots) refusal(rc *rankConn, f proto.Frame) (code, msg string) {
	if s.store == nil {
		return proto.CodeDisabled, fmt.Sprintf("job %s has no snapshot store on %s (SPEC %q): snapshots are disabled for this job",
			s.info.Job, s.info.Node, s.info.Spec)
	}
	if f.Type != proto.TRegister && !rc.registered {
		return proto.CodeBadState, fmt.Sprintf("%s before register: register the rank's buffers first", f.Type)
	}
	if !rc.registered || f.Type == proto.TRegister || f.Type == proto.TGenerations {
		return "", ""
	}
	// A rank's snapshots have one writer: the connection that registered
	// the rank last. An older incarnation still connected (a process that
	// outlived its relaunch) must not commit over, restore into or release
	// the newer one's state.
	if by := s.regs.fencedBy(rc); by != nil {
		return proto.CodeBadState, fmt.Sprintf("%s refused: rank %d was registered again on this node by pid %d after this connection (pid %d) registered it; "+
			"a rank has one process, so this older one is fenced (end it: the rank runs in pid %d now)",
			f.Type, rc.key.Rank, by.pid, rc.pid, by.pid)
	}
	return "", ""
}

// abortSave drops the connection's open save of req's step and replies.
func (rc *rankConn) abortSave(c net.Conn, f proto.Frame, req proto.StepReq, log zerolog.Logger) error {
	if rc.open == nil || rc.open.Step() != req.Step {
		return replyErr(c, f.ID, proto.CodeBadState, "abort of step %d: no save of that step is open on this connection", req.Step)
	}
	rc.open.Abort()
	rc.open = nil
	log.Info().Str("event", "save_aborted").Int("rank", rc.key.Rank).Int64("step", req.Step).Msg("the client aborted a save")
	return proto.WriteMsg(c, f.Type|proto.ReplyBit, f.ID, req)
}

// release ends a restore: the client has copied out of the arena. A
// client that verified the copy reports the chunks that failed; the store
// then verifies the generation itself, marks it bad when the arena is
// corrupt, and the reply is corrupt either way, since the client's copy is
// not the generation. The pin is dropped in every case.
func (s *snapshots) release(c net.Conn, rc *rankConn, id uint32, req proto.Release, log zerolog.Logger) error {
	r, ok := rc.restored[req.Step]
	if !ok {
		return replyErr(c, id, proto.CodeBadState, "release of step %d: it was not restored on this connection", req.Step)
	}
	var verr error
	var bad []proto.BadChunk
	if len(req.BadChunks) > 0 {
		verr = s.reportedCorrupt(rc, r, req, log)
		var cerr *tmpfs.ChecksumError
		if errors.As(verr, &cerr) {
			bad = badChunks(r.Manifest(), cerr.Chunks)
		}
	}
	r.Close()
	delete(rc.restored, req.Step)
	if rc.sg != nil && len(rc.restored) == 0 {
		// The assembled state was copied out: free its arena.
		if err := s.store.Drop(tmpfs.Key{Rank: rc.key.Rank, Shard: restoreShard}); err != nil {
			log.Warn().Err(err).Int("rank", rc.key.Rank).Msg("release: freeing the assembled restore")
		}
	}
	if verr != nil {
		return proto.WriteMsg(c, proto.TError, id, proto.Error{Code: proto.CodeCorrupt, BadChunks: bad,
			Message: fmt.Sprintf("restore of rank %d step %d: %v", rc.key.Rank, req.Step, verr)})
	}
	return proto.WriteMsg(c, proto.TRelease|proto.ReplyBit, id, proto.StepReq{Step: req.Step})
}

// reportedCorrupt handles a client's report of chunks that failed its
// checksums while it copied a restore: the store reads the arena and
// decides. It returns the error for the client: the store's *ChecksumError
// (the generation is now marked bad and never served again), or, when the
// arena verifies, one that says the client's copy went wrong and the
// generation was kept.
func (s *snapshots) reportedCorrupt(rc *rankConn, r *tmpfs.Reader, req proto.Release, log zerolog.Logger) error {
	var b strings.Builder
	for i, bc := range req.BadChunks {
		if i == 8 {
			fmt.Fprintf(&b, " and %d more", len(req.BadChunks)-i)
			break
		}
		fmt.Fprintf(&b, " section %q chunk %d read %#08x;", bc.Section, bc.Index, bc.Got)
	}
	log.Warn().Str("event", "restore_corrupt_reported").Int("rank", rc.key.Rank).Int64("step", req.Step).
		Int("bad_chunks", len(req.BadChunks)).Str("chunks", b.String()).Msg("the client's copy of a restore failed its checksums; verifying the generation")
	if err := r.Verify(); err != nil {
		log.Error().Err(err).Int("rank", rc.key.Rank).Int64("step", req.Step).Msg("restore refused")
		return err
	}
	log.Warn().Str("event", "restore_client_copy_bad").Int("rank", rc.key.Rank).Int64("step", req.Step).
		Msg("the generation verifies in the arena; the client's copy went wrong, so the generation is kept")
	return fmt.Errorf("the client's copy of %d chunk(s) failed its CRC-32C (%s), but the generation verifies in the arena, so it is kept: "+
		"the restored buffers were changed while they were copied, or this host's memory is failing; restore again", len(req.BadChunks), strings.TrimSpace(b.String()))
}

func payloadBytes(bufs []tmpfs.Buffer) int64 {
	var n int64
	for _, b := range bufs {
		n += b.Size
	}
	return n
}

func (s *snapshots) register(c net.Conn, rc *rankConn, id uint32, req proto.Register, log zerolog.Logger) error {
	if rc.registered {
		return replyErr(c, id, proto.CodeBadState, "register: this connection already registered rank %d; a rank registers once", rc.key.Rank)
	}
	if err := checkRegister(s.spec(), req); err != nil {
		return replyErr(c, id, proto.CodeInvalid, "register: %v", err)
	}
	si, err := shard.NewGeometry(s.spec(), req)
	if err != nil {
		return replyErr(c, id, proto.CodeInvalid, "register: %v", err)
	}
	if why := whyLocal(s.spec(), req, si); why != "" {
		s.warned.warn(log, fmt.Sprintf("local:%d", req.Rank)).Str("event", "protection_local").Int("rank", req.Rank).Str("reason", why).
			Msgf("rank %d's state is kept on this node only, although --reft=%s protects across nodes: %s", req.Rank, s.spec(), why)
	}
	if si != nil {
		// A ring fixed already (another local rank's save, a restore)
		// lays this rank out on it at once.
		if ring := s.rings.fixedRing(s.rings.group(si)); ring != nil {
			if rs, err := si.WithRing(ring); err == nil {
				si, rc.ringFixed = rs, true
			}
		}
	}
	rc.key = tmpfs.Key{Rank: req.Rank, Shard: tmpfs.DefaultShard}
	if err := s.applyLayout(rc, req, si); err != nil {
		var ae allocError
		if errors.As(err, &ae) {
			log.Error().Err(ae.err).Int("rank", req.Rank).Int64("arena_size", ae.size).Msg("register: arena allocation failed")
			hint := ""
			if s.persist != nil {
				hint = "; with persistent checkpoints each rank holds one more arena (persist=off in --reft frees it)"
			}
			return replyErr(c, id, storeErr(ae.err), "register rank %d (%d bytes per generation): %v%s", req.Rank, ae.size, ae.err, hint)
		}
		var ie internalError
		if errors.As(err, &ie) {
			log.Error().Err(err).Int("rank", req.Rank).Msg("register refused")
			return replyErr(c, id, proto.CodeInternal, "register: %v", err)
		}
		return replyErr(c, id, proto.CodeInvalid, "register: %v", err)
	}
	spec, size, layout := rc.spec, rc.arenaSize, rc.layout
	secs, _, _ := tmpfs.Plan(spec)
	rc.registered, rc.req = true, req
	rc.bufs = slices.Clone(req.Buffers)
	s.rings.host(req.Rank, si)
	s.regs.registered(rc, req.Rank, req.World, si)
	if s.persist != nil {
		s.persist.Registered(req.Rank, req.World)
	}
	cs := req.ChunkSize
	if cs == 0 {
		cs = s.store.ChunkSize()
	}
	log.Info().Str("event", event.RankRegistered).Int("rank", req.Rank).Int("world", req.World).Int("local_rank", req.LocalRank).
		Str("layout", req.Layout).Str("arena_layout", si.Describe()).Int("buffers", len(req.Buffers)).Int("regions", len(spec.Regions)).Int("sections", len(secs)).
		Int64("bytes", payloadBytes(secs)).Int64("arena_size", size).Msg("rank registered")
	s.record(runrecord.Record{Kind: runrecord.KindRegistered, Rank: req.Rank, PID: int(rc.pid), Step: rc.step}, log)
	return proto.WriteMsg(c, proto.TRegister|proto.ReplyBit, id, proto.RegisterReply{
		Rank: req.Rank, ChunkSize: cs, ArenaSize: size, Buffers: layout.places})
}

// checkRegister checks a decoded register request, before it touches any
// state (a function of its own so that FuzzRegister reaches it).
func checkRegister(sp spec.Spec, req proto.Register) error {
	switch {
	case req.World < 1:
		return fmt.Errorf("world = %d must be at least 1", req.World)
	case req.Rank < 0 || req.Rank >= req.World:
		return fmt.Errorf("rank = %d must be in [0, world = %d)", req.Rank, req.World)
	case len(req.Buffers) == 0:
		return errors.New("buffers is empty; register at least one buffer")
	case req.ChunkSize != 0 && (req.ChunkSize < 4096 || req.ChunkSize > maxChunkSize):
		return fmt.Errorf("chunk_size = %d must be 0 (the agent's) or from 4096 to %d", req.ChunkSize, maxChunkSize)
	}
	if err := checkBuffers(req.Buffers); err != nil {
		return err
	}
	if sp.Enabled() && sp.AOR { // else aor objects are ignored: plain buffers
		return proto.CheckAOR(req.Buffers)
	}
	return nil
}

// allocError is an arena that could not be preallocated; internalError
// a layout that breaks the protocol's rules (a bug).
type (
	allocError struct {
		size int64
		err  error
	}
	internalError struct{ err error }
)

func (e allocError) Error() string    { return e.err.Error() }
func (e internalError) Error() string { return e.err.Error() }

// applyLayout lays the registration out (sharded on si's ring, or
// identity), preallocates its arenas and makes it rc's layout.
func (s *snapshots) applyLayout(rc *rankConn, req proto.Register, si *shard.Geometry) error {
	spec, secs, size, agentSecs, err := s.planLayout(req, si)
	if err != nil {
		return err
	}
	if si != nil {
		spec.Ring = slices.Clone(si.Members)
	}
	layout := newReplyLayout(spec.Sources, secs, spec.Regions)
	layout.sections = slices.DeleteFunc(layout.sections, func(sec proto.Section) bool { return slices.Contains(agentSecs, sec.Name) })
	if err := layout.check(size, true); err != nil {
		return internalError{err}
	}
	if err := s.store.Preallocate(rc.key, spec); err != nil {
		return allocError{size, err}
	}
	rc.spec, rc.arenaSize, rc.layout, rc.sg = spec, size, layout, si
	return nil
}

func (s *snapshots) save(c net.Conn, rc *rankConn, id uint32, step int64, log zerolog.Logger) error {
	if step < 0 {
		return replyErr(c, id, proto.CodeInvalid, "save: step = %d must not be negative", step)
	}
	if rc.open != nil {
		return replyErr(c, id, proto.CodeBadState, "save of step %d: the save of step %d is still open; commit or abort it first", step, rc.open.Step())
	}
	if err := s.ensureRing(rc, log); err != nil {
		log.Error().Err(err).Int("rank", rc.key.Rank).Int64("step", step).Msg("save failed")
		return replyErr(c, id, storeErr(err), "save of rank %d step %d: %v", rc.key.Rank, step, err)
	}
	spec := rc.spec
	spec.Step = step
	o, err := s.store.Begin(rc.key, spec)
	if err != nil {
		log.Error().Err(err).Int("rank", rc.key.Rank).Int64("step", step).Msg("save failed")
		return replyErr(c, id, storeErr(err), "save of rank %d step %d: %v", rc.key.Rank, step, err)
	}
	rc.open, rc.openedAt = o, time.Now()
	s.progress.note(rc, rc.key.Rank, step) // a save is progress too
	return proto.WriteMsg(c, proto.TSave|proto.ReplyBit, id, proto.ArenaReply{
		Step: step, Arena: o.ArenaPath(), ArenaSize: o.Arena().Size(),
		Buffers: rc.layout.places, Regions: rc.layout.regions, Sections: rc.layout.sections})
}

func (s *snapshots) commit(c net.Conn, rc *rankConn, id uint32, req proto.Commit, log zerolog.Logger) error {
	step := req.Step
	if rc.open == nil || rc.open.Step() != step {
		return replyErr(c, id, proto.CodeBadState, "commit of step %d: no save of that step is open on this connection", step)
	}
	o := rc.open
	// Checksums are per section of the save reply (with the identity
	// layout a section is the buffer of its name, as before sections).
	secs := rc.layout.sections
	if req.CRC32C != nil {
		if err := takeChecksums(o, secs, req.CRC32C); err != nil {
			return replyErr(c, id, proto.CodeInvalid, "commit of step %d: %v", step, err)
		}
	}
	rc.open = nil
	t0 := time.Now()
	if req.CRC32C == nil {
		if err := computeChecksums(o, secs); err != nil {
			o.Abort()
			return replyErr(c, id, proto.CodeInternal, "commit of step %d: %v", step, err)
		}
	}
	crcTime := time.Since(t0)
	if rc.sg != nil {
		te := time.Now()
		err := rc.sg.Encode(o)
		s.met.Encode(time.Since(te).Seconds())
		if err == nil {
			err = rc.aorCommit(s.store, o, log)
		}
		if err != nil {
			o.Abort()
			log.Error().Err(err).Int("rank", rc.key.Rank).Int64("step", step).Msg("commit failed")
			return replyErr(c, id, proto.CodeInternal, "commit of step %d: %v", step, err)
		}
	}
	degraded := s.degraded.reasons(time.Now(), s.info.DegradedGrace)
	if err := strictRefusal(s.spec().Strict, s.info.DegradedGrace, degraded); err != nil {
		o.Abort()
		log.Error().Err(err).Int("rank", rc.key.Rank).Int64("step", step).Msg("commit refused")
		return replyErr(c, id, proto.CodeDegraded, "commit of rank %d step %d: %v", rc.key.Rank, step, err)
	}
	g, err := o.Commit()
	if err != nil {
		log.Error().Err(err).Int("rank", rc.key.Rank).Int64("step", step).Msg("commit failed")
		code := storeErr(err)
		if code == proto.CodeInternal {
			code = proto.CodeBadState // superseded by a newer save of the same rank
		}
		return replyErr(c, id, code, "commit of rank %d step %d: %v", rc.key.Rank, step, err)
	}
	if s.persist != nil {
		s.persist.Committed(g, rc.slurmStep) // queues a background write when due; never blocks
	}
	if rc.sg != nil {
		s.views.invalidate()
		s.repl.announce(rc, g, log) // background copies of the unreplicated buffers
	}
	s.met.Snapshot(time.Since(rc.openedAt).Seconds())
	n := payloadBytes(g.Manifest.Buffers)
	log.Debug().Str("event", "committed").Int("rank", rc.key.Rank).Int64("step", step).Uint64("seq", g.Seq).
		Int64("bytes", n).Dur("checksum", crcTime).Msg("generation committed")
	return proto.WriteMsg(c, proto.TCommit|proto.ReplyBit, id, proto.CommitReply{
		Step: step, Seq: g.Seq, Bytes: n, ChecksumS: crcTime.Seconds(), Degraded: degraded})
}

// takeChecksums sets the client's checksums of every section of the save
// on o; the error says what the client must send instead.
func takeChecksums(o *tmpfs.Ongoing, secs []proto.Section, crcs map[string][]uint32) error {
	for _, sec := range secs {
		list, ok := crcs[sec.Name]
		if !ok {
			return fmt.Errorf("crc32c has no entry for section %q (send one list per section of the save reply, keyed by its name, or no crc32c)", sec.Name)
		}
		if err := o.SetChecksums(sec.Name, list); err != nil {
			return fmt.Errorf("crc32c: %w (send one checksum per chunk_size chunk of every section, or no crc32c)", err)
		}
	}
	if len(crcs) != len(secs) {
		return fmt.Errorf("crc32c names %d sections, the save has %d (key the checksums by the save reply's section names)", len(crcs), len(secs))
	}
	return nil
}

// computeChecksums checksums every section of the save itself (the
// client sent none).
func computeChecksums(o *tmpfs.Ongoing, secs []proto.Section) error {
	for _, sec := range secs {
		if err := o.ComputeChecksums(sec.Name); err != nil {
			return fmt.Errorf("checksum of section %q: %w", sec.Name, err)
		}
	}
	return nil
}

// restore serves a restore request; verifyClient: the client checks the
// checksums while it copies (proto.Restore.Verify).
func (s *snapshots) restore(ctx context.Context, c net.Conn, rc *rankConn, id uint32, step int64, verifyClient bool, log zerolog.Logger) error {
	t0 := time.Now()
	if rc.sg != nil {
		g, event, err := s.rs.restoreSharded(ctx, rc, step, log)
		if err != nil {
			log.Error().Err(err).Int("rank", rc.key.Rank).Int64("step", step).Msg("restore failed")
			what := "the newest restorable step"
			if step >= 0 {
				what = fmt.Sprintf("step %d", step)
			}
			return replyErr(c, id, storeErr(err), "restore of rank %d, %s: %v", rc.key.Rank, what, err)
		}
		return s.serveRestore(c, rc, id, g, event, verifyClient, restoreTiming{start: t0, event: event}, log)
	}
	var (
		g     tmpfs.Generation
		found bool
		have  []int64
	)
	for _, h := range s.store.Generations(rc.key) { // newest first
		if h.Bad {
			continue
		}
		have = append(have, h.Step)
		if !found && (step < 0 || h.Step == step) {
			g, found = h, true
		}
	}
	rt := restoreTiming{start: t0, event: event.RestoreLocal}
	if !found {
		var replied bool
		var err error
		if g, found, rt.reason, replied, err = s.restorePersistent(c, rc, id, step, have, log); replied {
			return err
		}
		rt.event = event.RestorePersistent
	}
	if !found {
		if step < 0 {
			return replyErr(c, id, proto.CodeNotFound, "restore: rank %d has no committed generation on %s", rc.key.Rank, s.info.Node)
		}
		return replyErr(c, id, proto.CodeNotFound, "restore of step %d: rank %d has no committed generation of that step on %s (it has steps %v)",
			step, rc.key.Rank, s.info.Node, have)
	}
	return s.serveRestore(c, rc, id, g, event.RestoreLocal, verifyClient, rt, log)
}

// serveRestore pins generation g of the rank and replies with its arena
// and layout. event names the restore in the log ("" when already logged).
// With verifyClient the reply carries the manifest's checksums and the
// client verifies every chunk as it copies it, so the bytes cross the
// memory bus once; otherwise (the Python client, or checksums that would
// not fit in a frame) the store verifies the arena first and the client
// copies.
func (s *snapshots) serveRestore(c net.Conn, rc *rankConn, id uint32, g tmpfs.Generation, name string, verifyClient bool, rt restoreTiming, log zerolog.Logger) error {
	// The generation's own layout: it may predate this registration's.
	m := &g.Manifest
	if err := sameSources(m.SourceList(), rc.bufs); err != nil {
		return replyErr(c, id, proto.CodeMismatch, "restore of step %d: %v", g.Step, err)
	}
	layout := newReplyLayout(m.SourceList(), m.Buffers, m.RegionList())
	if err := layout.check(m.ArenaSize, false); err != nil {
		log.Error().Err(err).Int("rank", rc.key.Rank).Int64("step", g.Step).Msg("restore refused")
		return replyErr(c, id, proto.CodeInternal, "restore of step %d: %v", g.Step, err)
	}
	reply := proto.ArenaReply{
		Step: g.Step, Seq: g.Seq, Arena: g.ArenaPath, ArenaSize: m.ArenaSize,
		Buffers: layout.places, Regions: layout.regions, Sections: layout.sections}
	verifier := "agent"
	if verifyClient {
		reply.ChunkSize, reply.CRC32C = m.ChunkSize, make(map[string][]uint32, len(m.Buffers))
		for _, b := range m.Buffers {
			reply.CRC32C[b.Name] = b.CRC32C
		}
		if n := replySize(reply); n > restoreReplyLimit {
			reply.ChunkSize, reply.CRC32C = 0, nil
			if !rc.verifyTooBig {
				rc.verifyTooBig = true
				log.Warn().Str("event", "restore_verify_agent").Int("rank", rc.key.Rank).Int64("step", g.Step).Int("reply_bytes", n).
					Msg("the generation's checksums do not fit in a restore reply (a larger chunk_size at register fixes it); the agent verifies it before replying instead, one more pass over the arena")
			}
		} else {
			verifier = "client"
		}
	}
	t0 := time.Now()
	var (
		r   *tmpfs.Reader
		err error
	)
	if verifier == "client" {
		if r, err = s.store.Open(g); err == nil {
			s.store.Metrics().Restores.Add(1)
		}
	} else {
		r, err = s.store.Verify(g)
	}
	if err != nil {
		log.Error().Err(err).Int("rank", rc.key.Rank).Int64("step", g.Step).Msg("restore refused")
		e := proto.Error{Code: storeErr(err), Message: fmt.Sprintf("restore of rank %d step %d: %v", rc.key.Rank, g.Step, err)}
		var cerr *tmpfs.ChecksumError
		if errors.As(err, &cerr) {
			e.BadChunks = badChunks(m, cerr.Chunks)
		}
		return proto.WriteMsg(c, proto.TError, id, e)
	}
	if old := rc.restored[g.Step]; old != nil {
		old.Close()
	}
	if rc.restored == nil {
		rc.restored = map[int64]*tmpfs.Reader{}
	}
	rc.restored[g.Step] = r
	if s.persist != nil {
		s.persist.Restored(rc.key.Rank, g.Step)
	}
	if rc.sg == nil {
		verify := time.Since(t0)
		log.Info().Str("event", name).Int("rank", rc.key.Rank).Int64("generation", g.Step).Uint64("seq", g.Seq).
			Int64("bytes", payloadBytes(g.Manifest.Buffers)).Str("verified_by", verifier).Dur("verify", verify).Msg("serving a local restore")
		s.record(localRestoreRecord(rc, g, rt, verify), log)
	}
	s.met.Restore(restoreSource[rt.event], time.Since(rt.start).Seconds())
	return proto.WriteMsg(c, proto.TRestore|proto.ReplyBit, id, reply)
}

// localRestoreRecord is the run record of an unsharded rank's restore of
// g: it says where the bytes came from (the log's restore_persistent line
// precedes the restore_local one), and for a persistent restore how long
// the load took besides the verification.
func localRestoreRecord(rc *rankConn, g tmpfs.Generation, rt restoreTiming, verify time.Duration) runrecord.Record {
	rec := runrecord.Record{Kind: runrecord.KindRestored, Rank: rc.key.Rank, PID: int(rc.pid), Step: rc.step,
		Event: rt.event, Generation: g.Step, Bytes: payloadBytes(g.Manifest.Buffers), Duration: verify, Reason: rt.reason}
	if rt.event == event.RestorePersistent {
		rec.Duration = time.Since(rt.start)
	}
	return rec
}

// restoreTiming is when a restore request came and the event naming
// where its bytes came from, for agent/metrics.
type restoreTiming struct {
	start time.Time
	event string
	// reason: why memory could not serve it (a persistent restore's).
	reason string
}

// restoreSource is the metrics' source of each restore event.
var restoreSource = map[string]string{
	event.RestoreLocal: "local", event.RestorePeer: "peer", event.Decode: "decode", event.RestorePersistent: "persistent",
}

// restoreReplyLimit is the largest restore reply with checksums; a
// variable so that tests reach the fallback without gigabytes of state.
var restoreReplyLimit = proto.MaxPayload

// replySize is the length of v's JSON payload.
func replySize(v any) int {
	b, err := json.Marshal(v)
	if err != nil {
		return math.MaxInt // WriteMsg would fail the same way
	}
	return len(b)
}
