// Package agent is the per-node, per-job reft daemon: its local Unix socket
// server now, its snapshot store and peer protocol later.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/agent/detect"
	"github.com/reft-hpc/reft/agent/mesh"
	"github.com/reft-hpc/reft/agent/persist"
	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/agent/runpath"
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
}

// Server serves the local protocol (docs/PROTOCOL.md) on a Unix socket.
type Server struct {
	info    Info
	store   *tmpfs.Store          // nil: snapshots disabled
	peering func() *proto.Peering // nil: no peering (snapshots disabled)
	gpu     func() *proto.GPU     // nil: no GPU section
	// persist is the persistent tier (agent/persist); nil: off.
	persist *persist.Persister
	log     zerolog.Logger
	ln      *net.UnixListener
	path    string
	start   time.Time

	mu    sync.Mutex
	conns map[net.Conn]struct{}

	clients     atomic.Int64
	accepted    atomic.Uint64
	badFrames   atomic.Uint64
	closed      atomic.Bool
	connTimeout time.Duration

	// layout lays registered buffers out in the arena; nil: identity
	// (SetTestLayout).
	layout layoutFunc

	// mesh is the job's agent mesh, for sharded restores (AttachMesh).
	mesh      func() *mesh.Mesh
	viewMu    sync.Mutex
	viewCache map[string]*storeView // per sharding group: its members' watermarks, briefly cached
	// progressEvery is how often a running restore reports progress
	// (restoreProgressEvery; 0: at every arrival).
	progressEvery time.Duration
	specOnce      sync.Once
	jobSpec       spec.Spec

	// repl is background replication (replicate.go): the limiter, the
	// communication phases and the copies of other nodes' ranks.
	repl *replicator

	// Sharding-group rings (ring.go): the site's failure domains, the
	// groups this agent saves or restores for, the ranks registered here
	// since it started (rank -> registrations) and their groups (a rank
	// that finished, or whose process is between a crash and its restart,
	// still ran here), and the bounded wait for a
	// group's members to register (0: ringWaitDefault).
	topo        config.Topology
	groupsMu    sync.Mutex
	groups      map[string]*groupState
	hosted      map[int]int
	hostedGroup map[int]string
	ringWait    time.Duration

	// Notices (notices.go): the watching connections, and the failed
	// nodes already notified.
	noticeMu    sync.Mutex
	watchers    map[*watcher]struct{}
	failedPeers map[string]time.Time
	// regs is each rank's last registration on this node, for the status
	// reply's protection (a rank's connection owns its rankConn; this is
	// the copy others may read).
	regMu    sync.Mutex
	regs     map[int]*proto.RankProtection
	regOwner map[int]*rankConn // the connection each entry came from

	// Failure detection (detecting.go): the ranks' progress, and what
	// learns of a failure.
	progress     progressTable
	failureHooks []func(detect.Failure)
	// lost: the nodes whose loss the detector published (the status
	// reply's lost_nodes), in the order learned.
	lostMu sync.Mutex
	lost   []string
	// found: when the mesh last connected to each peer's agent, and det
	// the detector once it runs (it learns of those connections).
	foundMu sync.Mutex
	found   map[string]time.Time
	det     *detect.Detector
	// flushOnLost: no detector runs (detect.enabled = false, or it could
	// not start), so a lost peer connection is the JIT flush's failure
	// signal after all; said once, in the detect_off event.
	flushOnLost atomic.Bool
}

// Listen creates the socket at path with mode 0600. A stale socket at path
// (nobody answers) is replaced; a live one is an error.
func Listen(path string, info Info, log zerolog.Logger) (*Server, error) {
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("socket %s: another agent is already listening there", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("removing stale socket %s: %w", path, err)
	}
	old := unix.Umask(0o177) // the socket is born 0600: no window with a wider mode
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w (is agent.run_dir in reft.toml on a local filesystem the user can write?)", path, err)
	}
	ln.SetUnlinkOnClose(true)
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("chmod 0600 %s: %w", path, err)
	}
	s := &Server{info: info, log: log, ln: ln, path: path, start: time.Now(),
		conns: map[net.Conn]struct{}{}, connTimeout: 0, progressEvery: restoreProgressEvery,
		watchers: map[*watcher]struct{}{}, failedPeers: map[string]time.Time{}}
	s.repl = newReplicator(s)
	return s, nil
}

// AttachStore gives the server the job's snapshot store; call it before
// Serve. Without one, snapshot requests get a `disabled` error.
func (s *Server) AttachStore(st *tmpfs.Store) { s.store = st }

// AttachPeering gives the status reply its peering section; call it
// before Serve.
func (s *Server) AttachPeering(f func() *proto.Peering) { s.peering = f }

// AttachGPU gives the status reply its GPU health section; call it before
// Serve.
func (s *Server) AttachGPU(f func() *proto.GPU) { s.gpu = f }

// Path returns the socket path.
func (s *Server) Path() string { return s.path }

// Serve accepts connections until ctx is done or Close is called.
func (s *Server) Serve(ctx context.Context) error {
	go func() {
		<-ctx.Done()
		s.Close()
	}()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			if s.closed.Load() || ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			s.log.Error().Err(err).Msg("accept failed; stopping the socket server")
			return fmt.Errorf("accept on %s: %w", s.path, err)
		}
		s.accepted.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.serveConn(c)
		}()
	}
}

// Close stops accepting, closes every connection and removes the socket.
func (s *Server) Close() error {
	// Every caller waits for the replicator: the store closes after Close.
	defer s.repl.stop()
	if s.closed.Swap(true) {
		return nil
	}
	err := s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	return err
}

// PeerCred returns the credentials of the process at the other end of c.
func PeerCred(c *net.UnixConn) (*unix.Ucred, error) { return runpath.PeerCred(c) }

func (s *Server) serveConn(c *net.UnixConn) {
	defer c.Close()
	cred, err := PeerCred(c)
	if err != nil {
		s.log.Error().Err(err).Msg("SO_PEERCRED failed; closing the connection")
		return
	}
	log := s.log.With().Int32("peer_pid", cred.Pid).Uint32("peer_uid", cred.Uid).Logger()
	if int(cred.Uid) != s.info.UID {
		log.Warn().Int("job_uid", s.info.UID).Msg("refused a connection from another uid")
		_ = proto.WriteMsg(c, proto.TError, 0, proto.Error{Code: proto.CodeForbidden,
			Message: fmt.Sprintf("uid %d may not use the agent of job %s (owned by uid %d)", cred.Uid, s.info.Job, s.info.UID)})
		return
	}
	s.mu.Lock()
	if s.closed.Load() {
		s.mu.Unlock()
		return
	}
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	s.clients.Add(1)
	defer func() {
		s.clients.Add(-1)
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
	}()
	log.Debug().Msg("client connected")
	rc := &rankConn{pid: cred.Pid}
	defer rc.close()
	defer s.commPhase(rc, false, log) // a rank that died mid-collective must not hold replication paused
	defer s.unwatch(rc)
	defer s.noteGone(rc)
	defer s.progress.drop(rc)
	for {
		f, err := proto.Decode(c)
		if err != nil {
			if errors.Is(err, os.ErrClosed) || errors.Is(err, net.ErrClosed) {
				return
			}
			if f.ID == 0 && errors.Is(err, io.EOF) {
				log.Debug().Msg("client disconnected")
				return
			}
			s.badFrames.Add(1)
			code := proto.CodeMalformed
			if errors.Is(err, proto.ErrVersion) {
				code = proto.CodeVersion
			}
			log.Warn().Err(err).Uint32("id", f.ID).Msg("malformed frame")
			_ = proto.WriteMsg(c, proto.TError, f.ID, proto.Error{Code: code, Message: err.Error()})
			if proto.Fatal(err) {
				return
			}
			continue
		}
		if err := s.handle(c, rc, f, log); err != nil {
			log.Debug().Err(err).Msg("writing a reply failed; closing")
			return
		}
	}
}

func (s *Server) handle(c net.Conn, rc *rankConn, f proto.Frame, log zerolog.Logger) error {
	switch f.Type {
	case proto.THello:
		var h proto.Hello
		if err := f.Unmarshal(&h); err != nil {
			s.badFrames.Add(1)
			log.Warn().Err(err).Msg("malformed hello")
			return proto.WriteMsg(c, proto.TError, f.ID, proto.Error{Code: proto.CodeMalformed, Message: err.Error()})
		}
		log.Info().Str("client", h.Client).Int("pid", h.PID).Str("client_step", h.Step).Int("rank", h.Rank).Msg("hello")
		return proto.WriteMsg(c, proto.THelloReply, f.ID, proto.HelloReply{
			Protocol: proto.Version, Job: s.info.Job, Node: s.info.Node, Spec: s.info.Spec,
			AgentVersion: s.info.Version, Restart: s.info.Restart})
	case proto.TStatus:
		return proto.WriteMsg(c, proto.TStatusReply, f.ID, s.Status())
	case proto.TComm:
		// A notice: no reply, so a trainer pays no round trip for it.
		var cm proto.Comm
		if err := f.Unmarshal(&cm); err != nil {
			s.badFrames.Add(1)
			log.Warn().Err(err).Msg("malformed comm notice (not answered: comm has no reply)")
			return nil
		}
		s.commPhase(rc, cm.Active, log)
		return nil
	case proto.TRegister, proto.TSave, proto.TCommit, proto.TAbort, proto.TGenerations, proto.TRestore, proto.TRelease:
		return s.handleSnapshot(c, rc, f, log)
	case proto.TWatch:
		return s.handleWatch(c, rc, f, log)
	case proto.TProgress:
		return s.handleProgress(c, rc, f)
	}
	s.badFrames.Add(1)
	log.Warn().Stringer("type", f.Type).Msg("unknown message type")
	return proto.WriteMsg(c, proto.TError, f.ID, proto.Error{Code: proto.CodeUnknownType,
		Message: fmt.Sprintf("unknown message type 0x%02x; this agent knows %s (docs/PROTOCOL.md)", uint8(f.Type), proto.Requests())})
}

// Status is the payload of a status reply.
func (s *Server) Status() proto.Status {
	return proto.Status{
		Job: s.info.Job, Node: s.info.Node, Spec: s.info.Spec, AgentVersion: s.info.Version,
		PID: os.Getpid(), UptimeSeconds: time.Since(s.start).Seconds(),
		Clients: int(s.clients.Load()), Connections: s.accepted.Load(), BadFrames: s.badFrames.Load(),
		MemoryBudget: s.info.MemoryBudget, StoreDir: s.info.StoreDir, Ranks: s.rankStatus(),
		Peering: s.peeringStatus(), GPU: s.gpuStatus(), PlacementWarnings: s.placementWarnings(), Memory: s.memoryStatus(),
		Store: s.storeCounters(), LostNodes: s.lostNodes(),
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

// noteRegistered records a rank's registration for the status reply.
func (s *Server) noteRegistered(rc *rankConn, rank, world int, si *sgInfo) {
	p := &proto.RankProtection{Connected: true, World: world, Mode: proto.ProtectLocal}
	if si != nil {
		c := si.layout.Coord(rank)
		p.Layout = fmt.Sprintf("dp=%d pp=%d tp=%d", si.layout.DP, si.layout.PP, si.layout.TP)
		p.Group, p.Position, p.Members = fmt.Sprintf("(pp=%d,tp=%d)", c.PP, c.TP), si.pos, slices.Clone(si.members)
		p.ARC, p.AEC, p.AOR = si.arc && !si.whole, si.k, si.aor != nil
		p.Mode = proto.ProtectSharded
		if si.whole {
			p.Mode = proto.ProtectWhole
		}
	}
	s.regMu.Lock()
	if s.regs == nil {
		s.regs, s.regOwner = map[int]*proto.RankProtection{}, map[int]*rankConn{}
	}
	if old := s.regOwner[rank]; old != nil && old != rc && s.regs[rank].Connected {
		s.log.Warn().Str("event", "rank_fenced").Int("rank", rank).Int32("pid", rc.pid).Int32("fenced_pid", old.pid).
			Msgf("rank %d registered again by pid %d while pid %d's registration is still connected: pid %d is fenced (its saves, commits, restores and releases are refused)",
				rank, rc.pid, old.pid, old.pid)
	}
	s.regs[rank], s.regOwner[rank] = p, rc
	s.regMu.Unlock()
}

// fencedBy returns the connection that registered rc's rank after rc did,
// or nil while rc is the rank's registration.
func (s *Server) fencedBy(rc *rankConn) *rankConn {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	if o := s.regOwner[rc.key.Rank]; o != nil && o != rc {
		return o
	}
	return nil
}

// noteGone marks a registered rank's connection closed.
func (s *Server) noteGone(rc *rankConn) {
	if !rc.registered {
		return
	}
	s.regMu.Lock()
	// Only the connection that registered last: a rank's old connection
	// may finish closing after its restarted process registered again.
	if p := s.regs[rc.key.Rank]; p != nil && s.regOwner[rc.key.Rank] == rc {
		p.Connected = false
	}
	s.regMu.Unlock()
}

func (s *Server) protection(rank int) *proto.RankProtection {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	p := s.regs[rank]
	if p == nil {
		return nil
	}
	c := *p
	c.Members = slices.Clone(p.Members)
	return &c
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
	for _, k := range s.store.Keys() {
		if k.Shard != tmpfs.DefaultShard {
			continue
		}
		rs := proto.RankStatus{Rank: k.Rank, Newest: -1, Generations: []int64{}, Protection: s.protection(k.Rank)}
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
