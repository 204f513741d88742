package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/agent/detect"
	"github.com/reft-hpc/reft/agent/mesh"
	"github.com/reft-hpc/reft/agent/netsched"
	"github.com/reft-hpc/reft/agent/peer"
	"github.com/reft-hpc/reft/agent/peerconfig"
	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/tmpfs"
)

// peering runs the agent's mesh (agent/mesh). It starts in the background:
// learning the job's nodes asks slurmctld, which may be slow, and the
// agent's socket must answer the job's steps at once.
type peering struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu  sync.Mutex
	m   *mesh.Mesh
	off error // why peering is off; nil while starting or on
	det *detect.Detector
}

// startPeering starts the mesh over store; Close stops it. A failure turns
// peering off, said once in the log (event peering_off) and in the status
// reply; the agent keeps serving its node.
func startPeering(ctx context.Context, cfg config.Config, o Options, store *tmpfs.Store, srv *Server, log zerolog.Logger) *peering {
	p := &peering{done: make(chan struct{})}
	ctx, p.cancel = context.WithCancel(ctx)
	srv.AttachPeering(p.status)
	srv.AttachMesh(p.get)
	srv.notes.noticeFailures()
	go func() {
		defer close(p.done)
		m, err := openMesh(ctx, cfg, o, store, srv, log)
		if ctx.Err() != nil { // the agent is stopping: nothing to report
			if m != nil {
				m.Close()
			}
			return
		}
		var det *detect.Detector
		if err == nil {
			var derr error
			if det, derr = startDetector(ctx, cfg, m, srv, log); derr != nil {
				srv.notes.flushOnLost.Store(true)
				log.Warn().Str("event", "detect_off").Err(derr).
					Msg("failure detection between agents is off: reft run sees failures only through srun, and the ranks' JIT flush follows lost peer connections (a flap triggers it too)")
			}
		}
		p.mu.Lock()
		p.m, p.off, p.det = m, err, det
		p.mu.Unlock()
		if err != nil {
			log.Warn().Str("event", "peering_off").Err(err).
				Msg("peering with the job's other agents is off: snapshots stay on this node, and no peer can restore from it")
		}
	}()
	return p
}

func openMesh(ctx context.Context, cfg config.Config, o Options, store *tmpfs.Store, srv *Server, log zerolog.Logger) (*mesh.Mesh, error) {
	pc, err := peerconfig.FromAgentConfig(cfg, peer.Config{Job: o.Job, UID: o.UID, Node: o.Node, Log: log})
	if err != nil {
		return nil, err
	}
	if err := srv.SetBackground(cfg.Protect); err != nil {
		return nil, err
	}
	if cfg.Protect.BackgroundSchedule == config.ScheduleIdle {
		d := netsched.Default
		bw := "the link's bandwidth measured from the replication connections"
		if l := int64(cfg.Protect.LinkBandwidth); l > 0 {
			bw = fmt.Sprintf("link_bandwidth, %d bytes/s", l)
		}
		log.Info().Str("event", "replication_schedule").Str("schedule", config.ScheduleIdle).Int64("link_bandwidth", int64(cfg.Protect.LinkBandwidth)).
			Msgf("background replication is scheduled into the network's idle spans once the communication timeline is learned (%d repetitions of the step's phases, from the ranks' comm_phase reports), planned at %s; until then, and in a job that reports no phases, it only pauses during phases", d.ProfileSteps, bw)
	}
	srv.PeerHooks(&pc)
	// `reft status` asks every agent for this over the mesh port.
	pc.Status = func() any { return srv.Status() }
	if err := checkAuth(ctx, pc.Auth, o.UID); err != nil {
		return nil, err
	}
	// The ranks' JIT flush follows the detector's published verdicts
	// (noticeFailures), which need a quorum of the agents: a lost
	// connection is only a flap, or this node's own isolation, until then.
	// Without a detector a lost connection is all there is
	// (notifier.flushOnLost, said in detect_off).
	mc := mesh.Config{Peer: pc, Hosted: srv.rings.Hosted,
		PeerLost:  srv.notes.peerLost,
		PeerFound: func(node string) { srv.notes.PeerRecovered(node); srv.seen.found(node) }}
	return mesh.Start(ctx, mc, mesh.Slurm{Job: o.Job, Conf: cfg.Agent.SlurmConf}, store, log)
}

// checkAuth makes and opens one credential, so that a broken MUNGE setup
// (no munge program, munged down) turns peering off with its cause at
// start rather than failing every handshake later.
func checkAuth(ctx context.Context, a peer.Authenticator, uid int) error {
	msg := []byte("reft-agent self-check")
	tok, err := a.Seal(ctx, msg)
	if err != nil {
		return fmt.Errorf("peer authentication (agent.peer_auth = %q) does not work here: %w", a.Method(), err)
	}
	got, by, err := a.Open(ctx, tok)
	switch {
	case err != nil:
		return fmt.Errorf("peer authentication (agent.peer_auth = %q) cannot check its own credential: %w", a.Method(), err)
	case by != uid || string(got) != string(msg):
		return fmt.Errorf("peer authentication (agent.peer_auth = %q): our own credential reads as uid %d, want %d", a.Method(), by, uid)
	}
	return nil
}

// get is the mesh once it runs; nil while it starts or when peering is off.
func (p *peering) get() *mesh.Mesh {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.m
}

// Close stops the mesh, waiting for a start in progress.
func (p *peering) Close() {
	if p == nil {
		return
	}
	p.cancel()
	<-p.done
	p.mu.Lock()
	m, det := p.m, p.det
	p.mu.Unlock()
	if det != nil { // before the mesh it calls over
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		det.Leave(ctx) // a clean stop is no failure for the others
		cancel()
		det.Close()
	}
	if m != nil {
		m.Close()
	}
}

func (p *peering) status() *proto.Peering {
	p.mu.Lock()
	m, off := p.m, p.off
	p.mu.Unlock()
	switch {
	case off != nil:
		return &proto.Peering{State: proto.PeeringOff, Reason: off.Error()}
	case m == nil:
		return &proto.Peering{State: proto.PeeringStarting}
	}
	self := m.Self()
	st := &proto.Peering{State: proto.PeeringOn, Listen: net.JoinHostPort(self.Addr, strconv.Itoa(m.Addr().Port)), Peers: []proto.PeerStatus{}}
	for _, ps := range m.Peers() {
		e := proto.PeerStatus{Node: ps.Node.Name, Index: ps.Node.Index, Addr: ps.Addr, Connected: ps.Connected, Met: ps.Met}
		if ps.Err != nil && !errors.Is(ps.Err, context.Canceled) {
			e.Error = ps.Err.Error()
		}
		st.Peers = append(st.Peers, e)
	}
	return st
}
