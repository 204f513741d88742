package detect

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/peer"
)

// Reach is what one attempt to reach a node's agent or slurmd found.
type Reach int

const (
	// Silent: no answer before the attempt's deadline. The node may be
	// down, cut off, stalled or behind a flapping link: only silence over
	// a whole window (Config.Window) counts as down.
	Silent Reach = iota
	// Answered: the process answered.
	Answered
	// Refused: the node's kernel answered that nothing listens there (a
	// reset): the process is gone. A dropped packet never looks like this,
	// so it needs no window.
	Refused
)

// What a watch found of a suspect's slurmd (probeReply.Slurmd).
const (
	slurmdUp      = "up"      // it answered once
	slurmdDown    = "down"    // its host refused the connection
	slurmdSilent  = "silent"  // silent for the whole window
	slurmdUnknown = "unknown" // not checked, or no address
)

// Watch window: a suspect is tried watchAttempts times, spread over
// Config.Window, and each attempt may take attemptTimeout. One lost SYN
// costs the 1 s initial retransmission timeout (RFC 6298); an attempt
// shorter than that would call a single dropped packet silence.
const (
	watchAttempts  = 4
	attemptTimeout = 1500 * time.Millisecond
)

// probeReq asks an agent whether it reaches node's agent, and with
// Slurmd whether node's slurmd answers.
type probeReq struct {
	Node   string `json:"node"`
	Slurmd bool   `json:"slurmd,omitempty"`
}

// probeReply is its answer: whether node's agent answered within the
// window, and what the node's slurmd port said (slurmdUnknown when not
// asked).
type probeReply struct {
	Node      string `json:"node"`
	Reachable bool   `json:"reachable"`
	Slurmd    string `json:"slurmd"`
	Error     string `json:"error,omitempty"`
}

// SlurmdUp is the default NodeCheck: one TCP connection to the node's
// slurmd. Accepted: Answered; reset: Refused; anything else before ctx
// ends (timeout, unreachable host or network): Silent. Without an address
// there is no verdict (an error).
func SlurmdUp(ctx context.Context, n Node) (Reach, error) {
	if n.Slurmd == "" {
		return Silent, fmt.Errorf("no slurmd address for node %s (scontrol show node gave no Port)", n.Name)
	}
	var dl net.Dialer
	c, err := dl.DialContext(ctx, "tcp", n.Slurmd)
	if err == nil {
		c.Close()
		return Answered, nil
	}
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return Refused, nil
	// An unreachable host or network is what a flap or a lost route
	// looks like for a moment, too: silence, tried again.
	case errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || isTimeout(err):
		return Silent, nil
	}
	return Silent, fmt.Errorf("connecting to slurmd of %s at %s: %w", n.Name, n.Slurmd, err)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// reachOf names what a call to another agent found.
func reachOf(err error) Reach {
	switch {
	case err == nil || isRemote(err): // an error frame is an answer too
		return Answered
	case errors.Is(err, syscall.ECONNREFUSED):
		return Refused
	}
	return Silent
}

// watchResult is what a watch of a suspect found.
type watchResult struct {
	Agent  Reach  // Answered if any beat was answered, else Refused if any was refused
	Slurmd string // slurmd*; slurmdUnknown when not asked
}

// attemptResult is one watch attempt's answer: of the agent, or (slurmd)
// of its node's slurmd.
type attemptResult struct {
	slurmd bool
	agent  Reach
	state  string
}

// delayedAttempt runs attempt (s: of the slurmd) after delay, for at most
// attemptTimeout; when ctx ends first the answer is silence.
func delayedAttempt(ctx context.Context, delay time.Duration, s bool, attempt func(context.Context, bool) attemptResult) attemptResult {
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return attemptResult{slurmd: s, agent: Silent, state: slurmdSilent}
	case <-t.C:
	}
	actx, acancel := context.WithTimeout(ctx, attemptTimeout)
	defer acancel()
	return attempt(actx, s)
}

// take folds one attempt's answer into the watch's: an answer of the
// agent outweighs a refusal, which outweighs silence; a slurmd's answer
// (up or down) outweighs its silence, and up outweighs down (slurmd
// restarted meanwhile). unknown: the slurmd could not be asked.
func (res *watchResult) take(r attemptResult) (unknown bool) {
	switch {
	case !r.slurmd:
		if r.agent == Answered || (r.agent == Refused && res.Agent == Silent) {
			res.Agent = r.agent
		}
	case (r.state == slurmdUp || r.state == slurmdDown) && res.Slurmd != slurmdUp:
		res.Slurmd = r.state
	case r.state == slurmdUnknown:
		return true
	}
	return false
}

// settled: the agent answered, or it refused and its slurmd says the
// node is down; later attempts cannot change the verdict.
func (res *watchResult) settled() bool {
	return res.Agent == Answered || (res.Agent == Refused && res.Slurmd == slurmdDown)
}

// Quorum says whether the agents in with (self among them) weigh enough
// in pop, the population in index order: more than half of it, or
// exactly half when with holds pop's first (lowest-index) agent. The
// tie-break makes the two halves of an even split disagree: at most one
// side of any partition has a quorum, so at most one side publishes.
// In a job of two agents only the first can condemn the second.
func Quorum(with, pop []string) bool {
	n := 0
	for _, p := range pop {
		if slices.Contains(with, p) {
			n++
		}
	}
	return 2*n > len(pop) || (2*n == len(pop) && n > 0 && slices.Contains(with, pop[0]))
}

// slurmdAsked picks the agents asked to probe node's slurmd as well: the
// live nodes other than self and node, nearest node in live's ring order
// first (they are its other watchers), at most maxConfirmers. The others
// only say whether they reach its agent: a slurmd is not hammered by the
// whole job.
func slurmdAsked(self, node string, live []string) []string {
	i := slices.Index(live, node)
	n := len(live)
	var out []string
	for k := 1; k < n && len(out) < maxConfirmers; k++ {
		for _, j := range []int{(i + k) % n, (i - k + n) % n} {
			c := live[j]
			if c != self && c != node && !slices.Contains(out, c) && len(out) < maxConfirmers {
				out = append(out, c)
			}
		}
	}
	return out
}

// confirmer is the detector's suspicion and confirmation: it turns a
// beat's silence into a verdict (suspect, confirm), answers other agents'
// probes (probe), and hands verdicts to the publisher. A suspicion runs on
// a goroutine of its own, added to the Detector's WaitGroup, under the ctx
// given to Start; probe runs on the peer server's handler goroutine. It
// reads and writes the shared book under book.mu, never across a call to
// another agent.
type confirmer struct {
	*book
	cfg *Config // the Detector's, defaults filled; read-only
	log zerolog.Logger
	wg  *sync.WaitGroup // the Detector's: Close waits for suspicions
	pub *publisher
}

// suspect confirms a suspicion of node in the background: every other
// agent is asked whether it reaches node's agent (a few also probe its
// slurmd) while this one watches it too, all over the watch window.
func (cf *confirmer) suspect(ctx context.Context, node string, cause error) {
	cf.mu.Lock()
	if cf.suspecting[node] || cf.fenced {
		cf.mu.Unlock()
		return
	}
	cf.suspecting[node] = true
	last := cf.heard[node]
	live := cf.live()
	pop := cf.population()
	cf.mu.Unlock()
	cf.log.Info().Str("event", "peer_suspected").Str("peer_node", node).Time("last_heard", last).Err(cause).
		Msgf("suspecting the agent of %s (last heard %s ago); asking the other agents", node, time.Since(last).Round(time.Millisecond))
	cf.wg.Add(1)
	go func() {
		defer cf.wg.Done()
		defer func() {
			cf.mu.Lock()
			delete(cf.suspecting, node)
			cf.mu.Unlock()
		}()
		cf.confirm(ctx, node, last, live, pop, cause)
	}()
}

// confirm decides a suspicion of node. Every other agent of pop is asked
// whether it reaches node's agent over the watch window, while this one
// watches it too. One that reaches it clears it (a failing link). The
// agents that cannot reach it, this one included, must make a Quorum of
// pop for a verdict. Short of one, when the agents this one reaches at all
// (their probe answers, a sign of life within Timeout, or a beat sent now)
// make no quorum either, this agent is the one cut off: it fences itself
// (see Detector) and publishes nothing.
func (cf *confirmer) confirm(ctx context.Context, node string, last time.Time, live, pop []string, cause error) {
	sp := &suspicion{cf: cf, node: node, last: last, pop: pop, cause: cause, start: time.Now()}
	sp.gather(ctx, live)
	if ctx.Err() != nil || sp.cleared() {
		return
	}
	if !Quorum(sp.t.votes, pop) {
		sp.noQuorum(ctx)
		return
	}
	class, why := classify(sp.t.slurmd, cf.cfg.Window)
	if class == ClassAgent {
		var ok bool
		if class, why, ok = sp.agentOrNode(ctx, why); !ok {
			return
		}
	}
	sp.publish(ctx, class, why)
}

// watch tries node's agent (and with slurmd its slurmd) watchAttempts
// times spread over Config.Window, each attempt for up to
// attemptTimeout, so that a flap or a stall shorter than the window ends
// in an answer. It stops early on a settled answer: the agent answered, or
// the agent refused and its node's slurmd refuses too (the node is gone).
// A refusal alone is not settled: an agent that restarts (every agent of
// a job restarts after a shrink, and the old one keeps its listener for
// its goodbye) refuses for a moment and then answers; seen on the test
// cluster, a new spare agent that had met the old agent condemned the new
// one 30 ms before it listened.
func (cf *confirmer) watch(ctx context.Context, node string, slurmd bool) watchResult {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	n := watchAttempts
	probes := []bool{false}
	if slurmd {
		n *= 2
		probes = append(probes, true)
	}
	attempt := func(actx context.Context, s bool) attemptResult {
		if s {
			return attemptResult{slurmd: true, state: cf.checkSlurmd(actx, node)}
		}
		var rep beatReply
		return attemptResult{agent: reachOf(cf.cfg.Transport.Call(actx, node, peer.TBeat, beatReq{Node: cf.cfg.Self}, &rep))}
	}
	out := make(chan attemptResult, n)
	var wg sync.WaitGroup
	every := cf.cfg.Window / watchAttempts
	for i := range watchAttempts {
		for _, s := range probes {
			wg.Go(func() { out <- delayedAttempt(ctx, time.Duration(i)*every, s, attempt) })
		}
	}
	res := watchResult{Agent: Silent, Slurmd: slurmdUnknown}
	if slurmd {
		res.Slurmd = ""
	}
	unknown := 0
	for got := 0; got < n && !res.settled(); got++ {
		if res.take(<-out) {
			unknown++
		}
	}
	cancel()
	go func() { wg.Wait(); close(out) }()
	for range out { // the attempts not waited for end with ctx
	}
	if res.Slurmd == "" {
		res.Slurmd = slurmdSilent
		if unknown == watchAttempts {
			res.Slurmd = slurmdUnknown
		}
	}
	if res.Agent == Answered {
		cf.alive(node, false)
	}
	return res
}

// checkSlurmd runs the node check once within ctx and names its result.
func (cf *confirmer) checkSlurmd(ctx context.Context, node string) string {
	r, err := cf.cfg.NodeUp(ctx, cf.nodes[node])
	switch {
	case err != nil:
		cf.log.Debug().Str("peer_node", node).Err(err).Msg("no verdict on the node's slurmd")
		return slurmdUnknown
	case r == Answered:
		return slurmdUp
	case r == Refused:
		return slurmdDown
	}
	return slurmdSilent
}

// reach beats every agent of pop but those in skip at once, within
// Timeout, and returns those that answered: before this agent concludes
// that it is cut off, it asks directly (its ring neighbours alone may not
// be a quorum).
func (cf *confirmer) reach(ctx context.Context, pop, skip []string) []string {
	ctx, cancel := context.WithTimeout(ctx, cf.cfg.Timeout)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	var out []string
	for _, c := range pop {
		if c == cf.cfg.Self || slices.Contains(skip, c) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var rep beatReply
			if reachOf(cf.cfg.Transport.Call(ctx, c, peer.TBeat, beatReq{Node: cf.cfg.Self}, &rep)) == Answered {
				cf.alive(c, false)
				mu.Lock()
				out = append(out, c)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return out
}

// probe serves another agent's question about node: it watches node's
// agent (and with req.Slurmd its slurmd) over the watch window, answering
// before the asker's confirmation ends.
func (cf *confirmer) probe(ctx context.Context, req probeReq) probeReply {
	rep := probeReply{Node: req.Node, Slurmd: slurmdUnknown}
	if req.Node == cf.cfg.Self {
		rep.Reachable, rep.Slurmd = true, slurmdUp
		return rep
	}
	if _, ok := cf.nodes[req.Node]; !ok {
		rep.Error = fmt.Sprintf("%s is not a node of this job", req.Node)
		return rep
	}
	if cf.isFenced() {
		// This agent's view is that of a node cut off from the job: it
		// casts no vote (the asker counts it as unanswered).
		rep.Error = "this agent is fenced (cut off from a quorum of the job's agents)"
		return rep
	}
	ctx, cancel := context.WithTimeout(ctx, cf.cfg.Window+attemptTimeout)
	defer cancel()
	w := cf.watch(ctx, req.Node, req.Slurmd)
	rep.Reachable = w.Agent == Answered
	rep.Slurmd = w.Slurmd
	return rep
}

// suspicion is one confirm call: the suspect, what was last heard of it,
// the population a verdict is weighed against, and the answers. It runs
// on confirm's goroutine.
type suspicion struct {
	cf    *confirmer
	node  string
	last  time.Time
	pop   []string
	cause error
	start time.Time
	t     tally
}

// tally is what the other agents and this one's own watch said of the
// suspect. votes are the agents that cannot reach it, this one first;
// responded the agents that answered, vote or not (a fenced agent answers
// without a vote); silent those that did not, with why.
type tally struct {
	unreachable, reached, silent, responded, slurmd, votes []string
}

// probeAnswer is one asked agent's answer to the probe.
type probeAnswer struct {
	c   string
	r   *probeReply
	err error
}

func (t *tally) add(a probeAnswer) {
	switch {
	case a.err != nil:
		t.silent = append(t.silent, a.c+" ("+a.err.Error()+")")
	case a.r.Error != "":
		t.responded = append(t.responded, a.c)
		t.silent = append(t.silent, a.c+" ("+a.r.Error+")")
	case a.r.Reachable:
		t.reached = append(t.reached, a.c)
	default:
		t.unreachable = append(t.unreachable, a.c)
		t.votes = append(t.votes, a.c)
		t.slurmd = append(t.slurmd, a.r.Slurmd)
	}
}

// gather asks every other agent of the population whether it reaches the
// suspect (those of slurmdAsked probe its slurmd too) while this one
// watches it, and tallies the answers until they settle it: one agent
// that reaches the suspect clears it; a quorum that cannot (with this
// agent's own watch done) condemns it.
func (sp *suspicion) gather(ctx context.Context, live []string) {
	cf, node := sp.cf, sp.node
	cctx, cancel := context.WithTimeout(ctx, cf.cfg.Window+attemptTimeout+cf.cfg.Confirm)
	defer cancel() // the rest are not needed
	withSlurmd := slurmdAsked(cf.cfg.Self, node, live)
	var asked []string
	for _, c := range sp.pop {
		if c != cf.cfg.Self && c != node {
			asked = append(asked, c)
		}
	}
	answers := make(chan probeAnswer, len(asked))
	for _, c := range asked {
		go func() {
			r := &probeReply{}
			err := cf.cfg.Transport.Call(cctx, c, peer.TProbe, probeReq{Node: node, Slurmd: slices.Contains(withSlurmd, c)}, r)
			answers <- probeAnswer{c, r, err}
		}()
	}
	ownc := make(chan watchResult, 1)
	go func() { ownc <- cf.watch(cctx, node, true) }()
	t := &sp.t
	t.unreachable, t.slurmd, t.votes = []string{}, []string{}, []string{cf.cfg.Self}
	ownDone, got := false, 0
	for !(ownDone && (got == len(asked) || Quorum(t.votes, sp.pop))) && len(t.reached) == 0 {
		select {
		case a := <-answers:
			got++
			t.add(a)
		case own := <-ownc:
			ownDone = true
			t.slurmd = append(t.slurmd, own.Slurmd)
			if own.Agent == Answered {
				t.reached = append(t.reached, cf.cfg.Self)
			}
		}
	}
}

// state reads what the detector learnt of the suspect meanwhile: when it
// was last heard from, whether its failure is known (published), and
// whether it said goodbye.
func (sp *suspicion) state() (heard time.Time, known, gone bool) {
	cf := sp.cf
	cf.mu.Lock()
	defer cf.mu.Unlock()
	_, known = cf.failed[sp.node]
	_, gone = cf.gone[sp.node]
	return cf.heard[sp.node], known, gone
}

// cleared says whether there is no failure to publish after all, and
// logs why: the suspect said goodbye, an agent reaches it (this one: it
// answered within the window; another: a failing link), it was heard
// from meanwhile, or its failure was published meanwhile.
func (sp *suspicion) cleared() bool {
	cf, node := sp.cf, sp.node
	heard, known, gone := sp.state()
	switch {
	case gone: // it said goodbye meanwhile: no failure
		return true
	case len(sp.t.reached) > 0:
		other := slices.DeleteFunc(slices.Clone(sp.t.reached), func(c string) bool { return c == cf.cfg.Self })
		if len(other) == 0 {
			cf.log.Info().Str("event", "peer_suspect_cleared").Str("peer_node", node).
				Msgf("the agent of %s answered again within the watch window (%s); no failure", node, cf.cfg.Window)
			return true
		}
		cf.log.Warn().Str("event", "peer_suspect_cleared").Str("peer_node", node).Strs("reached_by", other).Err(sp.cause).
			Msgf("%s reach the agent of %s, which this agent cannot: a failing link from %s to %s, not a failed node (check the network between them)",
				strings.Join(other, ","), node, cf.cfg.Self, node)
		return true
	case heard.After(sp.last):
		// It answered meanwhile (a request of its own).
		cf.log.Info().Str("event", "peer_suspect_cleared").Str("peer_node", node).
			Msgf("the agent of %s answered again; no failure", node)
		return true
	}
	return known // published meanwhile by the coordinator, from another watcher's report
}

// noQuorum handles votes short of a quorum: when the agents this one
// reaches at all make no quorum either, this agent is the one cut off
// and fences itself; else it says the failure is unconfirmed.
func (sp *suspicion) noQuorum(ctx context.Context) {
	cf, node, pop := sp.cf, sp.node, sp.pop
	// Cut off means reaching no quorum at all: the agents that answered
	// the probe, and those heard from within Timeout otherwise (a probe
	// answer can be late for reasons of its own: a slow dial on the
	// other side).
	answered := append(slices.Clone(sp.t.votes), sp.t.responded...)
	now := time.Now()
	cf.mu.Lock()
	for _, c := range pop {
		if c != node && !slices.Contains(answered, c) && now.Sub(cf.heard[c]) < cf.cfg.Timeout {
			answered = append(answered, c)
		}
	}
	cf.mu.Unlock()
	if !Quorum(answered, pop) {
		answered = append(answered, cf.reach(ctx, pop, append(slices.Clone(answered), node))...)
	}
	if ctx.Err() != nil {
		return
	}
	if !Quorum(answered, pop) {
		cf.fence(fmt.Sprintf("suspecting %s, this agent reached %d of the job's %d agents (itself included), no quorum; %s may be fine (unanswered: %s)",
			node, len(answered), len(pop), node, listOr(sp.t.silent, "none")))
		return
	}
	cf.log.Warn().Str("event", "peer_suspect_unconfirmed").Str("peer_node", node).Strs("confirmed_by", sp.t.unreachable).
		Strs("unanswered", sp.t.silent).Int("agents", len(pop)).
		Msgf("%d of %d agents cannot reach %s, no quorum: not declaring a failure", len(sp.t.votes), len(pop), node)
}

// classify names a confirmed failure by what the suspect's slurmd said
// (to this agent and the confirmers): an answer makes it the agent's
// failure, else the node's, and why says which.
func classify(slurmd []string, window time.Duration) (class, why string) {
	switch {
	case slices.Contains(slurmd, slurmdUp):
		return ClassAgent, "its node's slurmd answers"
	case slices.Contains(slurmd, slurmdDown):
		return ClassNode, "its slurmd refuses connections"
	case slices.Contains(slurmd, slurmdSilent):
		return ClassNode, fmt.Sprintf("its slurmd stayed silent over %s", window)
	}
	return ClassNode, "its slurmd could not be checked (no address)"
}

// agentOrNode settles an agent verdict. A node's processes do not all
// die at the same instant (a kill of the node's every process, the OOM
// killer, a panic in progress): the agent's reset can come while slurmd
// still answers. Only a slurmd that still answers half a suspicion
// timeout later makes this an agent failure; reft run would otherwise
// relaunch onto a dead node. An agent heard meanwhile is a new one (the
// confirmers could not reach the old): the node is up, and the verdict
// stands. ok is false when there is nothing to publish any more.
func (sp *suspicion) agentOrNode(ctx context.Context, why string) (class, reason string, ok bool) {
	cf := sp.cf
	grace := cf.cfg.Timeout / 2
	select {
	case <-ctx.Done():
		return "", "", false
	case <-time.After(grace):
	}
	heard, known, gone := sp.state()
	if gone || known {
		return "", "", false
	}
	if !heard.After(sp.last) && cf.checkSlurmd(ctx, sp.node) == slurmdDown {
		return ClassNode, fmt.Sprintf("its slurmd answered at first but refused %s later (the whole node went down)", grace), true
	}
	return ClassAgent, why, true
}

// publish reports the confirmed failure to the coordinator.
func (sp *suspicion) publish(ctx context.Context, class, why string) {
	cf, node := sp.cf, sp.node
	now := time.Now()
	f := Failure{Node: node, Class: class, Reporter: cf.cfg.Self, ConfirmedBy: sp.t.unreachable, LastHeard: sp.last, DetectedAt: now,
		Quorum: true, Votes: len(sp.t.votes), Agents: len(sp.pop)}
	f.Cause = fmt.Sprintf("the agent of %s is unreachable (%v); %s; %d of the job's %d agents cannot reach it (a quorum)",
		node, sp.cause, why, len(sp.t.votes), len(sp.pop))
	cf.log.Info().Str("event", "peer_confirmed").Str("peer_node", node).Str("class", class).
		Dur("confirm", now.Sub(sp.start)).Msg(f.Cause)
	cf.mu.Lock()
	cf.failed[node] = now
	cf.mu.Unlock()
	cf.pub.report(ctx, f)
}
