package agent

import (
	"context"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/agent/detect"
	"github.com/reft-hpc/reft/agent/mesh"
	"github.com/reft-hpc/reft/agent/proto"
)

// progressTable is every local rank's last progress (a save or a progress
// message), the input of hang detection. A rank is watched from its first
// progress until its connection closes.
type progressTable struct {
	mu    sync.Mutex
	ranks map[int]progressEntry
}

type progressEntry struct {
	rc   *rankConn // the connection that reported it
	step int64
	at   time.Time
}

func (t *progressTable) note(rc *rankConn, rank int, step int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ranks == nil {
		t.ranks = map[int]progressEntry{}
	}
	t.ranks[rank] = progressEntry{rc: rc, step: step, at: time.Now()}
}

// drop forgets the ranks whose progress came from rc, which closed: a
// rank that exited is not hung (srun and reft run see its exit).
func (t *progressTable) drop(rc *rankConn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for r, e := range t.ranks {
		if e.rc == rc {
			delete(t.ranks, r)
		}
	}
}

func (t *progressTable) list() []detect.Progress {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]detect.Progress, 0, len(t.ranks))
	for r, e := range t.ranks {
		out = append(out, detect.Progress{Rank: r, Step: e.step, At: e.at})
	}
	return out
}

// handleProgress serves the client's progress heartbeat.
func (s *Server) handleProgress(c net.Conn, rc *rankConn, f proto.Frame) error {
	req := proto.StepReq{Step: -1}
	if err := f.Unmarshal(&req); err != nil {
		return replyErr(c, f.ID, proto.CodeMalformed, "%v", err)
	}
	switch {
	case req.Step < 0:
		return replyErr(c, f.ID, proto.CodeInvalid, "progress: step = %d must not be negative", req.Step)
	case !rc.registered:
		return replyErr(c, f.ID, proto.CodeBadState, "progress before register: the agent knows a rank by its registration")
	}
	s.progress.note(rc, rc.key.Rank, req.Step)
	return proto.WriteMsg(c, proto.TProgress|proto.ReplyBit, f.ID, req)
}

// OnPeerFailure adds fn to what the agent calls for every failure its
// detector learns of (a peer's node or agent lost, a rank hung), once
// each, on every agent of the job. Call it before the agent starts; fn
// must not block.
func (s *notifier) OnPeerFailure(fn func(detect.Failure)) {
	s.hooks = append(s.hooks, fn)
}

// noticeFailures hands the detector's published verdicts to the ranks'
// JIT flush (notices.go), each node once: the flush never acts on a lost
// connection alone (a flap, or this node cut off) while a detector runs,
// and a fenced agent (agent/detect.Detector) publishes nothing of its own.
func (s *notifier) noticeFailures() {
	s.OnPeerFailure(func(f detect.Failure) {
		if f.Class == detect.ClassNode {
			s.lostMu.Lock()
			if !slices.Contains(s.lost, f.Node) {
				s.lost = append(s.lost, f.Node)
			}
			s.lostMu.Unlock()
		}
		s.NotifyPeerFailure(f.Node, "failure_detected ("+f.Class+"): "+f.Cause)
	})
}

// peerLost is the mesh's lost connection to node's agent: a failure
// signal for the JIT flush only when no detector runs (flushOnLost).
func (s *notifier) peerLost(node string, err error) {
	if s.flushOnLost.Load() {
		s.NotifyPeerFailure(node, "peer_lost: "+err.Error())
	}
}

// peerFound records that the mesh connected to node's agent, and tells the
// detector (now, or when it starts).
func (s *Server) peerFound(node string) {
	now := time.Now()
	s.foundMu.Lock()
	if s.found == nil {
		s.found = map[string]time.Time{}
	}
	s.found[node] = now
	d := s.det
	s.foundMu.Unlock()
	if d != nil {
		d.Seen(node, now)
	}
}

// attachDetector hands d the peers the mesh has connected to so far, and
// the later ones as they come.
func (s *Server) attachDetector(d *detect.Detector) {
	s.foundMu.Lock()
	defer s.foundMu.Unlock()
	s.det = d
	for n, at := range s.found {
		d.Seen(n, at)
	}
}

// lostNodes are the nodes whose loss the detector published.
func (s *notifier) lostNodes() []string {
	s.lostMu.Lock()
	defer s.lostMu.Unlock()
	return slices.Clone(s.lost)
}

func (s *notifier) peerFailed(f detect.Failure) {
	lat := -1.0 // unknown: not observed
	if !f.LastHeard.IsZero() && !f.DetectedAt.IsZero() {
		lat = max(f.Latency().Seconds(), 0)
	}
	s.met.Failure(f.Class, lat)
	for _, fn := range s.hooks {
		fn(f)
	}
}

// startDetector runs failure detection over the mesh, serving its frames
// on the mesh's listener; nil when detect.enabled is false.
func startDetector(ctx context.Context, cfg config.Config, m *mesh.Mesh, srv *Server, log zerolog.Logger) (*detect.Detector, error) {
	if !cfg.Detect.Enabled {
		srv.notes.flushOnLost.Store(true)
		log.Info().Str("event", "detect_off").
			Msg("failure detection between agents is off (detect.enabled = false): reft run sees failures only through srun, and the ranks' JIT flush follows lost peer connections (a flap triggers it too)")
		return nil, nil
	}
	var nodes []detect.Node
	for _, n := range m.Nodes() {
		dn := detect.Node{Name: n.Name, Index: n.Index}
		if n.SlurmdPort > 0 {
			dn.Slurmd = net.JoinHostPort(n.Addr, strconv.Itoa(n.SlurmdPort))
		}
		nodes = append(nodes, dn)
	}
	d, err := detect.New(detect.Config{Self: m.Self().Name, Nodes: nodes, Transport: m,
		Interval: cfg.Detect.Interval.D(), Timeout: cfg.Detect.Timeout.D(), Confirm: cfg.Detect.Confirm.D(), Window: cfg.Detect.Window.D(),
		Hang: cfg.Detect.Hang.D(), Progress: srv.progress.list, OnFailure: srv.notes.peerFailed, Record: srv.rec, Log: log})
	if err != nil {
		return nil, err
	}
	if err := d.Register(m.Server()); err != nil {
		return nil, err
	}
	srv.attachDetector(d)
	d.Start(ctx)
	return d, nil
}
