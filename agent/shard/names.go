// Package shard names what a sharding group's generations hold: the
// sections of a sharded save (docs/ARCHITECTURE.md, "Sharded layout") and
// the store-key shards under which the agent keeps assembled restores,
// loaded persisted copies and peers' replicas. The save path (agent) and
// the restore planner (agent/restore) both read these names, so they live
// below both.
//
// A rank's sharding group and the geometry of its slice (Geometry,
// geometry.go) live here too: which members, which ring, which byte ranges
// are whose shard, which sections a save holds, the erasure code, the AOR
// optimizer groups. It is computed once per registration from the SPEC
// and the client's layout (NewGeometry) and not changed afterwards: a
// new ring gives a new Geometry (WithRing copies), so a reader holding one
// sees a consistent group. How a save's pieces map onto client buffers
// (agent/layout.go) and what the planner and assembler need of it
// (agent/sharded_restore.go) stay in the agent.
package shard

// Sections of a member's sharded generation. Section names carry '@',
// which registered buffer names may not.
const (
	Own    = "rep@shard"  // the member's own shard of the slice
	ARC    = "rep@arc"    // its ring successor's shard (arc)
	In     = "rep@in"     // the data pieces its parity units need (aec)
	Parity = "rep@parity" // its parity units, encoded at commit (aec)
	Rep    = "rep"        // the whole slice, in an assembled restore
	// AOR: AORGrad+G is the client's copy of the ring successor's shard
	// of gradient G; AOR+B the agent's replica of the successor's state
	// buffer B; AORBase the step the replicas are valid for (int64, little
	// endian; -1: invalid).
	AORGrad = "aor@grad@"
	AOR     = "aor@"
	AORBase = "aor@base"
)

// Store-key shards the agent keeps besides the ranks' own
// (tmpfs.DefaultShard).
const (
	// Restored holds assembled restores.
	Restored = "restore"
	// Persisted holds members' persisted generations loaded for a
	// persistent-tier restore.
	Persisted = "persisted"
	// Replica holds the copies a node keeps of other ranks' unreplicated
	// buffers (background replication, agent/replicate.go).
	Replica = "replica"
)
