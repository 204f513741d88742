// Package persist is the agent's persistent tier: completed generations of
// the node's ranks copied to a shared directory at a low frequency, and
// read back when a rank has no in-memory copy of the step the job restores
// (more losses than the in-memory redundancy covers, or a node lost).
//
// Layout (directories 0700, files 0600, owned by the job's user):
//
//	<dir>/<jobid>/r<rank>/g<step>/
//	    MANIFEST     the tmpfs manifest (JSON): buffers, offsets, CRC-32C per chunk
//	    data         the arena bytes: buffer b at b.Offset, padding zero
//	    COMMITTED    marker pinning MANIFEST by length and CRC-32C, and data by length
//	    BAD          present once a restore found a corrupt chunk
//	<dir>/<jobid>/r<rank>/.tmp-g<step>-<node>-<pid>/   a write in progress
//
// A generation is written in its temporary directory (data, MANIFEST, then
// COMMITTED, each fsynced), the directory is fsynced and renamed into place,
// and the rank directory fsynced: a shared filesystem may lose unsynced data
// on a server or client crash, and a reader must never find a g<step>
// directory without all of its bytes. Writers remove their own node's
// stale temporary directories of their rank, and other nodes' once older
// than an hour (a write in progress is left alone). Per rank the newest generation and the one
// before it are kept; a generation with a step above the one just written,
// or above a step the job has since restored, belongs to an abandoned
// timeline and is removed.
//
// Fencing: every write is for an Epoch (the job's requeue count, then
// the Slurm step id of the rank that committed the generation, from its
// hello: each reft run relaunch is a later step), recorded in COMMITTED.
// A write whose epoch is older than that of any committed generation of
// the rank is stale (a node declared lost, a partitioned one, a queued
// write) and writes and removes nothing (FencedError, checked before the
// write and again before the rename; a shared filesystem offers no
// compare-and-swap, so a newer write landing inside that last window is
// not caught); retention never removes a newer epoch's generation.
//
// The Persister decides which generations to write (see Interval) and
// writes them in the background from a pinned tmpfs.Reader, one at a time.
package persist
