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

	"github.com/reft-hpc/reft/agent/peer"
)

// What a probe found of a suspect's slurmd.
const (
	slurmdUp      = "up"
	slurmdDown    = "down"
	slurmdUnknown = "unknown"
)

// probeReq asks an agent whether it reaches node's agent.
type probeReq struct {
	Node string `json:"node"`
}

// probeReply is its answer: whether node's agent answered a beat, and
// what the node's slurmd port said.
type probeReply struct {
	Node      string `json:"node"`
	Reachable bool   `json:"reachable"`
	Slurmd    string `json:"slurmd"`
	Error     string `json:"error,omitempty"`
}

// SlurmdUp is the default NodeCheck: a TCP connection to the node's
// slurmd. Accepted: the node is up; refused or silent: it is not. Without
// an address there is no verdict.
func SlurmdUp(ctx context.Context, n Node) (bool, error) {
	if n.Slurmd == "" {
		return false, fmt.Errorf("no slurmd address for node %s (scontrol show node gave no Port)", n.Name)
	}
	var dl net.Dialer
	c, err := dl.DialContext(ctx, "tcp", n.Slurmd)
	if err == nil {
		c.Close()
		return true, nil
	}
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) ||
		errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
		return false, nil
	}
	return false, fmt.Errorf("connecting to slurmd of %s at %s: %w", n.Name, n.Slurmd, err)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// checkSlurmd runs the node check within ctx and names its verdict.
func (d *Detector) checkSlurmd(ctx context.Context, node string) string {
	up, err := d.cfg.NodeUp(ctx, d.nodes[node])
	switch {
	case err != nil:
		d.log.Debug().Str("peer_node", node).Err(err).Msg("no verdict on the node's slurmd")
		return slurmdUnknown
	case up:
		return slurmdUp
	}
	return slurmdDown
}

// suspect confirms a suspicion of node in the background: other agents
// probe it, and its slurmd is checked, all within Confirm.
func (d *Detector) suspect(ctx context.Context, node string, cause error) {
	d.mu.Lock()
	if d.suspecting[node] {
		d.mu.Unlock()
		return
	}
	d.suspecting[node] = true
	last := d.heard[node]
	live := d.live()
	d.mu.Unlock()
	d.log.Info().Str("event", "peer_suspected").Str("peer_node", node).Time("last_heard", last).Err(cause).
		Msgf("suspecting the agent of %s (last heard %s ago); asking other agents", node, time.Since(last).Round(time.Millisecond))
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer func() {
			d.mu.Lock()
			delete(d.suspecting, node)
			d.mu.Unlock()
		}()
		d.confirm(ctx, node, last, live, cause)
	}()
}

// confirmers picks the agents asked about node: the live nodes other than
// self and node, nearest node in live's ring order first (they are its
// other watchers), at most maxConfirmers.
func confirmers(self, node string, live []string) []string {
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

func (d *Detector) confirm(ctx context.Context, node string, last time.Time, live []string, cause error) {
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, d.cfg.Confirm)
	defer cancel()
	asked := confirmers(d.cfg.Self, node, live)
	replies := make([]*probeReply, len(asked))
	errs := make([]error, len(asked))
	type answer struct {
		i   int
		r   *probeReply
		err error
	}
	answers := make(chan answer, len(asked))
	for i, c := range asked {
		go func() {
			r := &probeReply{}
			err := d.cfg.Transport.Call(cctx, c, peer.TProbe, probeReq{Node: node}, r)
			answers <- answer{i, r, err}
		}()
	}
	ownc := make(chan string, 1)
	go func() { ownc <- d.checkSlurmd(cctx, node) }()
	// Decide as soon as the answers settle it: one agent that reaches the
	// suspect clears it; two that cannot (or every one asked) confirm it.
	// A node without an agent (a spare) then costs nothing.
	need := min(2, len(asked))
	var own string
	for got, no, ownDone := 0, 0, false; ; {
		if ownDone && (got == len(asked) || no >= need) {
			break
		}
		select {
		case a := <-answers:
			got++
			if a.err != nil {
				errs[a.i] = a.err
				continue
			}
			replies[a.i] = a.r
			if a.r.Reachable {
				got, ownDone = len(asked), true // settled: cleared below
				own = slurmdUnknown
			} else {
				no++
			}
		case own = <-ownc:
			ownDone = true
		}
	}
	cancel() // the rest are not needed
	if ctx.Err() != nil {
		return
	}

	d.mu.Lock()
	heard := d.heard[node]
	_, known := d.failed[node]
	_, gone := d.gone[node]
	d.mu.Unlock()
	if gone { // it said goodbye meanwhile: no failure
		return
	}
	if heard.After(last) { // it answered meanwhile (a beat, or a request of its own)
		d.log.Info().Str("event", "peer_suspect_cleared").Str("peer_node", node).
			Msgf("the agent of %s answered again; no failure", node)
		return
	}
	if known { // published meanwhile by the coordinator, from another watcher's report
		return
	}
	var unreachable, reached, silent []string
	slurmd := []string{own}
	for i, c := range asked {
		switch r := replies[i]; {
		case r == nil && errs[i] == nil: // not waited for
		case r == nil:
			silent = append(silent, c+" ("+errs[i].Error()+")")
		case r.Reachable:
			reached = append(reached, c)
		default:
			unreachable = append(unreachable, c)
			slurmd = append(slurmd, r.Slurmd)
		}
	}
	if len(reached) > 0 {
		d.log.Warn().Str("event", "peer_suspect_cleared").Str("peer_node", node).Strs("reached_by", reached).Err(cause).
			Msgf("%s reach the agent of %s, which this agent cannot: a failing link from %s to %s, not a failed node (check the network between them)",
				strings.Join(reached, ","), node, d.cfg.Self, node)
		return
	}
	if len(asked) > 0 && len(unreachable) == 0 {
		// Nobody confirms: the other agents are gone as well, or this
		// agent is cut off. Only the node's own slurmd can settle it.
		if own != slurmdDown {
			d.log.Warn().Str("event", "peer_suspect_unconfirmed").Str("peer_node", node).Strs("unanswered", silent).
				Msgf("no other agent answered about %s and its slurmd is %s: not declaring a failure (this node may be cut off)", node, own)
			return
		}
	}
	class, why := ClassNode, "its slurmd does not answer either"
	switch {
	case slices.Contains(slurmd, slurmdUp):
		class, why = ClassAgent, "its node's slurmd answers"
	case !slices.Contains(slurmd, slurmdDown):
		why = "its slurmd could not be checked (no address)"
	}
	if class == ClassAgent {
		// A node's processes do not all die at the same instant (a kill
		// of the node's every process, the OOM killer, a panic in
		// progress): the agent's reset can come while slurmd still
		// answers. Only a slurmd that still answers half a suspicion
		// timeout later makes this an agent failure; reft run would
		// otherwise relaunch onto a dead node. An agent heard meanwhile is
		// a new one (the confirmers could not reach the old): the node is
		// up, and the verdict stands.
		grace := d.cfg.Timeout / 2
		select {
		case <-ctx.Done():
			return
		case <-time.After(grace):
		}
		d.mu.Lock()
		heard = d.heard[node]
		_, known = d.failed[node]
		_, gone = d.gone[node]
		d.mu.Unlock()
		if gone || known {
			return
		}
		if !heard.After(last) && d.checkSlurmd(ctx, node) == slurmdDown {
			class, why = ClassNode, fmt.Sprintf("its slurmd answered at first but not %s later (the whole node went down)", grace)
		}
	}
	now := time.Now()
	f := Failure{Node: node, Class: class, Reporter: d.cfg.Self, ConfirmedBy: unreachable, LastHeard: last, DetectedAt: now}
	f.Cause = fmt.Sprintf("the agent of %s is unreachable (%v); %s", node, cause, why)
	if len(unreachable) > 0 {
		f.Cause += "; " + strings.Join(unreachable, ",") + " cannot reach it either"
	} else if len(asked) == 0 {
		f.Cause += "; no other agent to ask"
	}
	d.log.Info().Str("event", "peer_confirmed").Str("peer_node", node).Str("class", class).
		Dur("confirm", now.Sub(start)).Msg(f.Cause)
	d.mu.Lock()
	d.failed[node] = now
	d.mu.Unlock()
	d.report(ctx, f)
}

// probe serves another agent's question about node: a beat to it and a
// check of its slurmd, both answered before the asker's confirmation ends.
func (d *Detector) probe(ctx context.Context, req probeReq) probeReply {
	rep := probeReply{Node: req.Node, Slurmd: slurmdUnknown}
	if req.Node == d.cfg.Self {
		rep.Reachable, rep.Slurmd = true, slurmdUp
		return rep
	}
	if _, ok := d.nodes[req.Node]; !ok {
		rep.Error = fmt.Sprintf("%s is not a node of this job", req.Node)
		return rep
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Confirm*3/4)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		rep.Slurmd = d.checkSlurmd(ctx, req.Node)
	}()
	var br beatReply
	err := d.cfg.Transport.Call(ctx, req.Node, peer.TBeat, beatReq{Node: d.cfg.Self}, &br)
	wg.Wait()
	if err == nil || isRemote(err) {
		rep.Reachable = true
		d.alive(req.Node, false)
	} else {
		rep.Error = err.Error()
	}
	return rep
}
