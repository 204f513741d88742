// Package tmpfs is the node-local snapshot store: where the generations of
// every rank of a job live on one node, in memory that outlives the rank
// and the agent but not the node.
//
// Layout (directories 0700, files 0600, all owned by the job's user):
//
//	<root>/                      01777 when the store creates it
//	<root>/<uid>/<jobid>/
//	    .lock                    flock held by the job's agent
//	    r<rank>/<shard>/         one per rank and protected shard
//	        arena-<n>            snapshot bytes; reused by later generations
//	        g<step>-<seq>/       one generation
//	            MANIFEST         JSON: step, rank, layout, sections ("buffers"), CRC-32C
//	                             per chunk, the rank's buffers ("sources") and where
//	                             their bytes lie ("regions")
//	            COMMITTED        marker naming the manifest's length and CRC
//	            BAD              present once a restore found a corrupt chunk
//	    msglog/                  the ranks' message logs (agent/msglog, SubDir)
//	        arena-<n>            one message's bytes
//	        arena-<n>.rec        its record (job, rank, key, size, CRC-32C)
//
// A generation commits in this order: its bytes are in the arena, its
// MANIFEST is in place, and its COMMITTED marker is renamed into place last.
// Both files are written to a temporary name and renamed, so no reader ever
// sees one torn. No fsync is needed: tmpfs has no backing store, so a write
// is in the page cache, visible to every process, the moment the syscall
// (or the store into the shared mapping) returns, and no process crash can
// undo it; a node crash loses the whole store anyway. What matters is only
// the order of these steps, which program order gives.
//
// Generations are ordered by seq, the commit order, not by step: after a
// job restores an older generation and trains on, its new step s supersedes
// every older generation whose step is s or more (they belong to the
// abandoned timeline). Per rank and shard the store keeps the newest
// completed generation, the one being written, and Options.Keep older
// completed ones; the previous completed generation is released only after
// the new one has committed. A released generation's arena is reused once
// no Reader pins it; Options.Spare arenas are kept free for such pins (the
// agent's persistent writer), so saves never allocate while one is held.
package tmpfs
