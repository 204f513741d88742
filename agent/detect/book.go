package detect

import (
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// book is what this agent knows of the job's agents: when each was last
// heard from, which beats and suspicions are under way, which failed,
// left or hung, what was published, and whether this agent is fenced.
// Every part of the detector (the Detector's beats and hang check, the
// confirmer, the publisher) shares one book. mu guards every field below
// it; each method says whether it takes mu or wants it held. No method
// calls out (Transport, OnFailure, Record) and none blocks but on mu; its
// users hold mu only around book reads and writes, never across a call to
// another agent. The fields above mu are set by New and read-only after.
type book struct {
	self    string
	order   []Node          // the job's allocation in index order (Config.Nodes)
	nodes   map[string]Node // the same, by name
	timeout time.Duration   // Config.Timeout
	log     zerolog.Logger

	mu         sync.Mutex
	heard      map[string]time.Time // last sign of life of each node's agent
	inflight   map[string]bool      // a beat to the node is under way
	discovered map[string]time.Time // last discovery beat to a node not heard from yet
	suspecting map[string]bool
	failed     map[string]time.Time // confirmed or published failures, by node
	gone       map[string]time.Time // agents that said goodbye (Leave)
	published  []Failure            // what this agent published or learnt, for duplicates
	hung       map[int]time.Time    // a rank reported hung, with the progress time it hung at
	waiting    map[int]time.Time    // a rank said to be waiting (rank_waiting), same
	watching   []string
	coord      string
	fenced     bool // see Detector
}

// live lists the nodes not known to have failed or left, in index order
// (self is always live to itself). b.mu is held.
func (b *book) live() []string {
	out := make([]string, 0, len(b.order))
	for _, n := range b.order {
		_, dead := b.failed[n.Name]
		_, gone := b.gone[n.Name]
		if !(dead || gone) || n.Name == b.self {
			out = append(out, n.Name)
		}
	}
	return out
}

// population lists the agents a verdict is weighed against: the live
// nodes (index order) whose agent was ever heard from (a beat, a request,
// the mesh's connection: Seen, or a discovery beat), self included. A
// node whose agent never answered (a spare reft run keeps idle) is no
// voter. b.mu is held.
func (b *book) population() []string {
	var out []string
	for _, n := range b.live() {
		if n == b.self || !b.heard[n].IsZero() {
			out = append(out, n)
		}
	}
	return out
}

// alive records a sign of life of node's agent; a node published as
// failed that answers again (its agent was restarted) is live again, and
// one that said goodbye is live again when it sends a request (beat) of
// its own: a leaving agent stops beating before it says goodbye, so only
// a new agent does. It takes mu.
func (b *book) alive(node string, request bool) {
	if _, ok := b.nodes[node]; !ok {
		return
	}
	now := time.Now()
	b.mu.Lock()
	b.heard[node] = now
	at, wasFailed := b.failed[node]
	if wasFailed && now.After(at) {
		delete(b.failed, node)
	}
	if request {
		delete(b.gone, node)
	}
	b.mu.Unlock()
	if wasFailed {
		b.log.Info().Str("event", "peer_back").Str("peer_node", node).
			Msgf("the agent of %s answers again after its failure; watching it again", node)
	}
}

// left records that node's agent stopped on purpose: it is not watched,
// suspected nor reported until it answers again. It takes mu.
func (b *book) left(node string) {
	if _, ok := b.nodes[node]; !ok || node == b.self {
		return
	}
	b.mu.Lock()
	b.gone[node] = time.Now()
	b.mu.Unlock()
	b.log.Info().Str("event", "peer_left").Str("peer_node", node).
		Msgf("the agent of %s stopped on purpose (its job step or allocation ended there); not watching it", node)
}

// fence fences this agent, said once per isolation. It takes mu.
func (b *book) fence(why string) {
	b.mu.Lock()
	was := b.fenced
	b.fenced = true
	b.mu.Unlock()
	if !was {
		b.log.Warn().Str("event", "detect_fenced").
			Msgf("this agent is cut off from the job (%s): it fences itself, publishing no verdict and voting on none until it reaches a quorum again", why)
	}
}

// rejoin ends the fence once the agents heard from within Timeout make a
// Quorum again (this one included). b.mu is held.
func (b *book) rejoin() {
	pop := b.population()
	with := []string{b.self}
	now := time.Now()
	for _, n := range pop {
		if at := b.heard[n]; n != b.self && now.Sub(at) < b.timeout {
			with = append(with, n)
		}
	}
	if Quorum(with, pop) {
		b.fenced = false
		b.log.Info().Str("event", "detect_unfenced").Strs("reached", with).
			Msgf("this agent reaches %d of the job's %d agents again (a quorum): no longer fenced", len(with), len(pop))
	}
}

// seen is Detector.Seen. It takes mu.
func (b *book) seen(node string, at time.Time) {
	if _, ok := b.nodes[node]; !ok {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if at.After(b.heard[node]) {
		b.heard[node] = at
	}
}

// isFenced says whether this agent is fenced (see Detector). It takes mu.
func (b *book) isFenced() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.fenced
}
