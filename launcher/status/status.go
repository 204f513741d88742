// Package status is `reft status [JOBID]`: every node of a running job, as
// its agent reports itself over the job's authenticated peer port (an agent
// up or not and why, the ranks' newest committed steps, how they are
// protected, bytes held, memory budget used).
//
// It asks each agent directly over the mesh port (docs/PEER_PROTOCOL.md,
// "Status"), not through a Slurm step: it works from a login node or the
// batch host with no allocation of its own, while the job's nodes are busy
// or some are lost, and the agents' mutual authentication (same job, same
// uid) is what keeps another user out.
package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/reft-hpc/reft/agent/mesh"
	"github.com/reft-hpc/reft/agent/peer"
	"github.com/reft-hpc/reft/agent/proto"
)

// Job is what Slurm says about the job: its state, owner and allocation.
type Job struct {
	ID    string
	State string // RUNNING, PENDING, ...
	User  string // the owner's name, as scontrol prints it
	UID   int
	// Nodes is the allocation, spares included, indexed as the agents
	// index it (agent/mesh): the candidate ports follow from it.
	Nodes []mesh.Node
	// NodeStates is each node's Slurm state (IDLE, ALLOCATED, DOWN*, ...).
	NodeStates map[string]string
	// StepNodes is the nodes that run a step of the job (batch and extern
	// steps aside); nil: unknown. A node in none needs no agent.
	StepNodes map[string]bool
	// Released is the nodes of Nodes that the allocation no longer holds
	// (a --no-kill job shrinks after a node failure); nil: none.
	Released map[string]bool
}

// JobSource tells a job's state, owner and nodes: Slurm, or a fake in tests.
type JobSource interface {
	Job(ctx context.Context, id string) (Job, error)
}

// Report is what `reft status` prints; --json prints it as one object.
type Report struct {
	Job   string       `json:"job"`
	State string       `json:"state"`
	User  string       `json:"user"`
	Spec  string       `json:"spec,omitempty"` // as the agents run it
	Nodes []NodeReport `json:"nodes"`
	// Stragglers are the ranks whose own work per step is well above the
	// job's (FindStragglers); reported, never acted on.
	Stragglers []Straggler `json:"stragglers,omitempty"`
}

// Agent states of a NodeReport.
const (
	AgentUp      = "up"      // answered with its status
	AgentDown    = "down"    // nothing of this job answered on the node's ports
	AgentRefused = "refused" // the job's agent answered but refused us
	AgentNone    = "none"    // no agent, and the node runs no step of the job (a spare)
)

// NodeReport is one node of the job.
type NodeReport struct {
	Node  string `json:"node"`
	Index int    `json:"index"`
	// SlurmState is the node's state in Slurm; InAllocation is false for
	// a node the agents know but the allocation lost (a --no-kill job
	// shrinks after a node failure).
	SlurmState   string `json:"slurm_state,omitempty"`
	InAllocation bool   `json:"in_allocation"`
	Agent        string `json:"agent"`
	Addr         string `json:"addr,omitempty"`  // the agent's peer listener
	Error        string `json:"error,omitempty"` // why the agent is not up
	// Status is the agent's status reply (docs/PROTOCOL.md, "status").
	Status *proto.Status `json:"status,omitempty"`
	// Warnings name degraded states: peering off, peers not connected,
	// unpinned arenas, failed saves, corrupt generations, ranks without
	// protection across nodes, GPU failing.
	Warnings []string `json:"warnings,omitempty"`
}

// Options configures Query.
type Options struct {
	// Peer is the transport configuration (peer.FromAgentConfig) with Job,
	// UID (the caller's), Node (a name for the agents' logs) and Role
	// RoleStatus; Auth must prove the caller's uid.
	Peer peer.Config
	// Jobs tells the job's state, owner and nodes.
	Jobs JobSource
	// Timeout bounds the whole query; 0: 10 s.
	Timeout time.Duration
}

// ErrForeign is returned for another user's job: its agents would refuse
// us, and Slurm's view of it is not ours to print either.
var ErrForeign = errors.New("not your job")

// ErrNotRunning is what errors.Is finds in the error for a job that no
// longer runs (or never ran): it has no agents to ask.
var ErrNotRunning = errors.New("job not running")

// notRunning is an ErrNotRunning with its own message.
type notRunning struct{ msg string }

func (e notRunning) Error() string        { return e.msg }
func (e notRunning) Is(target error) bool { return target == ErrNotRunning }

// Query asks every node's agent of the job for its status.
func Query(ctx context.Context, o Options) (*Report, error) {
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	job := o.Peer.Job
	j, err := o.Jobs.Job(ctx, job)
	if err != nil {
		return nil, err
	}
	if j.UID != o.Peer.UID {
		// The agents would refuse anyway (they accept only the job's uid);
		// saying so here names the reason instead of N refusals.
		return nil, fmt.Errorf("%w: job %s belongs to %s (uid %d) and you are uid %d; its agents answer only the job's own user, so run reft status as %s",
			ErrForeign, job, j.User, j.UID, o.Peer.UID, j.User)
	}
	if j.State != "RUNNING" && j.State != "COMPLETING" {
		return nil, notRunning{fmt.Sprintf("job %s is %s, not running: its agents live only while it runs (reft log %s tells what happened)", job, j.State, job)}
	}
	o.Peer.Role = peer.RoleStatus
	if o.Peer.DialTimeout <= 0 {
		o.Peer.DialTimeout = 2 * time.Second
	}
	cl, err := peer.NewClient(o.Peer)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	pc := o.Peer
	lo, hi := pc.PortRange[0], pc.PortRange[1]
	rep := &Report{Job: job, State: j.State, User: j.User, Nodes: make([]NodeReport, len(j.Nodes))}
	var wg sync.WaitGroup
	for i, n := range j.Nodes {
		rep.Nodes[i] = NodeReport{Node: n.Name, Index: n.Index, SlurmState: j.NodeStates[n.Name], InAllocation: !j.Released[n.Name]}
		wg.Add(1)
		go func(nr *NodeReport, n mesh.Node) {
			defer wg.Done()
			var addrs []string
			for _, p := range mesh.Candidates(job, lo, hi, n.Index, len(j.Nodes)) {
				addrs = append(addrs, net.JoinHostPort(n.Addr, strconv.Itoa(p)))
			}
			ask(ctx, cl, nr, addrs)
		}(&rep.Nodes[i], n)
	}
	wg.Wait()
	// A node whose agent was not at its candidates may still be known to
	// the others: they found it (an allocation that shrank after a node
	// loss changes the candidates) or lost it (a node no longer listed).
	known := map[string]proto.PeerStatus{}
	for _, nr := range rep.Nodes {
		if nr.Status == nil || nr.Status.Peering == nil {
			continue
		}
		for _, ps := range nr.Status.Peering.Peers {
			if k, ok := known[ps.Node]; !ok || (k.Addr == "" && ps.Addr != "") {
				known[ps.Node] = ps
			}
		}
	}
	for i := range rep.Nodes {
		nr := &rep.Nodes[i]
		if ps, ok := known[nr.Node]; ok && nr.Agent != AgentUp && nr.Agent != AgentRefused && ps.Addr != "" {
			ask(ctx, cl, nr, []string{ps.Addr})
		}
		delete(known, nr.Node)
	}
	for _, ps := range sortedPeers(known) {
		nr := NodeReport{Node: ps.Node, Index: ps.Index, SlurmState: j.NodeStates[ps.Node]}
		if ps.Addr != "" {
			ask(ctx, cl, &nr, []string{ps.Addr})
		} else {
			nr.Agent, nr.Error = AgentDown, "not found by the other agents either"
		}
		if nr.Agent != AgentUp {
			nr.Error = "no longer in the job's allocation (Slurm removed it after a failure?): " + nr.Error
		}
		rep.Nodes = append(rep.Nodes, nr)
	}
	for i := range rep.Nodes {
		nr := &rep.Nodes[i]
		if nr.Agent == AgentDown && !nr.InAllocation {
			nr.Error = "no longer in the job's allocation (Slurm removed it after a failure?): " + nr.Error
		}
		if nr.Agent == AgentDown && nr.InAllocation && j.StepNodes != nil && !j.StepNodes[nr.Node] {
			// The first reft step on a node starts its agent: a spare that
			// reft run keeps out of the step has none yet.
			nr.Agent, nr.Error = AgentNone, "no agent: the node runs no step of this job (a spare, or not used yet)"
		}
	}
	for i := range rep.Nodes {
		nr := &rep.Nodes[i]
		if nr.Status != nil && rep.Spec == "" {
			rep.Spec = nr.Status.Spec
		}
		nr.Warnings = warnings(nr, rep.Nodes)
	}
	rep.Stragglers = FindStragglers(rep.Nodes)
	return rep, nil
}

func sortedPeers(m map[string]proto.PeerStatus) []proto.PeerStatus {
	out := make([]proto.PeerStatus, 0, len(m))
	for _, ps := range m {
		out = append(out, ps)
	}
	slices.SortFunc(out, func(a, b proto.PeerStatus) int { return a.Index - b.Index })
	return out
}

// ask tries addrs in order, as an agent searches for a peer
// (docs/PEER_PROTOCOL.md, "Finding peers"), and fills nr with the first
// agent of this job on nr's node that answers.
func ask(ctx context.Context, cl *peer.Client, nr *NodeReport, addrs []string) {
	var tried []outcome
	for _, addr := range addrs {
		node, raw, err := cl.Status(ctx, addr)
		if err == nil && node != nr.Node {
			// possible only when the candidates of two nodes overlap
			cl.Drop(addr)
			tried = append(tried, outcome{addr, "the agent of " + node})
			continue
		}
		if err == nil {
			var st proto.Status
			if err := json.Unmarshal(raw, &st); err != nil {
				nr.Agent, nr.Addr, nr.Error = AgentUp, addr, fmt.Sprintf("its status reply does not decode: %v (agent and reft of different versions?)", err)
				return
			}
			nr.Agent, nr.Addr, nr.Status, nr.Error = AgentUp, addr, &st, ""
			return
		}
		cl.Drop(addr)
		if ctx.Err() != nil {
			tried = append(tried, outcome{addr, ctx.Err().Error()})
			break
		}
		if ours, why := refusedByOurs(err); ours {
			nr.Agent, nr.Addr, nr.Error = AgentRefused, addr, "the agent refused us: "+why
			return
		}
		tried = append(tried, outcome{addr, short(err)})
	}
	nr.Agent = AgentDown
	nr.Error = "no agent of this job answers on its ports (" + summarize(tried) + ")"
}

// outcome is what one candidate address answered.
type outcome struct{ addr, what string }

// summarize joins outcomes, one entry per host and answer:
// "10.0.0.3 ports 47662,47666: connection refused".
func summarize(os []outcome) string {
	var parts []string
	for i := 0; i < len(os); {
		host, _, _ := net.SplitHostPort(os[i].addr)
		var ports []string
		k := i
		for ; k < len(os); k++ {
			h, p, _ := net.SplitHostPort(os[k].addr)
			if h != host || os[k].what != os[i].what {
				break
			}
			ports = append(ports, p)
		}
		word := "port"
		if len(ports) > 1 {
			word = "ports"
		}
		parts = append(parts, fmt.Sprintf("%s %s %s: %s", host, word, strings.Join(ports, ","), os[i].what))
		i = k
	}
	if len(parts) == 0 {
		return "no candidate port"
	}
	return strings.Join(parts, "; ")
}

// refusedByOurs tells a refusal by this job's agent (which checked our
// credential) from one by another job's agent on a shared port.
func refusedByOurs(err error) (bool, string) {
	var e *peer.Error
	if !errors.As(err, &e) || e.Code != peer.CodeForbidden {
		return false, ""
	}
	if strings.Contains(e.Message, "this agent serves job") && strings.HasPrefix(e.Message, "dialer is job") {
		return false, ""
	}
	return true, e.Message
}

// short is a dial error without the transport's generic advice.
func short(err error) string {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return "timed out"
	}
	var e *peer.Error
	if errors.As(err, &e) {
		return e.Code + ": " + e.Message
	}
	return err.Error()
}

// warnings lists nr's degraded states.
func warnings(nr *NodeReport, all []NodeReport) []string {
	var w []string
	if nr.Agent != AgentUp {
		if s := nr.SlurmState; s != "" && (strings.Contains(s, "DOWN") || strings.Contains(s, "FAIL") || strings.HasSuffix(s, "*")) {
			w = append(w, "Slurm says the node is "+s)
		}
		return w
	}
	st := nr.Status
	if st == nil {
		return w
	}
	if p := st.Peering; p != nil {
		switch p.State {
		case proto.PeeringOff:
			w = append(w, "peering off: "+p.Reason+" (snapshots stay on this node; no peer can restore from it)")
		case proto.PeeringStarting:
			w = append(w, "peering still starting")
		default:
			var lost []string
			for _, ps := range p.Peers {
				if !ps.Connected && needsAgent(ps.Node, all) {
					lost = append(lost, ps.Node)
				}
			}
			if len(lost) > 0 {
				w = append(w, "not connected to "+strings.Join(lost, ","))
			}
		}
	}
	if m := st.Memory; m != nil {
		if m.UnpinnedArenas > 0 {
			w = append(w, fmt.Sprintf("%d arena(s) not pinned (raise RLIMIT_MEMLOCK for the job: they may be swapped out)", m.UnpinnedArenas))
		}
		if m.Budget > 0 && float64(m.InUse) > 0.9*float64(m.Budget) {
			w = append(w, fmt.Sprintf("memory budget %.0f%% used", 100*float64(m.InUse)/float64(m.Budget)))
		}
	}
	if c := st.Store; c != nil {
		if c.SaveFailures > 0 {
			w = append(w, fmt.Sprintf("%d snapshot save(s) failed (%d tmpfs full, %d over the memory budget; the agent's log says why)",
				c.SaveFailures, c.NoSpace, c.OverBudget))
		}
		if c.BadGenerations > 0 {
			w = append(w, fmt.Sprintf("%d generation(s) found corrupt (%d chunk(s) failed their CRC-32C)", c.BadGenerations, c.ChecksumFailures))
		}
	}
	for _, r := range st.Ranks {
		p := r.Protection
		switch {
		case p == nil:
		case p.Mode == proto.ProtectLocal && protects(st.Spec):
			w = append(w, fmt.Sprintf("rank %d is not protected across nodes (one DP rank, or nothing registered replicated): only this node holds its state", r.Rank))
		}
		if r.Newest < 0 && p != nil && p.Connected {
			w = append(w, fmt.Sprintf("rank %d has committed nothing yet", r.Rank))
		}
	}
	if g := st.GPU; g != nil && g.State == proto.GPUFailing {
		w = append(w, "GPU failing: "+g.Reason)
	}
	return w
}

// needsAgent: node is in the allocation and runs a step of the job.
func needsAgent(node string, all []NodeReport) bool {
	for _, n := range all {
		if n.Node == node {
			return n.InAllocation && n.Agent != AgentNone
		}
	}
	return false
}

// protects reports whether a canonical SPEC protects across nodes.
func protects(spec string) bool {
	for _, f := range strings.FieldsFunc(spec, func(r rune) bool { return r == '+' || r == ',' }) {
		m, _, _ := strings.Cut(f, ":")
		if m == "arc" || m == "aec" || m == "aor" {
			return true
		}
	}
	return false
}
