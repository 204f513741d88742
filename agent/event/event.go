// Package event declares the agent's log events that other programs read
// (the end-to-end tests, people's tools; reft run reads the run record,
// agent/runrecord, which names restores with the restore events here). Each is a JSON line of the agent's log (agent/logging:
// <log dir>/<job>/<node>.jsonl) with "event" set to its name; a
// declaration says which fields every line of it carries, and which some
// lines add. The agent writes these names from here and its readers match
// them from here; the tests of every writing package check each declared
// line they log against its declaration (logtest.Buffer.CheckEvents), so a
// writer that drops a field fails its tests, not a reader in production.
// docs/EVENTS.md lists them for people.
//
// The package imports nothing of the agent: reft run imports it without
// linking the agent.
package event

import (
	"fmt"
	"slices"
	"strings"
)

// Names of the declared events.
const (
	// FailureDetected is agent/detect's coordinator confirming a failure
	// and publishing it to every agent; reft run acts on it.
	FailureDetected = "failure_detected"
	// RankRegistered is a rank's registration with its node's agent.
	RankRegistered = "rank_registered"
	// The restore events: a rank's state served from this node's store
	// (RestoreLocal), fetched from other agents' copies (RestorePeer),
	// rebuilt from parity (Decode), or loaded from the persistent
	// directory (RestorePersistent). reft run summarizes them per node.
	RestoreLocal      = "restore_local"
	RestorePeer       = "restore_peer"
	Decode            = "decode"
	RestorePersistent = "restore_persistent"
	// RestoreFallback: memory cannot restore a sharded rank; the
	// persistent directory will.
	RestoreFallback = "restore_fallback"
	// ChunkFailover: copies of a section failed during a restore and
	// another delivered it.
	ChunkFailover = "chunk_failover"
	// AgentStarted is the agent's first line once it serves.
	AgentStarted = "agent_started"
	// RankFenced: a rank registered again while its old registration's
	// connection lives; the old one is refused from then on.
	RankFenced = "rank_fenced"
	// PeerListening, PeerConnected and PeerRefused are agent/mesh's
	// listener, a peer found, and agent/peer's refusal of a connection.
	PeerListening = "peer_listening"
	PeerConnected = "peer_connected"
	PeerRefused   = "peer_refused"
)

// Restores are the restore events, one per restored rank.
var Restores = []string{RestoreLocal, RestorePeer, Decode, RestorePersistent}

// Base are the fields the agent's logger adds to every line
// (agent/logging), and the ones zerolog writes.
var Base = []string{"time", "level", "message", "job", "step", "node", "restart", "event"}

// Decl is one declared event.
type Decl struct {
	Name string
	By   string // the package that writes it
	// Fields every line carries besides Base; Optional some lines add.
	Fields, Optional []string
}

var restoreOptional = []string{"seq", "verified_by", "verify", "local_bytes", "peer_bytes", "decoded_bytes", "peers",
	"sources", "failovers", "duration", "rate_mb_s", "reason", "lost_shards", "dir"}

// Declared are the declared events.
var Declared = []Decl{
	{Name: FailureDetected, By: "agent/detect",
		Fields:   []string{"failed_node", "class", "latency_s", "last_heard", "detected_at", "reporter", "coordinator"},
		Optional: []string{"ranks", "confirmed_by", "quorum", "votes", "agents"}},
	{Name: RankRegistered, By: "agent", Fields: []string{"rank", "world", "local_rank", "layout", "arena_layout",
		"buffers", "regions", "sections", "bytes", "arena_size", "peer_pid"}},
	{Name: RestoreLocal, By: "agent", Fields: []string{"rank", "generation", "bytes"}, Optional: restoreOptional},
	{Name: RestorePeer, By: "agent", Fields: []string{"rank", "generation", "bytes"}, Optional: restoreOptional},
	{Name: Decode, By: "agent", Fields: []string{"rank", "generation", "bytes"}, Optional: restoreOptional},
	{Name: RestorePersistent, By: "agent", Fields: []string{"rank", "generation", "bytes", "duration"},
		Optional: slices.DeleteFunc(slices.Clone(restoreOptional), func(f string) bool { return f == "duration" })},
	{Name: RestoreFallback, By: "agent", Fields: []string{"rank", "generation", "reason", "lost_shards"}},
	{Name: ChunkFailover, By: "agent/restore", Fields: []string{"owner_rank", "generation", "section", "copies_failed", "chunks", "failovers"}},
	{Name: AgentStarted, By: "agent", Fields: []string{"spec", "socket", "memory_budget", "store_dir", "started_by", "pid"}},
	{Name: RankFenced, By: "agent", Fields: []string{"rank", "pid", "fenced_pid"}},
	{Name: PeerListening, By: "agent/mesh", Fields: []string{"port", "addr", "index", "nodes", "candidate"}},
	{Name: PeerConnected, By: "agent/mesh", Fields: []string{"peer_node", "addr", "peer_index", "candidate"}},
	{Name: PeerRefused, By: "agent/peer", Fields: []string{"remote", "refused", "error"}},
}

// Lookup is the declaration of the event named name.
func Lookup(name string) (Decl, bool) {
	i := slices.IndexFunc(Declared, func(d Decl) bool { return d.Name == name })
	if i < 0 {
		return Decl{}, false
	}
	return Declared[i], true
}

// Check checks one decoded log line: nil when its event is not declared
// or the line carries every field its declaration names.
func Check(line map[string]any) error {
	name, _ := line["event"].(string)
	d, ok := Lookup(name)
	if !ok {
		return nil
	}
	var missing []string
	for _, f := range d.Fields {
		if _, ok := line[f]; !ok {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("a %s line (written by %s) lacks its declared field(s) %s", name, d.By, strings.Join(missing, ", "))
	}
	return nil
}
