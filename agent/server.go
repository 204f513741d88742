// Package agent is the per-node, per-job reft daemon: it serves the local
// protocol on agent/localsrv's socket (Server is its Handler, one session
// a connection) over the node's snapshot store, and composes the peer
// mesh, detection, replication and the persistent tier.
package agent

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/agent/detect"
	"github.com/reft-hpc/reft/agent/localsrv"
	"github.com/reft-hpc/reft/agent/mesh"
	"github.com/reft-hpc/reft/agent/metrics"
	"github.com/reft-hpc/reft/agent/persist"
	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/agent/restore"
	"github.com/reft-hpc/reft/agent/runpath"
	"github.com/reft-hpc/reft/agent/runrecord"
	"github.com/reft-hpc/reft/spank/spec"
	"github.com/reft-hpc/reft/tmpfs"
)

// Info is what the agent says about itself in hello and status replies.
type Info struct {
	Job          string
	Node         string
	Spec         string // normalized SPEC
	Version      string
	Restart      int
	UID          int // the job's uid; every other peer is refused
	MemoryBudget uint64
	StoreDir     string
	// DegradedGrace overrides the package's DegradedGrace (0: that), for
	// tests.
	DegradedGrace time.Duration
}

// Server serves the local protocol (docs/PROTOCOL.md) on a Unix socket.
type Server struct {
	info    Info
	store   *tmpfs.Store          // nil: snapshots disabled
	peering func() *proto.Peering // nil: no peering (snapshots disabled)
	gpu     func() *proto.GPU     // nil: no GPU section
	// persist is the persistent tier (agent/persist); nil: off.
	persist *persist.Persister
	// met records the timings and counts of the status reply's metrics
	// section (agent/metrics).
	met   *metrics.Recorder
	log   zerolog.Logger
	start time.Time
	// rec is the job's run record, reft run's channel (AttachRecord);
	// nil: none.
	rec *runrecord.Writer
	// ls is the local socket (agent/localsrv); the server is its Handler.
	ls *localsrv.Server

	// layout lays registered buffers out in the arena; nil: identity
	// (SetTestLayout).
	layout layoutFunc

	// mesh is the job's agent mesh, for sharded restores (AttachMesh).
	mesh      func() *mesh.Mesh
	viewMu    sync.Mutex
	viewCache map[string]*restore.View // per sharding group: its members' watermarks, briefly cached
	// progressEvery is how often a running restore reports progress
	// (restoreProgressEvery; 0: at every arrival).
	progressEvery time.Duration
	specOnce      sync.Once
	jobSpec       spec.Spec

	// repl is background replication (replicate.go): the limiter, the
	// communication phases and the copies of other nodes' ranks.
	repl *replicator

	// rings are the sharding groups' rings and the rank-to-node map
	// (ring.go).
	rings *rings

	// notes tells the watching clients of failed peers and runs the
	// failure hooks (notices.go, detecting.go).
	notes *notifier
	// regs are the ranks registered on this node (registry.go).
	regs *registry

	// Failure detection (detecting.go): the ranks' progress, and what
	// learns of a failure.
	progress progressTable
	// found: when the mesh last connected to each peer's agent, and det
	// the detector once it runs (it learns of those connections).
	foundMu sync.Mutex
	found   map[string]time.Time
	det     *detect.Detector

	// degraded is what commit replies say of the node's protection
	// (degraded.go).
	degraded degradedState
}

// Listen creates the socket at path with mode 0600 (localsrv.Listen),
// serving the processes of info.UID only.
func Listen(path string, info Info, log zerolog.Logger) (*Server, error) {
	ls, err := localsrv.Listen(path, localsrv.Config{UID: info.UID, Job: info.Job, Log: log})
	if err != nil {
		return nil, err
	}
	s := &Server{info: info, log: log, ls: ls, start: time.Now(), progressEvery: restoreProgressEvery, met: metrics.NewRecorder()}
	s.notes = newNotifier(log, s.met)
	s.regs = &registry{log: log}
	s.repl = newReplicator(s)
	s.rings = &rings{node: info.Node, peering: s.peeringStatus, noted: s.repl.hosts.note,
		mesh: func() *mesh.Mesh {
			if s.mesh == nil {
				return nil
			}
			return s.mesh()
		}}
	return s, nil
}

// AttachStore gives the server the job's snapshot store; call it before
// Serve. Without one, snapshot requests get a `disabled` error.
func (s *Server) AttachStore(st *tmpfs.Store) { s.store = st }

// AttachRecord sets the run record the server writes registrations,
// restores and (through its detector) failure verdicts to, for reft run.
// Call it before Serve.
func (s *Server) AttachRecord(w *runrecord.Writer) { s.rec = w }

// record appends r to the run record; a failure is logged, not returned:
// the rank's request does not fail for it, reft run sees less.
func (s *Server) record(r runrecord.Record, log zerolog.Logger) {
	if err := s.rec.Write(r); err != nil {
		log.Warn().Err(err).Str("kind", r.Kind).Int("rank", r.Rank).Msg("reft run will not see this: the run record could not take it")
	}
}

// AttachPeering gives the status reply its peering section; call it
// before Serve.
func (s *Server) AttachPeering(f func() *proto.Peering) { s.peering = f }

// AttachGPU gives the status reply its GPU health section; call it before
// Serve.
func (s *Server) AttachGPU(f func() *proto.GPU) { s.gpu = f }

// Path returns the socket path.
func (s *Server) Path() string { return s.ls.Path() }

// Serve accepts connections until ctx is done or Close is called.
func (s *Server) Serve(ctx context.Context) error {
	go func() {
		<-ctx.Done()
		s.Close()
	}()
	return s.ls.Serve(ctx, s)
}

// Close stops accepting, closes every connection and removes the socket.
func (s *Server) Close() error {
	// Every caller waits for the replicator: the store closes after Close.
	defer s.repl.stop()
	return s.ls.Close()
}

// PeerCred returns the credentials of the process at the other end of c.
func PeerCred(c *net.UnixConn) (*unix.Ucred, error) { return runpath.PeerCred(c) }

// Open is the localsrv.Handler: a connection is one rank (or one reft
// command), its state a rankConn.
func (s *Server) Open(c net.Conn, cred *unix.Ucred, log zerolog.Logger) localsrv.Session {
	return &session{s: s, c: c, rc: &rankConn{pid: cred.Pid}, log: log}
}

// session is one connection of the local socket.
type session struct {
	s   *Server
	c   net.Conn
	rc  *rankConn
	log zerolog.Logger
}

func (ss *session) Handle(ctx context.Context, f proto.Frame) error {
	return ss.s.handle(ctx, ss.c, ss.rc, f, ss.log)
}

// Close forgets the rank: its progress, registration, watch and
// communication phase (a rank that died mid-collective must not hold
// replication paused), then its connection's state.
func (ss *session) Close() {
	s, rc := ss.s, ss.rc
	s.progress.drop(rc)
	s.regs.gone(rc)
	s.notes.unwatch(rc)
	s.commPhase(rc, false, ss.log)
	rc.close()
}

// handle dispatches one frame by its type; ctx is the connection's
// (localsrv.Session).
func (s *Server) handle(ctx context.Context, c net.Conn, rc *rankConn, f proto.Frame, log zerolog.Logger) error {
	switch f.Type {
	case proto.THello:
		var h proto.Hello
		if err := f.Unmarshal(&h); err != nil {
			s.ls.NoteBadFrame()
			log.Warn().Err(err).Msg("malformed hello")
			return proto.WriteMsg(c, proto.TError, f.ID, proto.Error{Code: proto.CodeMalformed, Message: err.Error()})
		}
		log.Info().Str("client", h.Client).Int("pid", h.PID).Str("client_step", h.Step).Int("rank", h.Rank).Msg("hello")
		if n, err := strconv.Atoi(h.Step); err == nil && n >= 0 {
			rc.slurmStep = n
		}
		rc.step = h.Step
		return proto.WriteMsg(c, proto.THelloReply, f.ID, proto.HelloReply{
			Protocol: proto.Version, Job: s.info.Job, Node: s.info.Node, Spec: s.info.Spec,
			AgentVersion: s.info.Version, Restart: s.info.Restart})
	case proto.TStatus:
		return proto.WriteMsg(c, proto.TStatusReply, f.ID, s.Status())
	case proto.TComm:
		// A notice: no reply, so a trainer pays no round trip for it.
		var cm proto.Comm
		err := f.Unmarshal(&cm)
		if err == nil {
			err = proto.CheckCommOp(cm.Op)
		}
		if err != nil {
			s.ls.NoteBadFrame()
			log.Warn().Err(err).Msg("malformed comm notice, ignored (not answered: comm has no reply)")
			return nil
		}
		s.commPhase(rc, cm.Active, log)
		s.progress.comm(rc, cm.Active, cm.Op)
		return nil
	case proto.TRegister, proto.TSave, proto.TCommit, proto.TAbort, proto.TGenerations, proto.TRestore, proto.TRelease:
		return s.handleSnapshot(ctx, c, rc, f, log)
	case proto.TWatch:
		return s.notes.watch(c, rc, f, log)
	case proto.TProgress:
		return s.handleProgress(c, rc, f)
	}
	s.ls.NoteBadFrame()
	log.Warn().Stringer("type", f.Type).Msg("unknown message type")
	return proto.WriteMsg(c, proto.TError, f.ID, proto.Error{Code: proto.CodeUnknownType,
		Message: fmt.Sprintf("unknown message type 0x%02x; this agent knows %s (docs/PROTOCOL.md)", uint8(f.Type), proto.Requests())})
}

// Status is the payload of a status reply.
func (s *Server) Status() proto.Status {
	return proto.Status{
		Job: s.info.Job, Node: s.info.Node, Spec: s.info.Spec, AgentVersion: s.info.Version,
		PID: os.Getpid(), UptimeSeconds: time.Since(s.start).Seconds(),
		Clients: int(s.ls.Clients()), Connections: s.ls.Accepted(), BadFrames: s.ls.BadFrames(),
		MemoryBudget: s.info.MemoryBudget, StoreDir: s.info.StoreDir, Ranks: s.rankStatus(),
		Peering: s.peeringStatus(), GPU: s.gpuStatus(), PlacementWarnings: s.rings.placementWarnings(), Memory: s.memoryStatus(),
		Store: s.storeCounters(), LostNodes: s.notes.lostNodes(), Metrics: s.repl.schedMetrics(s.met.Status()),
	}
}

// memoryStatus is the store's bytes held and its use of the budget.
func (s *Server) memoryStatus() *proto.Memory {
	if s.store == nil {
		return nil
	}
	m := &proto.Memory{Budget: s.info.MemoryBudget}
	for _, k := range s.store.Keys() {
		for _, g := range s.store.Generations(k) {
			if !g.Bad {
				m.Held += payloadBytes(g.Manifest.Buffers)
			}
		}
	}
	if a := s.store.Allocator(); a != nil {
		am := a.Metrics()
		m.InUse = am.BudgetInUseBytes.Load()
		if m.InUse == 0 { // no budget attached (tests): what is mapped
			m.InUse = am.ArenaBytes.Load()
		}
		m.PinnedBytes, m.UnpinnedArenas, m.HugePageArenas = am.PinnedBytes.Load(), am.UnpinnedArenas.Load(), am.HugePageArenas.Load()
		m.BudgetRefusals = am.BudgetRefusals.Load()
	}
	return m
}

// storeCounters is the store's event counters (tmpfs.Metrics).
func (s *Server) storeCounters() *proto.StoreCounters {
	if s.store == nil {
		return nil
	}
	m := s.store.Metrics()
	return &proto.StoreCounters{
		Saves: m.Saves.Load(), Commits: m.Commits.Load(),
		SaveFailures: m.SaveFailures.Load(), NoSpace: m.NoSpace.Load(), OverBudget: m.OverBudget.Load(),
		Restores: m.Restores.Load(), ChecksumFailures: m.ChecksumFailures.Load(), BadGenerations: m.BadGenerations.Load(),
		Discarded: m.Discarded.Load(),
	}
}

func (s *Server) gpuStatus() *proto.GPU {
	if s.gpu == nil {
		return nil
	}
	return s.gpu()
}

func (s *Server) peeringStatus() *proto.Peering {
	if s.peering == nil {
		return nil
	}
	return s.peering()
}

func (s *Server) rankStatus() []proto.RankStatus {
	if s.store == nil {
		return nil
	}
	var out []proto.RankStatus
	progress := s.progress.status(time.Now())
	for _, k := range s.store.Keys() {
		if k.Shard != tmpfs.DefaultShard {
			continue
		}
		rs := proto.RankStatus{Rank: k.Rank, Newest: -1, Generations: []int64{}, Protection: s.regs.protection(k.Rank), Progress: progress[k.Rank]}
		for _, g := range s.store.Generations(k) {
			if g.Bad {
				continue
			}
			if rs.Newest < 0 {
				rs.Newest, rs.Bytes = g.Step, payloadBytes(g.Manifest.Buffers)
			}
			rs.Generations = append(rs.Generations, g.Step)
		}
		out = append(out, rs)
	}
	return out
}

// SocketPath is where the agent of a job listens: <runDir>/<job>/agent.sock.
func SocketPath(runDir, job string) string { return runpath.SocketPath(runDir, job) }

// JobRunDir is the per-job runtime directory (mode 0700, the job's user).
func JobRunDir(runDir, job string) string { return runpath.JobRunDir(runDir, job) }
