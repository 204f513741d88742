// Package mesh connects the agents of one job to each other: it learns the
// job's allocation (Slurm, or a fixed topology in tests), listens on this
// node's first free candidate port, finds every other node's agent on that
// node's candidates (docs/PEER_PROTOCOL.md, "Finding peers"), keeps watching
// the connections, and offers the agent/peer client calls by node name.
package mesh

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/event"
	"github.com/reft-hpc/reft/agent/peer"
	"github.com/reft-hpc/reft/tmpfs"
)

// Config configures a Mesh.
type Config struct {
	// Peer is the transport's configuration (peerconfig.FromAgentConfig): job,
	// uid, this node's name (Peer.Node, which must be in the topology),
	// authentication, bind address, port range and liveness timers. Start
	// sets Peer.Ports to this node's candidates.
	Peer peer.Config
	// MaxRetry is the longest pause between two searches for a peer that
	// was not found; 0: 5 s. The first retries come sooner (100 ms,
	// doubling), since a job's agents start within moments of each other.
	MaxRetry time.Duration
	// Watch is how often a found peer's connection is checked (no network
	// traffic while it is up); 0: Peer.Heartbeat, else 500 ms.
	Watch time.Duration
	// Grace is how long after Start a missing peer counts as still
	// starting: its failures are logged at info until then, at warn after.
	// 0: 10 s.
	Grace time.Duration
	// Hosted, when set, lists the ranks (of those asked; nil: all) that
	// run on this node now, with their sharding group's fixed ring; every
	// watermarks reply then carries them (peer.HostedSource).
	Hosted func(ranks []int) []peer.HostedRank
	// PeerLost, when set, is called (from the peer's watch goroutine; it
	// must not block) each time the connection to a found peer's agent is
	// lost: its agent or its node died, or it was restarted. The agent
	// turns it into failure notices for its ranks (JIT flush).
	PeerLost func(node string, err error)
	// PeerFound, when set, is called each time a peer's agent is found,
	// at start and after a loss.
	PeerFound func(node string)
}

// Timers of the search for a peer.
const (
	minRetry = 100 * time.Millisecond
	// foreignSkip: a candidate that another job's agent answered on is not
	// asked again for this long, so that a missing peer does not fill that
	// agent's log with refusals; the peer itself then sits on a later one.
	foreignSkip = time.Minute
)

// Mesh is this agent's view of the job's other agents: the listener, the
// client, and per other node a peerState that its own peerWatch goroutine
// keeps current (watch.go). The Mesh's methods only read peerStates and
// may be called from any goroutine; Close stops the watches and waits for
// them.
type Mesh struct {
	cfg   Config
	log   zerolog.Logger
	topo  Topology
	self  Node
	srv   *peer.Server
	cl    *peer.Client
	start time.Time
	peers map[string]*peerState // every node but this one, by name

	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// Start learns the topology, listens on this node's first free candidate
// port, serving store, and starts looking for every other node's agent in
// the background. It returns once the listener is up; peers connect later.
// The search stops when ctx ends or at Close, which also closes the
// connections and the listener.
func Start(ctx context.Context, cfg Config, topo TopologySource, store *tmpfs.Store, log zerolog.Logger) (*Mesh, error) {
	if store == nil {
		return nil, errors.New("mesh: no snapshot store to serve")
	}
	var src peer.ChunkSource = peer.StoreSource{Store: store}
	if cfg.Hosted != nil {
		src = hostedSource{src, cfg.Hosted}
	}
	return start(ctx, cfg, topo, src, log)
}

// hostedSource adds the agent's registered ranks to a ChunkSource.
type hostedSource struct {
	peer.ChunkSource
	hosted func(ranks []int) []peer.HostedRank
}

func (h hostedSource) Hosted(ranks []int) []peer.HostedRank { return h.hosted(ranks) }

func start(ctx context.Context, cfg Config, topo TopologySource, src peer.ChunkSource, log zerolog.Logger) (*Mesh, error) {
	if cfg.MaxRetry <= 0 {
		cfg.MaxRetry = 5 * time.Second
	}
	if cfg.Watch <= 0 {
		cfg.Watch = cfg.Peer.Heartbeat
		if cfg.Watch <= 0 {
			cfg.Watch = 500 * time.Millisecond
		}
	}
	if cfg.Grace <= 0 {
		cfg.Grace = 10 * time.Second
	}
	t, err := topo.Topology(ctx)
	if err != nil {
		return nil, err
	}
	if err := t.Check(); err != nil {
		return nil, err
	}
	self, ok := t.Node(cfg.Peer.Node)
	if !ok {
		names := make([]string, len(t.Nodes))
		for i, n := range t.Nodes {
			names[i] = n.Name
		}
		return nil, fmt.Errorf("mesh: this node %q is not in job %s's node list %s (is --node the Slurm node name?)",
			cfg.Peer.Node, cfg.Peer.Job, strings.Join(names, ","))
	}
	lo, hi := cfg.Peer.PortRange[0], cfg.Peer.PortRange[1]
	n := len(t.Nodes)
	cands := Candidates(cfg.Peer.Job, lo, hi, self.Index, n)
	if cands == nil {
		return nil, fmt.Errorf("mesh: agent.port_range [%d, %d] gives no candidate ports (want 1 <= low <= high <= 65535)", lo, hi)
	}
	if span := hi - lo + 1; span < NumCandidates*n {
		log.Warn().Str("event", "peer_port_range_small").Int("span", span).Int("nodes", n).
			Msgf("agent.port_range has %d ports, below %d per node for %d nodes: nodes of this job may compete for ports (widen it in reft.toml)", span, NumCandidates, n)
	}
	pcfg := cfg.Peer
	pcfg.Ports = cands
	srv, err := peer.Listen(pcfg, src)
	if err != nil {
		return nil, fmt.Errorf("mesh: node %s (index %d of %d): %w", self.Name, self.Index, n, err)
	}
	// The client's own warning on every failed handshake would repeat at
	// each retry of a search; the mesh logs each failure once, with cause.
	ccfg := pcfg
	ccfg.Log = pcfg.Log.Level(zerolog.ErrorLevel)
	cl, err := peer.NewClient(ccfg)
	if err != nil {
		srv.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	m := &Mesh{cfg: cfg, log: log.With().Str("component", "mesh").Logger(), topo: t, self: self,
		srv: srv, cl: cl, start: time.Now(), peers: map[string]*peerState{}, cancel: cancel}
	port := srv.Addr().Port
	k := indexOf(cands, port)
	m.log.Info().Str("event", event.PeerListening).Int("port", port).Str("addr", net.JoinHostPort(self.Addr, strconv.Itoa(port))).
		Int("index", self.Index).Int("nodes", n).Int("candidate", k).
		Msgf("peer listener on port %d (candidate %d of node %d of %d)", port, k, self.Index, n)
	for _, nd := range t.Nodes {
		if nd.Name == self.Name {
			continue
		}
		p := &peerState{node: nd, cands: Candidates(cfg.Peer.Job, lo, hi, nd.Index, n), kick: make(chan struct{}, 1),
			changed: make(chan struct{}), foreign: map[int]time.Time{}, err: errors.New("not looked for yet")}
		m.peers[nd.Name] = p
		w := &peerWatch{cl: cl, cfg: cfg, start: m.start, p: p,
			log: m.log.With().Str("peer_node", nd.Name).Logger(), backoff: minRetry}
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			w.run(ctx)
		}()
	}
	return m, nil
}

func indexOf(s []int, v int) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// Self is this node.
func (m *Mesh) Self() Node { return m.self }

// Nodes is the job's allocation, this node included, in Slurm's order.
func (m *Mesh) Nodes() []Node { return append([]Node(nil), m.topo.Nodes...) }

// Addr is this agent's peer listener.
func (m *Mesh) Addr() *net.TCPAddr { return m.srv.Addr() }

// Client is the transport client the mesh connects with; its calls take
// addresses, which Resolve and Source give by node name.
func (m *Mesh) Client() *peer.Client { return m.cl }

// Server is this agent's peer listener.
func (m *Mesh) Server() *peer.Server { return m.srv }

// PeerStatus is one other node's agent as the mesh sees it now.
type PeerStatus struct {
	Node      Node
	Addr      string // host:port of its listener; "" until found
	Connected bool
	// Met: connected at least once since this agent started. A node with
	// no agent yet (a spare that runs no step) was never met; a lost
	// one was.
	Met bool
	Err error // why it is not connected
}

// Peers lists every other node's agent, in the allocation's order.
func (m *Mesh) Peers() []PeerStatus {
	var out []PeerStatus
	for _, nd := range m.topo.Nodes {
		p := m.peers[nd.Name]
		if p == nil {
			continue
		}
		out = append(out, p.status())
	}
	return out
}

// Resolve returns the address of node's agent, waiting until it is found
// or ctx ends (then the error says why it was not found). This node
// resolves to its own listener.
func (m *Mesh) Resolve(ctx context.Context, node string) (string, error) {
	return m.resolve(ctx, node, false)
}

// resolve is Resolve; with refusedEnds, a search made during the call
// that found every candidate port refused (nothing listens: the agent is
// gone, or not up yet) ends the wait at once with that error, which
// matches syscall.ECONNREFUSED.
func (m *Mesh) resolve(ctx context.Context, node string, refusedEnds bool) (string, error) {
	if node == m.self.Name {
		return net.JoinHostPort(m.self.Addr, strconv.Itoa(m.srv.Addr().Port)), nil
	}
	p := m.peers[node]
	if p == nil {
		return "", fmt.Errorf("mesh: node %q is not in job %s's allocation", node, m.cfg.Peer.Job)
	}
	return p.await(ctx, refusedEnds)
}

// Watermarks asks node's agent which generations of ranks (nil: all) it
// holds.
func (m *Mesh) Watermarks(ctx context.Context, node string, ranks []int) (*peer.WatermarksReply, error) {
	addr, err := m.Resolve(ctx, node)
	if err != nil {
		return nil, err
	}
	return m.cl.Watermarks(ctx, addr, ranks)
}

// Replicate asks node's agent to copy sections of one of our generations
// in the background (peer.Client.Replicate).
func (m *Mesh) Replicate(ctx context.Context, node string, req peer.ReplicateRequest) error {
	addr, err := m.Resolve(ctx, node)
	if err != nil {
		return err
	}
	return m.cl.Replicate(ctx, addr, req)
}

// Manifest asks node's agent for a generation's layout and checksums.
func (m *Mesh) Manifest(ctx context.Context, node string, k peer.GenKey) (*peer.GenInfo, error) {
	addr, err := m.Resolve(ctx, node)
	if err != nil {
		return nil, err
	}
	return m.cl.Manifest(ctx, addr, k)
}

// Source names a buffer of a generation on node's agent, for a FetchSpec.
func (m *Mesh) Source(ctx context.Context, node string, k peer.ChunkKey) (peer.Source, error) {
	addr, err := m.Resolve(ctx, node)
	if err != nil {
		return peer.Source{}, err
	}
	return peer.Source{Addr: addr, Key: k}, nil
}

// Call sends a request that a peer.Handler serves on node's agent (failure
// detection's beat, probe and failure), waiting for the node's agent to be
// found until ctx ends, or until a search finds nothing listening on any of
// its candidate ports: the error then matches syscall.ECONNREFUSED, which
// the detector takes for an agent that is gone (no need to wait out its
// watch window).
func (m *Mesh) Call(ctx context.Context, node string, t peer.Type, req, resp any) error {
	addr, err := m.resolve(ctx, node, true)
	if err != nil {
		return err
	}
	return m.cl.Call(ctx, addr, t, req, resp)
}

// Fetch is peer.Client.Fetch over the mesh's connections.
func (m *Mesh) Fetch(ctx context.Context, spec peer.FetchSpec) (peer.FetchStats, error) {
	return m.cl.Fetch(ctx, spec)
}

// Close stops watching peers, closes every connection and the listener.
func (m *Mesh) Close() error {
	var err error
	m.once.Do(func() {
		m.cancel()
		m.wg.Wait()
		m.cl.Close()
		err = m.srv.Close()
	})
	return err
}

// skippedText names what each skipped candidate was.
func skippedText(ts []Try) string {
	parts := make([]string, len(ts))
	for i, t := range ts {
		parts[i] = fmt.Sprintf("%d %s (%v)", t.Port, t.Kind, t.Err)
	}
	return strings.Join(parts, "; ")
}

// What a candidate port turned out to be.
const (
	TryRefused   = "refused"    // nothing listens there (the agent is not up yet, or sits on a later candidate)
	TryForeign   = "foreign"    // a reft agent that refused us: another job's, or a mismatched configuration
	TryOtherNode = "other_node" // an agent of this job, but another node's
	TryOther     = "other"      // anything else: a program that does not speak the protocol, a timeout
)

// Try is one candidate port of a search.
type Try struct {
	Port int
	Kind string
	Err  error
}

// UnreachableError is a search that found no agent for a node: what each
// candidate port said.
type UnreachableError struct {
	Node, Host, Job string
	Tries           []Try
}

func (e *UnreachableError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "no agent of job %s for node %s on %s:", e.Job, e.Node, e.Host)
	for i, t := range e.Tries {
		if i > 0 {
			b.WriteString(";")
		}
		if t.Kind == TryRefused {
			fmt.Fprintf(&b, " %d refused", t.Port)
		} else {
			fmt.Fprintf(&b, " %d %s (%v)", t.Port, t.Kind, t.Err)
		}
	}
	b.WriteString(" (its agent may not be up yet or failed to start; see its log. agent.port_range and agent.peer_auth must be the same on every node, and the range open between nodes)")
	return b.String()
}

// Is makes a search whose every candidate port refused the connection
// (nothing listens there) match syscall.ECONNREFUSED, as one refused dial
// would. A candidate that timed out or answered otherwise keeps it from
// matching: that is no proof the agent is gone.
func (e *UnreachableError) Is(target error) bool {
	if target != syscall.ECONNREFUSED || len(e.Tries) == 0 {
		return false
	}
	for _, t := range e.Tries {
		if t.Kind != TryRefused {
			return false
		}
	}
	return true
}

// causeKey sums a search failure up by what each port was, without the
// details that change between tries (nonces, timings), so that a failure
// is logged again only when its nature changes.
func causeKey(err error) string {
	var ue *UnreachableError
	if !errors.As(err, &ue) {
		return err.Error()
	}
	var b strings.Builder
	for _, t := range ue.Tries {
		fmt.Fprintf(&b, "%d:%s ", t.Port, t.Kind)
	}
	return b.String()
}
