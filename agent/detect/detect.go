// Package detect is the agents' failure detector (issue 7, "Failure
// detection"). Every agent beats a few watched peers (ring neighbours
// among the job's nodes by default; the set is an input), suspects one that
// stays silent or whose connection breaks, and asks every other agent
// whether it reaches the suspect (so that one flaky link does not condemn
// a node). The suspect is watched over a window of several seconds with
// several attempts, each long enough for one lost SYN's retransmission
// (Config.Window), so a flap or a stall shorter than the window clears it;
// a refused connection (the process is gone) needs no window. A verdict
// needs a Quorum of the job's agents that cannot reach the suspect; an
// agent that cannot reach a quorum at all is the one cut off and fences
// itself (see Detector). The failure is classified (node: its slurmd is
// unreachable too; agent: the node answers but its agent does not; hang:
// a local rank stopped reporting progress), and reported to the
// coordinator: the lowest-index agent that answers, so the role moves on
// when its holder dies. The coordinator drops duplicate
// reports, logs one failure_detected event (which `reft run` reads in the
// job's log directory) and publishes the failure to every other agent.
// Every agent hands the failures it learns to Config.OnFailure.
//
// Nothing here is a single point of failure: every agent detects on its
// own, any agent can coordinate, and a report whose coordinator died on
// the way goes to the next one.
package detect

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/peer"
	"github.com/reft-hpc/reft/agent/runrecord"
)

// Failure classes (the recovery log's kind).
const (
	ClassNode  = "node"  // agent and node unreachable
	ClassAgent = "agent" // the agent is gone, the node's slurmd answers
	ClassHang  = "hang"  // ranks made no progress past detect.hang
)

// Node is one node of the job's allocation.
type Node struct {
	Name  string
	Index int
	// Slurmd is host:port of the node's slurmd ("": unknown, so a failure
	// of the node cannot be told from one of its agent, and counts as a
	// node failure).
	Slurmd string
}

// Transport carries the detector's requests to another node's agent
// (agent/mesh in the agent, peer.Client over a fixed address map in
// tests). The other side serves them with the handlers Register installs.
type Transport interface {
	Call(ctx context.Context, node string, t peer.Type, req, resp any) error
}

// PeerSet picks the nodes self watches among live (the job's nodes not
// known to have failed, self included, in index order). It is an input so
// that the sharding and placement groups' members can replace the ring
// once the rank-to-node map is known.
type PeerSet func(self string, live []string) []string

// Ring watches the nodes next to self in live's order, both ways: every
// node is then watched by two others (one in a job of two nodes).
func Ring(self string, live []string) []string {
	i := slices.Index(live, self)
	n := len(live)
	if i < 0 || n < 2 {
		return nil
	}
	out := []string{live[(i+1)%n]}
	if p := live[(i+n-1)%n]; p != out[0] {
		out = append(out, p)
	}
	return out
}

// NodeCheck makes one attempt to reach a node itself (its slurmd, not its
// agent) within ctx; an error means it cannot tell (no address).
type NodeCheck func(ctx context.Context, n Node) (Reach, error)

// Progress is one local rank's last progress: a save or a progress
// message of its client.
type Progress struct {
	Rank int
	Step int64
	At   time.Time
	// StepTime is the median time per step of the rank's recent progress;
	// 0 until enough steps were seen (the hang timeout is then the floor).
	StepTime time.Duration
	// Process is the state of the rank's process as the kernel shows it
	// (ProcStopped, ProcDiskSleep, ...); "" when it cannot be read.
	Process string
	// Where is what the rank was doing at its last sign, in words ("in a
	// communication phase", "saving"); "" when unknown.
	Where string
}

// Process states of Progress.Process (proc(5), /proc/PID/stat field 3).
const (
	ProcRunning   = "running"
	ProcSleeping  = "sleeping"   // waiting on an event: a collective's receive, a lock
	ProcDiskSleep = "disk sleep" // uninterruptible: I/O or a driver call
	ProcStopped   = "stopped"    // SIGSTOP, SIGTSTP or a debugger
	ProcZombie    = "zombie"     // exited, not reaped
)

// Failure is a confirmed failure, as reported and published.
type Failure struct {
	// Node is the failed node, or for a hang the node of the hung ranks.
	Node  string `json:"node"`
	Class string `json:"class"`
	Ranks []int  `json:"ranks,omitempty"` // hang: the ranks without progress
	Cause string `json:"cause"`
	// Reporter is the agent that suspected and confirmed it; ConfirmedBy
	// the agents that could not reach the node either.
	Reporter    string   `json:"reporter"`
	ConfirmedBy []string `json:"confirmed_by,omitempty"`
	// Coordinator is the agent that published it ("" in a report).
	Coordinator string `json:"coordinator,omitempty"`
	// LastHeard is when the reporter last heard from the node's agent (a
	// hang: the ranks' last progress); DetectedAt when it was confirmed.
	LastHeard  time.Time `json:"last_heard"`
	DetectedAt time.Time `json:"detected_at"`
	// Quorum: Votes agents (the reporter included) of the job's Agents
	// could not reach the node, a Quorum. Hangs carry no vote (a rank's
	// own agent sees it).
	Quorum bool `json:"quorum,omitempty"`
	Votes  int  `json:"votes,omitempty"`
	Agents int  `json:"agents,omitempty"`
	// Published marks the coordinator's publication (not a report).
	Published bool `json:"published,omitempty"`
}

// Latency is the time from the last sign of life to the confirmation.
func (f Failure) Latency() time.Duration { return f.DetectedAt.Sub(f.LastHeard) }

// Config configures a Detector.
type Config struct {
	Self  string
	Nodes []Node // the job's allocation in index order, self included
	// Transport reaches the other agents.
	Transport Transport
	// Peers picks the watched nodes; nil: Ring.
	Peers PeerSet
	// NodeUp checks a suspected node itself; nil: SlurmdUp.
	NodeUp NodeCheck
	// Interval is the beat period; Timeout the silence that raises a
	// suspicion; Confirm is the slack the other agents' answers get past
	// the watch (detect section of reft.toml).
	Interval, Timeout, Confirm time.Duration
	// Window is how long a suspect is watched before silence condemns it
	// (detect.window); 0: DefaultWindow.
	Window time.Duration
	// Hang is the floor of how long a local rank may make no progress
	// (detect.hang); 0: no hang detection. HangFactor times the rank's
	// median step time raises it (detect.hang_factor; 0: the floor
	// alone), so a slow step is no hang. Progress lists the local ranks'
	// progress (nil: none). See HangTimeout and checkHangs.
	Hang       time.Duration
	HangFactor float64
	Progress   func() []Progress
	// OnFailure is called once per failure this agent learns of, as its
	// coordinator or from the coordinator's publication (the jit flush
	// hangs on it). It must not block.
	OnFailure func(Failure)
	// Record is the job's run record (agent/runrecord): the coordinator
	// records each failure it publishes there, once, before OnFailure,
	// for reft run. nil: none.
	Record *runrecord.Writer
	Log    zerolog.Logger
}

// maxConfirmers is how many other agents also probe a suspect's slurmd
// (every agent is asked whether it reaches the suspect's agent).
const maxConfirmers = 3

// DefaultWindow is the watch window when Config.Window is 0: a 3 s flap
// or stall ends within it (watchAttempts attempts, the last one starting
// 2.25 s in and waiting attemptTimeout).
const DefaultWindow = 3 * time.Second

// Detector is one agent's failure detector. It beats (tick, beat) and
// checks for hangs (checkHangs) on its own loop goroutine, and is made of
// parts that share one book (book.go: what it knows of the job's agents,
// under one mutex): the confirmer (confirm.go) turns a beat's silence into
// a verdict, and the publisher (coord.go) reports, coordinates and
// publishes verdicts. Register's handlers call into the book, the
// confirmer (probe) and the publisher (received) on the peer server's
// goroutines.
//
// Fencing: an agent that, confirming a suspicion, reaches no Quorum of the
// job's agents (itself included) concludes that it is the one cut off. It
// logs detect_fenced once, and until it reaches a quorum again (logged as
// detect_unfenced): it suspects and condemns nobody (no report, no
// publication, so OnFailure sees no verdict of its own), casts no vote in
// other agents' confirmations, and refuses to coordinate; it beats every
// agent, not only its watched peers, to find out when it is back. Its
// local failure reactions (the JIT flush) follow published verdicts only,
// which need a quorum, so they never act on its isolated view.
type Detector struct {
	cfg Config
	log zerolog.Logger
	// book is the state the parts share, under its mu (the tests read
	// mu, heard and watching through it).
	*book
	conf *confirmer // suspicion and confirmation (confirm.go)
	pub  *publisher // coordination and publication (coord.go)

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New checks cfg and makes a detector; Register its handlers on the
// agent's peer server, then Start it.
func New(cfg Config) (*Detector, error) {
	switch {
	case cfg.Transport == nil:
		return nil, errors.New("detect: no transport to the other agents")
	case cfg.Interval <= 0 || cfg.Timeout <= cfg.Interval:
		return nil, fmt.Errorf("detect: want 0 < interval (%s) < timeout (%s) (detect section of reft.toml)", cfg.Interval, cfg.Timeout)
	case cfg.Confirm <= 0:
		return nil, fmt.Errorf("detect: confirm %s must be positive (detect.confirm in reft.toml)", cfg.Confirm)
	case cfg.Window < 0:
		return nil, fmt.Errorf("detect: window %s must not be negative (detect.window in reft.toml)", cfg.Window)
	case cfg.HangFactor < 0:
		return nil, fmt.Errorf("detect: hang factor %g must not be negative (detect.hang_factor in reft.toml)", cfg.HangFactor)
	}
	d := &Detector{cfg: cfg, log: cfg.Log.With().Str("component", "detect").Logger()}
	d.book = &book{self: cfg.Self, order: cfg.Nodes, timeout: cfg.Timeout, log: d.log, nodes: map[string]Node{},
		heard: map[string]time.Time{}, inflight: map[string]bool{}, discovered: map[string]time.Time{}, suspecting: map[string]bool{},
		failed: map[string]time.Time{}, gone: map[string]time.Time{}, hung: map[int]time.Time{}, waiting: map[int]time.Time{}}
	for i, n := range cfg.Nodes {
		if n.Index != i {
			return nil, fmt.Errorf("detect: node %s has index %d at position %d", n.Name, n.Index, i)
		}
		d.nodes[n.Name] = n
	}
	if _, ok := d.nodes[cfg.Self]; !ok {
		return nil, fmt.Errorf("detect: this node %q is not among the job's nodes", cfg.Self)
	}
	if d.cfg.Peers == nil {
		d.cfg.Peers = Ring
	}
	if d.cfg.NodeUp == nil {
		d.cfg.NodeUp = SlurmdUp
	}
	if d.cfg.OnFailure == nil {
		d.cfg.OnFailure = func(Failure) {}
	}
	if d.cfg.Window == 0 {
		d.cfg.Window = DefaultWindow
	}
	d.pub = &publisher{book: d.book, cfg: &d.cfg, log: d.log, wg: &d.wg}
	d.conf = &confirmer{book: d.book, cfg: &d.cfg, log: d.log, wg: &d.wg, pub: d.pub}
	return d, nil
}

// Start runs the detector until ctx ends or Close.
func (d *Detector) Start(ctx context.Context) {
	ctx, d.cancel = context.WithCancel(ctx)
	d.wg.Add(1)
	go d.loop(ctx)
}

// Close stops the detector and waits for its goroutines.
func (d *Detector) Close() {
	if d.cancel != nil {
		d.cancel()
	}
	d.wg.Wait()
}

// Leave stops the detector and tells the other live agents that this one
// stops on purpose, so that they neither suspect nor report it; the agent
// calls it instead of Close when it shuts down cleanly. It waits for
// their answers until ctx ends.
func (d *Detector) Leave(ctx context.Context) {
	if d.cancel != nil { // no beat after the goodbye
		d.cancel()
	}
	d.wg.Wait()
	d.mu.Lock()
	var to []string
	for _, n := range d.live() {
		if n != d.cfg.Self {
			to = append(to, n)
		}
	}
	d.mu.Unlock()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var missed []string
	for _, n := range to {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var rep beatReply
			if err := d.cfg.Transport.Call(ctx, n, peer.TBeat, beatReq{Node: d.cfg.Self, Leaving: true}, &rep); err != nil && !isRemote(err) {
				mu.Lock()
				missed = append(missed, n+" ("+err.Error()+")")
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(missed) > 0 {
		slices.Sort(missed)
		// Said, not retried: the agent is stopping. Those agents may
		// suspect this one, and publish its loss if a quorum agrees.
		d.log.Info().Str("event", "goodbye_undelivered").Strs("peers", missed).
			Msgf("could not tell %d agent(s) that this one stops on purpose", len(missed))
	}
}

// Coordinator is the agent this one takes for the coordinator now: the
// lowest-index node not known to have failed.
func (d *Detector) Coordinator() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.live()[0]
}

// Watching lists the nodes this agent beats.
func (d *Detector) Watching() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.watching)
}

func (d *Detector) loop(ctx context.Context) {
	defer d.wg.Done()
	t := time.NewTicker(d.cfg.Interval)
	defer t.Stop()
	for {
		d.tick(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// tick beats the watched peers and looks for hung ranks.
func (d *Detector) tick(ctx context.Context) {
	d.mu.Lock()
	live := d.live()
	watch := d.cfg.Peers(d.cfg.Self, live)
	if d.fenced {
		d.rejoin()
		if d.fenced { // beat them all, to see when a quorum answers again
			watch = slices.DeleteFunc(d.population(), func(n string) bool { return n == d.cfg.Self })
		}
	}
	if !slices.Equal(watch, d.watching) {
		d.watching = watch
		d.log.Info().Str("event", "detect_watching").Strs("peers", watch).
			Msgf("failure detection: beating %s every %s", listOr(watch, "no peer"), d.cfg.Interval)
	}
	if c := live[0]; c != d.coord {
		prev := d.coord
		d.coord = c
		ev := d.log.Info().Str("event", "coordinator").Str("coordinator", c)
		if prev != "" {
			ev = ev.Str("previous", prev)
		}
		ev.Msgf("failure detection coordinator: %s (the lowest-index agent not known to have failed)", c)
	}
	var start []string
	for _, n := range watch {
		if !d.inflight[n] && !d.suspecting[n] {
			d.inflight[n] = true
			start = append(start, n)
		}
	}
	// Discovery: a node not heard from yet is beaten once per Timeout, so
	// that every agent that runs counts in the population a verdict is
	// weighed against (an agent not counted would let a minority pass for
	// a quorum). A node without an agent (a spare) never answers and
	// never counts.
	now := time.Now()
	for _, n := range live {
		if n != d.cfg.Self && d.heard[n].IsZero() && !d.inflight[n] && now.Sub(d.discovered[n]) >= d.cfg.Timeout {
			d.discovered[n] = now
			d.inflight[n] = true
			start = append(start, n)
		}
	}
	d.mu.Unlock()
	for _, n := range start {
		d.wg.Add(1)
		go d.beat(ctx, n)
	}
	d.checkHangs(ctx)
}

// beatReq and beatReply are the beat's payloads. Leaving says goodbye: the
// agent stops on purpose (the job ends on its node), so it is no failure.
type beatReq struct {
	Node    string `json:"node"`
	Leaving bool   `json:"leaving,omitempty"`
}

type beatReply struct {
	Node string `json:"node"`
}

// beat sends one beat to node and acts on the answer: a reply is a sign
// of life; silence past the timeout since the last one, or a broken
// connection, raises a suspicion. A node never heard from is not yet up
// and is not suspected.
func (d *Detector) beat(ctx context.Context, node string) {
	defer d.wg.Done()
	defer func() {
		d.mu.Lock()
		delete(d.inflight, node)
		d.mu.Unlock()
	}()
	d.mu.Lock()
	last := d.heard[node]
	d.mu.Unlock()
	deadline := time.Now().Add(d.cfg.Timeout)
	if !last.IsZero() {
		deadline = last.Add(d.cfg.Timeout) // silence counts from the last sign of life
		if min := time.Now().Add(d.cfg.Interval); deadline.Before(min) {
			deadline = min
		}
	}
	cctx, cancel := context.WithDeadline(ctx, deadline)
	var rep beatReply
	err := d.cfg.Transport.Call(cctx, node, peer.TBeat, beatReq{Node: d.cfg.Self}, &rep)
	cancel()
	if ctx.Err() != nil {
		return
	}
	if err == nil || isRemote(err) { // an error frame is an answer too
		d.alive(node, false)
		return
	}
	d.mu.Lock()
	last = d.heard[node]
	_, known := d.failed[node]
	_, gone := d.gone[node]
	fenced := d.fenced
	d.mu.Unlock()
	if fenced { // a fenced agent suspects nobody
		return
	}
	if last.IsZero() || known || gone {
		d.log.Debug().Str("peer_node", node).Err(err).Msg("beat unanswered by an agent not heard from yet")
		return
	}
	d.conf.suspect(ctx, node, err)
}

// isRemote: the other agent answered with an error frame, so it is alive.
func isRemote(err error) bool {
	var e *peer.Error
	return errors.As(err, &e) && !peer.IsCode(err, peer.CodeForbidden)
}

// Seen records that node's agent was up at (the mesh connected to it).
// A node the detector starts watching only after a neighbour's failure
// (the ring closes over it) may never have answered this agent before;
// without this it would pass for one not up yet and never be suspected.
func (d *Detector) Seen(node string, at time.Time) { d.seen(node, at) }

// Fenced says whether this agent is fenced (see Detector).
func (d *Detector) Fenced() bool { return d.isFenced() }

func listOr(s []string, none string) string {
	if len(s) == 0 {
		return none
	}
	return strings.Join(s, ",")
}
