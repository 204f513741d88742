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
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/agent/localsrv"
	"github.com/reft-hpc/reft/agent/metrics"
	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/agent/runpath"
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

// Server serves the local protocol (docs/PROTOCOL.md) on a Unix socket:
// the composition root of the agent's parts. It dispatches each frame of a
// connection (one rank, or one reft command) on that connection's
// goroutine to the part that serves it: snapshot requests to snaps, watch
// to notes, progress and comm notices to the progress table and the
// replicator. The parts share what was attached (attached) and never call
// back into the Server.
type Server struct {
	*attached
	// met records the timings and counts of the status reply's metrics
	// section (agent/metrics).
	met   *metrics.Recorder
	log   zerolog.Logger
	start time.Time
	// ls is the local socket (agent/localsrv); the server is its Handler.
	ls *localsrv.Server

	// snaps serves the ranks' snapshot requests (snapshots.go).
	snaps *snapshots
	// views are the sharding groups' watermark views, rs the sharded
	// restores over them (sharded_restore.go).
	views *views
	rs    *restorer

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
	// logs are the ranks' message logs (msglog.go).
	logs *msgLogs

	// Failure detection (detecting.go): the ranks' progress, and the
	// peers the mesh found, for the detector.
	progress progressTable
	seen     sightings
}

// Listen creates the socket at path with mode 0600 (localsrv.Listen),
// serving the processes of info.UID only.
func Listen(path string, info Info, log zerolog.Logger) (*Server, error) {
	ls, err := localsrv.Listen(path, localsrv.Config{UID: info.UID, Job: info.Job, Log: log})
	if err != nil {
		return nil, err
	}
	a := &attached{info: info}
	s := &Server{attached: a, log: log, ls: ls, start: time.Now(), met: metrics.NewRecorder()}
	s.notes = newNotifier(log, s.met)
	s.regs = &registry{log: log}
	hosts, warned := &rankHosts{}, &onceWarnings{}
	s.rings = &rings{node: info.Node, peering: a.peeringStatus, noted: hosts.note, mesh: a.meshNow}
	s.views = &views{attached: a, rings: s.rings}
	s.repl = newReplicator(a, s.rings, s.views, hosts, warned, s.met, log)
	s.rs = &restorer{attached: a, views: s.views, rings: s.rings, hosts: hosts, progressEvery: restoreProgressEvery, log: log}
	s.snaps = &snapshots{attached: a, rs: s.rs, views: s.views, rings: s.rings, repl: s.repl, regs: s.regs,
		progress: &s.progress, met: s.met, warned: warned,
		degraded: &degradedState{status: func() []string { st := s.Status(); return metrics.Degraded(&st) }}}
	s.logs = &msgLogs{attached: a, regs: s.regs, warned: warned}
	return s, nil
}

// AttachStore gives the server the job's snapshot store; call it before
// Serve. Without one, snapshot and message log requests get a `disabled`
// error. The message logs an earlier agent of the job left in the store
// are adopted here, so that their memory counts against the budget
// before the first save, and the first status reply counts them.
func (s *Server) AttachStore(st *tmpfs.Store) {
	s.attached.AttachStore(st)
	if st == nil {
		return
	}
	if _, err := s.logs.open(s.log); err != nil {
		s.log.Error().Err(err).Msg("message log unavailable")
	}
}

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
	err := s.ls.Close()
	// After the connections: no request reads a message's arena now.
	if lerr := s.logs.close(); lerr != nil {
		s.log.Warn().Err(lerr).Msg("freeing the message logs")
	}
	return err
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
	s.repl.commPhase(rc, false, ss.log)
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
		s.repl.commPhase(rc, cm.Active, log)
		s.progress.comm(rc, cm.Active, cm.Op)
		return nil
	case proto.TRegister, proto.TSave, proto.TCommit, proto.TAbort, proto.TGenerations, proto.TRestore, proto.TRelease:
		return s.snaps.handle(ctx, c, rc, f, log)
	case proto.TLogAppend, proto.TLogCommit, proto.TLogRead, proto.TLogTruncate, proto.TLogSteps:
		return s.logs.handle(c, rc, f, log)
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
		MemoryBudget: s.info.MemoryBudget, StoreDir: s.info.StoreDir, Ranks: rankStatus(s.store, &s.progress, s.regs),
		Peering: s.peeringStatus(), GPU: s.gpuStatus(), PlacementWarnings: s.rings.placementWarnings(), Memory: memoryStatus(s.store, s.info.MemoryBudget),
		Store: storeCounters(s.store), LostNodes: s.notes.lostNodes(), Metrics: s.repl.schedMetrics(s.met.Status()),
		MsgLog: s.logs.status(),
	}
}

// memoryStatus is st's bytes held and its use of the budget (nil: no
// store).
func memoryStatus(st *tmpfs.Store, budget uint64) *proto.Memory {
	if st == nil {
		return nil
	}
	m := &proto.Memory{Budget: budget}
	for _, k := range st.Keys() {
		for _, g := range st.Generations(k) {
			if !g.Bad {
				m.Held += payloadBytes(g.Manifest.Buffers)
			}
		}
	}
	if a := st.Allocator(); a != nil {
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

// storeCounters is st's event counters (tmpfs.Metrics; nil: no store).
func storeCounters(st *tmpfs.Store) *proto.StoreCounters {
	if st == nil {
		return nil
	}
	m := st.Metrics()
	return &proto.StoreCounters{
		Saves: m.Saves.Load(), Commits: m.Commits.Load(),
		SaveFailures: m.SaveFailures.Load(), NoSpace: m.NoSpace.Load(), OverBudget: m.OverBudget.Load(),
		Restores: m.Restores.Load(), ChecksumFailures: m.ChecksumFailures.Load(), BadGenerations: m.BadGenerations.Load(),
		Discarded: m.Discarded.Load(),
	}
}

// rankStatus is the ranks section of the status reply: each rank's good
// generations in st (nil: no store), its protection and its progress.
func rankStatus(st *tmpfs.Store, pt *progressTable, regs *registry) []proto.RankStatus {
	if st == nil {
		return nil
	}
	var out []proto.RankStatus
	progress := pt.status(time.Now())
	for _, k := range st.Keys() {
		if k.Shard != tmpfs.DefaultShard {
			continue
		}
		rs := proto.RankStatus{Rank: k.Rank, Newest: -1, Generations: []int64{}, Protection: regs.protection(k.Rank), Progress: progress[k.Rank]}
		for _, g := range st.Generations(k) {
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
