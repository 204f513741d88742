package agent

import (
	"bytes"
	"context"
	"net"
	"os"
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
// progress until its connection closes. It also keeps each rank's recent
// step times (between its reports), whose median scales the rank's hang timeout
// (detect.HangTimeout), and whether the rank is in a communication phase,
// which a hang verdict reports as where the rank was.
type progressTable struct {
	mu    sync.Mutex
	ranks map[int]*progressEntry
	// proc reads a process's state; nil: procState.
	proc func(pid int32) string
}

// stepSamples is how many recent step times a rank's median is taken over:
// enough that one slow step (an evaluation, a checkpoint to disk) does not
// move it, few enough that it follows a job whose step time changes.
const stepSamples = 15

// minStepSamples is how many step times a median needs; before that the
// hang timeout is the floor (the first steps include warm-up).
const minStepSamples = 3

type progressEntry struct {
	rc     *rankConn // the connection that reported it
	step   int64
	at     time.Time       // the last report
	stepAt time.Time       // the first report of step
	times  []time.Duration // the last stepSamples step times, oldest first
	comm   bool            // in a communication phase (comm_phase)
	op     string          // the collective the last phase named ("": none)
	// commEnd is when the last communication phase ended; compute the
	// last stepSamples spans from one phase's end to the next one's
	// start: the rank's own work per step, without the waits for other
	// ranks that synchronous training puts in the collectives (a
	// straggler's is longer than the others').
	commEnd time.Time
	compute []time.Duration
}

func (t *progressTable) note(rc *rankConn, rank int, step int64) {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ranks == nil {
		t.ranks = map[int]*progressEntry{}
	}
	e := t.ranks[rank]
	if e == nil || e.rc != rc {
		t.ranks[rank] = &progressEntry{rc: rc, step: step, at: now, stepAt: now}
		return
	}
	// A step time is the time between the first reports of successive
	// reported steps: a rank that saves every fifth step and calls
	// progress() never has a "step time" of five steps, which is the
	// silence hang detection must expect between its reports.
	if step > e.step {
		e.times = appendSample(e.times, now.Sub(e.stepAt))
		e.stepAt = now
	}
	e.step, e.at = step, now
}

// comm records that rc's rank entered (naming the collective op, or "")
// or left a communication phase.
func (t *progressTable) comm(rc *rankConn, active bool, op string) {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, e := range t.ranks {
		if e.rc != rc || e.comm == active {
			continue
		}
		e.comm = active
		if active {
			e.op = op
		}
		switch {
		case !active:
			e.commEnd = now
		case !e.commEnd.IsZero():
			e.compute = appendSample(e.compute, now.Sub(e.commEnd))
		}
	}
}

// where says what the rank was doing at its last sign, for a hang
// verdict: inside a collective (named when the client named it), or in
// its own work after one ended; "" when it reports no phases.
func (e *progressEntry) where() string {
	last := "its last communication phase"
	if e.op != "" {
		last = "its last collective (" + e.op + ")"
	}
	switch {
	case e.comm && e.op != "":
		return "in the collective " + e.op
	case e.comm:
		return "in a communication phase"
	case !e.commEnd.IsZero():
		return "outside its collectives (its own computation or I/O) since " + last + " ended"
	}
	return ""
}

// appendSample adds d to the last stepSamples samples ds.
func appendSample(ds []time.Duration, d time.Duration) []time.Duration {
	if len(ds) == stepSamples {
		ds = append(ds[:0], ds[1:]...)
	}
	return append(ds, d)
}

// status is the ranks' progress for the agent's status reply, by rank.
func (t *progressTable) status(now time.Time) map[int]*proto.RankProgress {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[int]*proto.RankProgress, len(t.ranks))
	for r, e := range t.ranks {
		out[r] = &proto.RankProgress{Step: e.step, SilentS: now.Sub(e.at).Seconds(),
			StepTimeS: median(e.times).Seconds(), ComputeS: median(e.compute).Seconds(), InComm: e.comm, Where: e.where()}
	}
	return out
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

// list is the detector's view (detect.Config.Progress). It reads each
// rank's process state from /proc: the agent runs as the ranks' user on
// their node, and the pid is the kernel's (SO_PEERCRED) for a connection
// still open, so it names the rank's process.
func (t *progressTable) list() []detect.Progress {
	proc := t.proc
	if proc == nil {
		proc = procState
	}
	t.mu.Lock()
	out := make([]detect.Progress, 0, len(t.ranks))
	pids := make([]int32, 0, len(t.ranks))
	for r, e := range t.ranks {
		p := detect.Progress{Rank: r, Step: e.step, At: e.at, StepTime: median(e.times), Where: e.where()}
		out = append(out, p)
		pids = append(pids, e.rc.pid)
	}
	t.mu.Unlock()
	for i := range out {
		if pids[i] > 0 {
			out[i].Process = proc(pids[i])
		}
	}
	return out
}

// median is the middle of ds (the mean of the two middle ones for an even
// count); 0 for fewer than minStepSamples.
func median(ds []time.Duration) time.Duration {
	if len(ds) < minStepSamples {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// procState is the state of process pid (detect.Proc*), from field 3 of
// /proc/PID/stat; "" when it cannot be read (the process is gone). It is
// the main thread's: the one that runs a Python trainer's loop; a stop
// signal stops every thread. A helper thread in I/O (a data loader) does
// not make the rank look frozen.
func procState(pid int32) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(int(pid)) + "/stat")
	if err != nil {
		return ""
	}
	return parseProcState(b)
}

// parseProcState reads the state letter of a /proc/PID/stat line. The
// command name (field 2) is in parentheses and may hold spaces and
// parentheses itself, so the state follows the last ')'.
func parseProcState(b []byte) string {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) || b[i+1] != ' ' {
		return ""
	}
	switch b[i+2] {
	case 'R':
		return detect.ProcRunning
	case 'S', 'I':
		return detect.ProcSleeping
	case 'D':
		return detect.ProcDiskSleep
	case 'T', 't':
		return detect.ProcStopped
	case 'Z', 'X':
		return detect.ProcZombie
	}
	return ""
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
	// Under every=0 the first save is a JIT flush after a failure, when a
	// dead member can no longer register and the ring decision (which a
	// save makes first, ensureRing) would wait out ringWait for it, longer
	// than the flush may take: fix the group's ring at the heartbeats.
	if s.spec().JITOnly() {
		if err := s.snaps.ensureRing(rc, s.log); err != nil {
			return replyErr(c, f.ID, storeErr(err), "progress of rank %d step %d: %v", rc.key.Rank, req.Step, err)
		}
	}
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

// sightings are when the mesh last connected to each peer's agent, for
// the detector, which starts after the mesh has found its first peers.
// Safe for concurrent use: found runs on the mesh's goroutines, attach
// once, when peering starts the detector; neither blocks but on mu.
type sightings struct {
	mu  sync.Mutex
	at  map[string]time.Time
	det *detect.Detector // nil until attach
}

// found records that the mesh connected to node's agent, and tells the
// detector (now, or when it starts).
func (p *sightings) found(node string) {
	now := time.Now()
	p.mu.Lock()
	if p.at == nil {
		p.at = map[string]time.Time{}
	}
	p.at[node] = now
	d := p.det
	p.mu.Unlock()
	if d != nil {
		d.Seen(node, now)
	}
}

// attach hands d the peers the mesh has connected to so far, and the
// later ones as they come.
func (p *sightings) attach(d *detect.Detector) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.det = d
	for n, at := range p.at {
		d.Seen(n, at)
	}
}

// lostNodes are the nodes whose loss the detector published.
func (s *notifier) lostNodes() []string {
	s.lostMu.Lock()
	defer s.lostMu.Unlock()
	return slices.Clone(s.lost)
}

// peerFailed takes a verdict: the lost node and the metrics first, then
// the hooks, so that a hook that snapshots the status (the metrics
// textfile's kick, registered before peering's) sees the whole verdict: a
// kick that ran before the lost node was added wrote reft_lost_nodes 0
// beside one failure counted, the file reft run's stop then left.
func (s *notifier) peerFailed(f detect.Failure) {
	if f.Class == detect.ClassNode {
		s.lostMu.Lock()
		if !slices.Contains(s.lost, f.Node) {
			s.lost = append(s.lost, f.Node)
		}
		s.lostMu.Unlock()
	}
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
		Hang: cfg.Detect.Hang.D(), HangFactor: cfg.Detect.HangFactor, Progress: srv.progress.list, OnFailure: srv.notes.peerFailed, Record: srv.rec, Log: log})
	if err != nil {
		return nil, err
	}
	if err := d.Register(m.Server()); err != nil {
		return nil, err
	}
	srv.seen.attach(d)
	d.Start(ctx)
	return d, nil
}
