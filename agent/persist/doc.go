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
// Fencing: every writer writes for an Epoch (the job's requeue count, then
// reft run's relaunch), recorded in COMMITTED. A writer whose epoch is
// older than that of any committed generation of the rank is stale (a
// node declared lost, a partitioned one, a queued write) and writes and
// removes nothing (FencedError, checked before the write and again
// before the rename); retention never removes a newer epoch's generation.
// The agent passes only the requeue count today: reft run's relaunches
// are not yet told to it, so two writers of one run are not fenced apart.
//
// The Persister decides which generations to write (see Interval) and
// writes them in the background from a pinned tmpfs.Reader, one at a time.
package persist
