package tmpfs

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/reft-hpc/reft/hostmem"
)

var (
	// ErrNoSpace: the store's filesystem is full. The save failed; the
	// trainer can go on without this snapshot and nothing committed is lost.
	ErrNoSpace = errors.New("snapshot store full")
	// ErrOverBudget: the memory budget refused the save (same guarantees).
	ErrOverBudget = hostmem.ErrOverBudget
	// ErrCorrupt: a restore found a chunk whose checksum does not match.
	ErrCorrupt = errors.New("snapshot chunk corrupt")
	// ErrNoGeneration: there is no completed generation to restore.
	ErrNoGeneration = errors.New("no completed generation")
	// ErrLocked: another live agent holds the job's store.
	ErrLocked = errors.New("snapshot store locked by another agent")
)

// BadChunk is one chunk that failed its checksum. Offset is within the
// buffer; the chunk can be fetched again from a peer copy or parity.
type BadChunk struct {
	Buffer         string
	Index          int
	Offset, Length int64
	Want, Got      uint32
}

// ChecksumError lists every corrupt chunk of a generation. The restore
// still copied all the other chunks into the caller's buffers.
type ChecksumError struct {
	Key    Key
	Step   int64
	Seq    uint64
	Chunks []BadChunk
}

func (e *ChecksumError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "tmpfs: %s step %d: %d chunk(s) fail their CRC-32C, generation marked bad:", e.Key, e.Step, len(e.Chunks))
	for i, c := range e.Chunks {
		if i == 8 {
			fmt.Fprintf(&b, " and %d more", len(e.Chunks)-i)
			break
		}
		fmt.Fprintf(&b, " buffer %q chunk %d (bytes %d..%d) stored %#08x read %#08x;", c.Buffer, c.Index, c.Offset, c.Offset+c.Length, c.Want, c.Got)
	}
	b.WriteString(" fetch those chunks from a peer or fall back to an older generation")
	return b.String()
}

func (e *ChecksumError) Unwrap() error { return ErrCorrupt }

// Metrics are the store's counters, for the agent to export.
type Metrics struct {
	Saves            atomic.Int64 // generations begun
	Commits          atomic.Int64
	SaveFailures     atomic.Int64 // saves that failed (any reason)
	NoSpace          atomic.Int64 // of those, a full filesystem
	OverBudget       atomic.Int64 // of those, the memory budget
	Aborted          atomic.Int64 // ongoing generations discarded
	Released         atomic.Int64 // completed generations dropped by retention
	Restores         atomic.Int64
	ChecksumFailures atomic.Int64 // corrupt chunks found
	BadGenerations   atomic.Int64
	Discarded        atomic.Int64 // incomplete or damaged generations removed when re-indexing
	StoredBytes      atomic.Int64 // gauge: arena bytes in the store
}
