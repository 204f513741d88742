// Package msglog is the agent's message log, the storage side of SWIFT's
// logging-based recovery of pipeline stages (docs/ARCHITECTURE.md,
// "Message log"): the messages each rank sent across a machine boundary,
// held in host memory by (stream, step, seq) until the rank truncates
// them, and read back only by the rank that wrote them.
//
// Each message lives in an arena of its own (a shared file the rank maps
// to copy into and out of, so that the bytes never travel through the
// socket). The store computes the CRC-32C of the bytes it holds when an
// append commits, refuses them when they differ from the client's, and
// verifies them again before every read. A rank's log is bounded by a cap
// (Config.Cap): an append over it fails, and nothing is ever dropped but
// by Truncate.
//
// A stored message outlives the agent: next to its arena lies its record
// (record.go), and the job's next agent on the node adopts both (Adopt),
// as the snapshot store re-indexes its generations. Close unmaps and
// keeps them; the job's end removes the store directory, and the node's
// loss loses them.
//
// Concurrency: every method is safe for concurrent use. The checksum
// passes (commit, read) run outside the store's lock; a message being
// verified keeps its arena until the pass is done, even if a truncation
// dropped it meanwhile.
package msglog

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/internal/crc32c"
)

// Arena is one message's shared memory; *hostmem.Arena is one.
type Arena interface {
	Bytes() []byte    // the whole arena, Size bytes
	Size() int64      // page-rounded, at least the size asked for
	FilePath() string // what the rank maps; its base name is the arena's, arena-N
	Close() error     // unmap, return the budget, keep the file
	Remove() error    // unmap, return the budget, delete the file
}

// Key names one message.
type Key = proto.LogKey

// Errors. Every error of the store wraps one of these, or the allocator's.
var (
	// ErrOverCap: the rank's log would pass its cap (Config.Cap).
	ErrOverCap = errors.New("message log over its cap")
	// ErrConflict: the key is stored with other bytes.
	ErrConflict = errors.New("message logged with other bytes")
	// ErrCorrupt: a message's bytes fail their CRC-32C.
	ErrCorrupt = errors.New("logged message corrupt")
	// ErrNotFound: the rank holds no message of that key.
	ErrNotFound = errors.New("message not logged")
)

// Config configures a Store.
type Config struct {
	// Dir is where the arena files are made (one per message).
	Dir string
	// Alloc creates an arena of at least size bytes at path.
	Alloc func(path string, size int64) (Arena, error)
	// Cap returns the most arena bytes one rank's log may hold (its
	// messages, an append in progress and freed arenas kept for reuse),
	// and how it was derived, for the error; asked at every append.
	Cap func() (bytes int64, how string)

	// Job is the job's id, written in every record; Adopt refuses a
	// record of another job.
	Job string
	// UID owns the directory's files; Adopt refuses another user's
	// (negative: not checked).
	UID int
	// Adopt maps an arena file an earlier agent left, refusing one that is
	// not an arena of UID (hostmem.Allocator.AdoptOwned); Discard removes
	// one that cannot be adopted (hostmem.Allocator.Discard). Both are
	// needed by Store.Adopt only.
	Adopt   func(path string) (Arena, error)
	Discard func(path string) error
}

// Store is the node's message logs, one per rank.
type Store struct {
	cfg Config

	mu    sync.Mutex
	ranks map[int]*rankLog
	next  uint64 // arena file names

	held     atomic.Int64 // payload bytes of the stored messages
	appended atomic.Int64 // payload bytes committed since the start
	corrupt  atomic.Int64 // messages that failed their CRC-32C
}

// rankLog is one rank's log; guarded by Store.mu.
type rankLog struct {
	msgs   map[Key]*msg
	arenas int64 // bytes of every arena the rank holds: messages, pending, spares
	spares []Arena
}

// msg is one message. Its arena is freed when it is dropped and no
// checksum pass reads it.
type msg struct {
	arena   Arena
	size    int64
	crc     uint32
	bad     bool // failed its CRC-32C on a read
	readers int
	dropped bool
	// stale: its record could not be removed, so its arena is deleted
	// rather than reused (a reused arena under a stale record would be
	// adopted as that message by the next agent, and fail its CRC-32C).
	stale bool
}

// New returns an empty store.
func New(cfg Config) *Store {
	return &Store{cfg: cfg, ranks: map[int]*rankLog{}}
}

// Counts are a store's byte and event counts, all ranks together.
type Counts struct {
	Held     int64 // payload bytes of the stored messages
	Appended int64 // payload bytes committed since the store was made
	Corrupt  int64 // messages found corrupt on a read
}

// Counts returns the store's counts now.
func (s *Store) Counts() Counts {
	return Counts{Held: s.held.Load(), Appended: s.appended.Load(), Corrupt: s.corrupt.Load()}
}

// RankBytes is the arena bytes rank's log holds, as the cap counts them.
func (s *Store) RankBytes(rank int) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rl := s.ranks[rank]; rl != nil {
		return rl.arenas
	}
	return 0
}

func (s *Store) rank(r int) *rankLog {
	rl := s.ranks[r]
	if rl == nil {
		rl = &rankLog{msgs: map[Key]*msg{}}
		s.ranks[r] = rl
	}
	return rl
}

// Pending is an append whose bytes the client is copying into Arena.
// Exactly one of Commit and Abort must follow.
type Pending struct {
	s    *Store
	rank int
	key  Key
	m    *msg
	done bool
}

// Key is the message being appended.
func (p *Pending) Key() Key { return p.key }

// Arena is where the client copies the message (at offset 0).
func (p *Pending) Arena() Arena { return p.m.arena }

// Begin starts rank's append of key, size bytes, and returns the arena to
// copy them into. A key held with another size is ErrConflict at once (a
// message found corrupt is replaced instead); one held with the same size
// is decided by Commit. Over the rank's cap it fails with ErrOverCap; the
// allocator's errors (a full memory budget or tmpfs) pass through, after
// freed arenas kept for reuse were given back and the allocation tried
// once more.
func (s *Store) Begin(rank int, key Key, size int64) (*Pending, error) {
	if err := proto.CheckLogKey(key); err != nil {
		return nil, err
	}
	if size <= 0 {
		return nil, fmt.Errorf("msglog: %s: size %d must be positive", key, size)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rl := s.rank(rank)
	if m := rl.msgs[key]; m != nil && !m.bad && m.size != size {
		return nil, fmt.Errorf("%w: rank %d's %s is logged as %d bytes, this append has %d: "+
			"a step sends the same bytes every time it runs (a replay must be bit-identical), so this rank computed something else "+
			"for that step; truncate the log past it if the old message is no longer wanted", ErrConflict, rank, key, m.size, size)
	}
	a, err := s.take(rank, rl, size)
	if err != nil {
		return nil, err
	}
	return &Pending{s: s, rank: rank, key: key, m: &msg{arena: a, size: size}}, nil
}

func conflict(rank int, key Key, m *msg, size int64, crc uint32) error {
	return fmt.Errorf("%w: rank %d's %s is logged as %d bytes with CRC-32C %#08x, this append has %d bytes with %#08x: "+
		"a step sends the same bytes every time it runs (a replay must be bit-identical), so this rank computed something else "+
		"for that step; truncate the log past it if the old message is no longer wanted",
		ErrConflict, rank, key, m.size, m.crc, size, crc)
}

// take finds an arena of at least size bytes for rank: a freed one kept
// for reuse, else a new one within the cap. s.mu is held.
func (s *Store) take(rank int, rl *rankLog, size int64) (Arena, error) {
	best := -1
	for i, a := range rl.spares {
		// A spare no more than a quarter (and a page) larger: messages of
		// a stream have one size, and a much larger spare would waste
		// what the cap allows.
		if n := a.Size(); n >= size && n <= size+size/4+64<<10 && (best < 0 || n < rl.spares[best].Size()) {
			best = i
		}
	}
	if best >= 0 {
		a := rl.spares[best]
		rl.spares = slices.Delete(rl.spares, best, best+1)
		return a, nil
	}
	capBytes, how := s.cfg.Cap()
	if rl.arenas+size > capBytes {
		rl.dropSpares()
	}
	if rl.arenas+size > capBytes {
		return nil, fmt.Errorf("%w: rank %d's message log holds %d bytes and this message needs %d more, over the rank's cap of %d bytes (%s); "+
			"nothing was dropped: snapshot more often (a committed snapshot lets the trainer truncate the log), or raise store.memory_budget in reft.toml",
			ErrOverCap, rank, rl.arenas, size, capBytes, how)
	}
	// Named as the store names its arenas: on hugetlbfs the file in the
	// store is a link, and the job's cleanup (tmpfs.JobDir.Remove) follows
	// links of that name to the mount's file.
	path := filepath.Join(s.cfg.Dir, "arena-"+strconv.FormatUint(s.next, 10))
	s.next++
	a, err := s.cfg.Alloc(path, size)
	if err != nil {
		// The node's budget or tmpfs may be full of the ranks' spares.
		spares := false
		for _, o := range s.ranks {
			spares = spares || len(o.spares) > 0
			o.dropSpares()
		}
		if spares {
			a, err = s.cfg.Alloc(path, size)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("msglog: rank %d: an arena of %d bytes for a message: %w", rank, size, err)
	}
	rl.arenas += a.Size()
	return a, nil
}

// dropSpares frees rl's arenas kept for reuse. Store.mu is held.
func (rl *rankLog) dropSpares() {
	for _, a := range rl.spares {
		rl.arenas -= a.Size()
		a.Remove()
	}
	rl.spares = nil
}

// Commit checksums the copied bytes and stores the message. Bytes whose
// CRC-32C is not crc, the client's as it copied them, are refused with
// ErrCorrupt (the client's buffer changed during the copy, or memory
// failed) and the arena is freed. A key already held with the same size
// and CRC-32C (a replayed step's message) keeps the held copy and frees
// this one: held is true. Other bytes under a held key are ErrConflict.
func (p *Pending) Commit(crc uint32) (held bool, err error) {
	if p.done {
		return false, fmt.Errorf("msglog: %s: the append was already committed or aborted", p.key)
	}
	p.done = true
	got := crc32c.Checksum(p.m.arena.Bytes()[:p.m.size])
	s := p.s
	s.mu.Lock()
	defer s.mu.Unlock()
	rl := s.rank(p.rank)
	if got != crc {
		rl.free(p.m.arena)
		return false, fmt.Errorf("%w: rank %d's %s: the %d bytes copied into the agent's arena have CRC-32C %#08x, the client's copy had %#08x: "+
			"the buffer changed while it was copied, or this host's memory is failing; append it again",
			ErrCorrupt, p.rank, p.key, p.m.size, got, crc)
	}
	p.m.crc = got
	old := rl.msgs[p.key]
	if old != nil && !old.bad {
		rl.free(p.m.arena)
		if old.size == p.m.size && old.crc == p.m.crc {
			return true, nil
		}
		return false, conflict(p.rank, p.key, old, p.m.size, p.m.crc)
	}
	// The record first: a message the next agent could not adopt is not
	// stored. It is written under s.mu so that a truncation cannot remove
	// it before it exists.
	if err := s.record(p.rank, p.key, p.m); err != nil {
		rl.free(p.m.arena)
		return false, fmt.Errorf("msglog: rank %d's %s: %w (the message is not stored: the job's next agent on this node could not adopt it; append it again)", p.rank, p.key, err)
	}
	if old != nil {
		s.drop(rl, old)
	}
	rl.msgs[p.key] = p.m
	s.held.Add(p.m.size)
	s.appended.Add(p.m.size)
	return false, nil
}

// Abort frees the append's arena for reuse; a no-op after Commit.
func (p *Pending) Abort() {
	if p.done {
		return
	}
	p.done = true
	p.s.mu.Lock()
	p.s.rank(p.rank).free(p.m.arena)
	p.s.mu.Unlock()
}

// free keeps a for reuse. Store.mu is held.
func (rl *rankLog) free(a Arena) { rl.spares = append(rl.spares, a) }

// release frees a dropped message's arena: kept for reuse, or deleted when
// its record is stale. Store.mu is held.
func (rl *rankLog) release(m *msg) {
	if m.stale {
		rl.arenas -= m.arena.Size()
		m.arena.Remove()
		return
	}
	rl.free(m.arena)
}

// arenaName is a's file name, arena-N, and N.
func arenaName(a Arena) (string, uint64, bool) {
	name := filepath.Base(a.FilePath())
	n, ok := parseArena(name)
	return name, n, ok
}

// record writes m's record next to its arena. s.mu is held.
func (s *Store) record(rank int, key Key, m *msg) error {
	name, n, ok := arenaName(m.arena)
	if !ok {
		return fmt.Errorf("arena file %s is not named arena-N", m.arena.FilePath())
	}
	return writeRecord(s.cfg.Dir, name, Record{Job: s.cfg.Job, Arena: n, Rank: rank, Key: key, Size: m.size, CRC: m.crc})
}

// drop removes m from the stored bytes and its record from the directory;
// its arena is freed now, or by the last checksum pass that reads it.
// s.mu is held.
func (s *Store) drop(rl *rankLog, m *msg) {
	m.dropped = true
	s.held.Add(-m.size)
	if name, _, ok := arenaName(m.arena); ok {
		if err := os.Remove(filepath.Join(s.cfg.Dir, name+recordExt)); err != nil && !os.IsNotExist(err) {
			m.stale = true
		}
	}
	if m.readers == 0 {
		rl.release(m)
	}
}

// Stored is where a message lies, for the rank to copy out.
type Stored struct {
	Arena     string // FilePath of its arena
	ArenaSize int64
	Size      int64
	CRC32C    uint32
}

// Read verifies rank's message key against its CRC-32C and says where it
// lies. A mismatch marks it bad (every later read fails at once, and an
// append of the key replaces it) and returns ErrCorrupt.
func (s *Store) Read(rank int, key Key) (Stored, error) {
	s.mu.Lock()
	rl := s.rank(rank)
	m := rl.msgs[key]
	if m == nil {
		steps := rl.steps(key.Stream)
		s.mu.Unlock()
		return Stored{}, fmt.Errorf("%w: rank %d holds no %s on this node (steps of the stream held: %s); "+
			"it was never appended, was truncated, or this is not the node that logged it (a node's loss loses its logs)",
			ErrNotFound, rank, key, stepList(steps))
	}
	if m.bad {
		s.mu.Unlock()
		return Stored{}, corruptErr(rank, key, m.crc, 0, false)
	}
	m.readers++
	s.mu.Unlock()

	got := crc32c.Checksum(m.arena.Bytes()[:m.size])

	s.mu.Lock()
	defer s.mu.Unlock()
	m.readers--
	if m.dropped {
		if m.readers == 0 {
			rl.release(m)
		}
		return Stored{}, fmt.Errorf("%w: rank %d's %s was truncated while it was read", ErrNotFound, rank, key)
	}
	if got != m.crc {
		if !m.bad {
			m.bad = true
			s.corrupt.Add(1)
		}
		return Stored{}, corruptErr(rank, key, m.crc, got, true)
	}
	return Stored{Arena: m.arena.FilePath(), ArenaSize: m.arena.Size(), Size: m.size, CRC32C: m.crc}, nil
}

func corruptErr(rank int, key Key, want, got uint32, now bool) error {
	what := "was found corrupt by an earlier read"
	if now {
		what = fmt.Sprintf("fails its CRC-32C (stored %#08x, read %#08x)", want, got)
	}
	return fmt.Errorf("%w: rank %d's %s %s: this node's memory is failing; the message cannot be replayed from this log "+
		"(append it again to replace it, or recover the stage from a snapshot)", ErrCorrupt, rank, key, what)
}

// Truncate drops every message of every stream of rank with step <= upTo
// and returns how many and their payload bytes; their arenas are kept for
// the rank's next appends (within its cap).
func (s *Store) Truncate(rank int, upTo int64) (n int, bytes int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rl := s.ranks[rank]
	if rl == nil {
		return 0, 0
	}
	for k, m := range rl.msgs {
		if k.Step <= upTo {
			delete(rl.msgs, k)
			s.drop(rl, m)
			n++
			bytes += m.size
		}
	}
	return n, bytes
}

// RankHeld is the payload bytes of rank's stored messages.
func (s *Store) RankHeld(rank int) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	if rl := s.ranks[rank]; rl != nil {
		for _, m := range rl.msgs {
			n += m.size
		}
	}
	return n
}

// Steps lists the steps of rank's stream that hold at least one message
// (a corrupt one included), ascending; never nil.
func (s *Store) Steps(rank int, stream string) []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	rl := s.ranks[rank]
	if rl == nil {
		return []int64{}
	}
	return rl.steps(stream)
}

func (rl *rankLog) steps(stream string) []int64 {
	out := []int64{}
	for k := range rl.msgs {
		if k.Stream == stream {
			out = append(out, k.Step)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return slices.Compact(out)
}

func stepList(steps []int64) string {
	if len(steps) == 0 {
		return "none"
	}
	if len(steps) > 8 {
		return fmt.Sprintf("%d..%d, %d steps", steps[0], steps[len(steps)-1], len(steps))
	}
	return fmt.Sprint(steps)
}

// Close unmaps every stored message, keeping its arena file and record
// for the job's next agent on the node (Adopt), and deletes the arenas
// kept for reuse; the store is empty after it. It must not run while
// another method does (the agent closes the store after its connections).
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for r, rl := range s.ranks {
		for k, m := range rl.msgs {
			delete(rl.msgs, k)
			m.dropped = true
			s.held.Add(-m.size)
			errs = append(errs, m.arena.Close())
		}
		for _, a := range rl.spares {
			errs = append(errs, a.Remove())
		}
		delete(s.ranks, r)
	}
	return errors.Join(errs...)
}
