package msglog

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/reft-hpc/reft/internal/crc32c"
)

// memArena is an Arena in this process's memory, page-rounded like
// hostmem's.
type memArena struct {
	path    string
	b       []byte
	removed *int
	closed  *int
}

func (a *memArena) Bytes() []byte    { return a.b }
func (a *memArena) Size() int64      { return int64(len(a.b)) }
func (a *memArena) FilePath() string { return a.path }
func (a *memArena) Remove() error    { *a.removed++; a.b = nil; return nil }
func (a *memArena) Close() error     { *a.closed++; a.b = nil; return nil }

// fixture is a store over memArenas with a settable cap and counts of
// allocations and removals.
type fixture struct {
	s       *Store
	cap     int64
	allocs  int
	removed int
	closed  int
	failNew bool // the allocator refuses new arenas (a full budget)
}

func newFixture(t *testing.T, capBytes int64) *fixture {
	f := &fixture{cap: capBytes}
	f.s = New(Config{Dir: t.TempDir(), Job: "1", UID: -1,
		Alloc: func(path string, size int64) (Arena, error) {
			if f.failNew {
				return nil, errors.New("budget full")
			}
			f.allocs++
			return &memArena{path: path, b: make([]byte, (size+4095)/4096*4096), removed: &f.removed, closed: &f.closed}, nil
		},
		Cap: func() (int64, string) { return f.cap, "the test's cap" }})
	return f
}

// append is what the agent and the client do for one append: begin,
// copy, commit.
func (f *fixture) append(rank int, k Key, data []byte) (held bool, err error) {
	p, err := f.s.Begin(rank, k, int64(len(data)))
	if err != nil {
		return false, err
	}
	return p.Commit(crc32c.Copy(0, p.Arena().Bytes()[:len(data)], data))
}

func (f *fixture) read(rank int, k Key) ([]byte, error) {
	st, err := f.s.Read(rank, k)
	if err != nil {
		return nil, err
	}
	f.s.mu.Lock()
	a := f.s.ranks[rank].msgs[k].arena
	f.s.mu.Unlock()
	if a.FilePath() != st.Arena || a.Size() != st.ArenaSize {
		return nil, fmt.Errorf("Read names arena %s of %d bytes, the message is in %s of %d", st.Arena, st.ArenaSize, a.FilePath(), a.Size())
	}
	return slices.Clone(a.Bytes()[:st.Size]), nil
}

func msgBytes(n, seed int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + seed*13 + i>>8)
	}
	return b
}

func key(stream string, step int64, seq int) Key { return Key{Stream: stream, Step: step, Seq: seq} }

// op is one step of a scenario: an append (data set), a read (read set),
// a truncation (truncate set), a steps query (steps set) or a corruption
// of a stored message's arena (corrupt set).
type op struct {
	rank     int
	k        Key
	data     []byte
	read     []byte // the bytes a read must return (nil: it must fail)
	truncate *int64
	steps    []int64
	corrupt  bool
	failNew  bool // the allocator refuses new arenas from this op on

	wantErr  error // errors.Is; nil: success
	wantHeld bool  // an append found the same bytes held
	wantIn   string
}

func upTo(n int64) *int64 { return &n }

func TestStore(t *testing.T) {
	a1, a2, a3, big := msgBytes(10000, 1), msgBytes(10000, 2), msgBytes(20000, 3), msgBytes(200000, 4)
	cases := []struct {
		name string
		cap  int64
		ops  []op
		// after the ops: held payload bytes and allocations made
		held, allocs int64
	}{
		{name: "append then read", cap: 1 << 20, ops: []op{
			{k: key("act>1", 1, 0), data: a1},
			{k: key("act>1", 1, 0), read: a1},
		}, held: 10000, allocs: 1},
		{name: "same bytes again is a no-op", cap: 1 << 20, ops: []op{
			{k: key("act>1", 1, 0), data: a1},
			{k: key("act>1", 1, 0), data: a1, wantHeld: true},
			{k: key("act>1", 1, 0), read: a1},
			// the copy's arena was kept for reuse
			{k: key("act>1", 2, 0), data: a1},
		}, held: 20000, allocs: 2},
		{name: "other bytes again conflict", cap: 1 << 20, ops: []op{
			{k: key("act>1", 1, 0), data: a1},
			{k: key("act>1", 1, 0), data: a2, wantErr: ErrConflict, wantIn: `stream "act>1" step 1 seq 0`},
			{k: key("act>1", 1, 0), data: a3, wantErr: ErrConflict, wantIn: "logged as 10000 bytes, this append has 20000"},
			{k: key("act>1", 1, 0), read: a1},
		}, held: 10000, allocs: 2},
		{name: "seq and stream are part of the key", cap: 1 << 20, ops: []op{
			{k: key("act>1", 1, 0), data: a1},
			{k: key("act>1", 1, 1), data: a2},
			{k: key("grad>0", 1, 0), data: a3},
			{k: key("act>1", 1, 1), read: a2},
			{k: key("grad>0", 1, 0), read: a3},
			{k: key("act>1", 0, 0), wantErr: ErrNotFound, wantIn: "steps of the stream held: [1]"},
		}, held: 40000, allocs: 3},
		{name: "truncate drops every stream up to a step", cap: 1 << 20, ops: []op{
			{k: key("act>1", 1, 0), data: a1},
			{k: key("grad>0", 2, 0), data: a1},
			{k: key("act>1", 3, 0), data: a2},
			{k: key("act>1", 5, 0), data: a2},
			{k: key("act>1", 0, 0), steps: []int64{1, 3, 5}},
			{truncate: upTo(3)},
			{k: key("act>1", 0, 0), steps: []int64{5}},
			{k: key("grad>0", 0, 0), steps: []int64{}},
			{k: key("act>1", 3, 0), wantErr: ErrNotFound, wantIn: "was truncated"},
			{k: key("act>1", 5, 0), read: a2},
		}, held: 10000, allocs: 4},
		{name: "steps ascending without repeats", cap: 1 << 20, ops: []op{
			{k: key("act>1", 9, 0), data: a1},
			{k: key("act>1", 2, 1), data: a1},
			{k: key("act>1", 2, 0), data: a1},
			{k: key("act>2", 4, 0), data: a1},
			{k: key("act>1", 0, 0), steps: []int64{2, 9}},
			{k: key("none", 0, 0), steps: []int64{}},
		}, held: 40000, allocs: 4},
		{name: "ranks are apart", cap: 1 << 20, ops: []op{
			{rank: 0, k: key("act>1", 1, 0), data: a1},
			{rank: 1, k: key("act>1", 1, 0), data: a2},
			{rank: 2, k: key("act>1", 1, 0), wantErr: ErrNotFound, wantIn: "rank 2 holds no"},
			{rank: 1, truncate: upTo(10)},
			{rank: 0, k: key("act>1", 1, 0), read: a1},
			{rank: 1, k: key("act>1", 0, 0), steps: []int64{}},
		}, held: 10000, allocs: 2},
		{name: "over the cap fails and drops nothing", cap: 3 * 12288, ops: []op{
			{k: key("act>1", 1, 0), data: a1},
			{k: key("act>1", 2, 0), data: a1},
			{k: key("act>1", 3, 0), data: a1},
			{k: key("act>1", 4, 0), data: a1, wantErr: ErrOverCap, wantIn: "cap of 36864 bytes (the test's cap)"},
			{k: key("act>1", 4, 0), data: a1, wantErr: ErrOverCap, wantIn: "snapshot more often"},
			{k: key("act>1", 1, 0), read: a1},
			{k: key("act>1", 3, 0), read: a1},
			{truncate: upTo(1)},
			// the truncated message's arena is reused: no allocation
			{k: key("act>1", 4, 0), data: a2},
			{k: key("act>1", 4, 0), read: a2},
		}, held: 30000, allocs: 3},
		{name: "a spare of the wrong size is given back for the cap", cap: 200704 + 2*12288, ops: []op{
			{k: key("act>1", 1, 0), data: big}, // 200704 bytes of arena
			{k: key("act>1", 2, 0), data: a1},
			{truncate: upTo(1)},
			// too large to reuse for 10000 bytes; with it, 12288 more still fit the cap
			{k: key("act>1", 3, 0), data: a1},
			// one more does not: the spare (too large to reuse) goes
			{k: key("act>1", 4, 0), data: a1},
			{k: key("act>1", 4, 0), read: a1},
		}, held: 30000, allocs: 4},
		{name: "a corrupt arena fails every read until appended again", cap: 1 << 20, ops: []op{
			{k: key("act>1", 1, 0), data: a1},
			{k: key("act>1", 1, 0), corrupt: true},
			{k: key("act>1", 1, 0), wantErr: ErrCorrupt, wantIn: `rank 0's stream "act>1" step 1 seq 0 fails its CRC-32C`},
			{k: key("act>1", 1, 0), wantErr: ErrCorrupt, wantIn: "found corrupt by an earlier read"},
			{k: key("act>1", 0, 0), steps: []int64{1}},
			{k: key("act>1", 1, 0), data: a1},
			{k: key("act>1", 1, 0), read: a1},
		}, held: 10000, allocs: 2},
		{name: "a full budget takes back the spares", cap: 1 << 20, ops: []op{
			{k: key("act>1", 1, 0), data: a3},
			{truncate: upTo(1)},
			{k: key("act>1", 2, 0), data: a1, failNew: true, wantErr: nil},
		}, held: 10000, allocs: 1},
		{name: "a full budget without spares fails the append", cap: 1 << 20, ops: []op{
			{k: key("act>1", 1, 0), data: a1, failNew: true, wantIn: "budget full"},
			{k: key("act>1", 0, 0), steps: []int64{}},
		}, held: 0, allocs: 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.cap)
			for i, o := range tc.ops {
				f.failNew = f.failNew || o.failNew
				var err error
				what := ""
				switch {
				case o.truncate != nil:
					f.s.Truncate(o.rank, *o.truncate)
					continue
				case o.steps != nil:
					if got := f.s.Steps(o.rank, o.k.Stream); !slices.Equal(got, o.steps) {
						t.Fatalf("op %d: steps of %q = %v, want %v", i, o.k.Stream, got, o.steps)
					}
					continue
				case o.corrupt:
					f.s.ranks[o.rank].msgs[o.k].arena.Bytes()[17] ^= 0x40
					continue
				case o.data != nil:
					what = "append"
					var held bool
					held, err = f.append(o.rank, o.k, o.data)
					if err == nil && held != o.wantHeld {
						t.Fatalf("op %d: append held = %v, want %v", i, held, o.wantHeld)
					}
				default:
					what = "read"
					var got []byte
					got, err = f.read(o.rank, o.k)
					if err == nil && !slices.Equal(got, o.read) {
						t.Fatalf("op %d: read %s returned other bytes", i, o.k)
					}
				}
				wantFail := o.wantErr != nil || o.wantIn != "" || (what == "read" && o.read == nil)
				switch {
				case !wantFail && err != nil:
					t.Fatalf("op %d: %s %s: %v", i, what, o.k, err)
				case wantFail && err == nil:
					t.Fatalf("op %d: %s %s succeeded, want an error (%v %q)", i, what, o.k, o.wantErr, o.wantIn)
				case o.wantErr != nil && !errors.Is(err, o.wantErr):
					t.Fatalf("op %d: %s: error %v, want %v", i, what, err, o.wantErr)
				case !strings.Contains(fmt.Sprint(err), o.wantIn):
					t.Fatalf("op %d: %s: error %q does not say %q", i, what, err, o.wantIn)
				}
			}
			if got := f.s.Counts().Held; got != tc.held {
				t.Errorf("held %d bytes, want %d", got, tc.held)
			}
			if int64(f.allocs) != tc.allocs {
				t.Errorf("%d arenas allocated, want %d", f.allocs, tc.allocs)
			}
			stored := 0
			for _, rl := range f.s.ranks {
				stored += len(rl.msgs)
			}
			if err := f.s.Close(); err != nil {
				t.Fatal(err)
			}
			// The stored messages stay for the next agent, records and all;
			// every other arena is deleted.
			if f.closed != stored || f.removed+f.closed != f.allocs {
				t.Errorf("Close kept %d and removed %d of %d arenas, want %d kept (the stored messages)", f.closed, f.removed, f.allocs, stored)
			}
			if recs, _ := filepath.Glob(filepath.Join(f.s.cfg.Dir, "arena-*.rec")); len(recs) != stored {
				t.Errorf("%d records left after Close, want %d (one per stored message)", len(recs), stored)
			}
			if f.s.Counts().Held != 0 {
				t.Errorf("held %d bytes after Close", f.s.Counts().Held)
			}
		})
	}
}

// TestCommitChecksBytes: bytes copied that are not the ones the client
// checksummed (its buffer changed meanwhile) are refused, nothing stored.
func TestCommitChecksBytes(t *testing.T) {
	f := newFixture(t, 1<<20)
	data := msgBytes(5000, 4)
	k := key("act>3", 7, 2)
	p, err := f.s.Begin(0, k, int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	crc := crc32c.Copy(0, p.Arena().Bytes()[:len(data)], data)
	p.Arena().Bytes()[4999] ^= 1
	_, err = p.Commit(crc)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), `stream "act>3" step 7 seq 2`) || !strings.Contains(err.Error(), "append it again") {
		t.Fatalf("commit of changed bytes: %v", err)
	}
	if f.s.Counts().Held != 0 || f.s.Counts().Appended != 0 || len(f.s.Steps(0, "act>3")) != 0 {
		t.Fatalf("a refused commit left %d bytes held, %d appended", f.s.Counts().Held, f.s.Counts().Appended)
	}
	if _, err := p.Commit(crc); err == nil {
		t.Fatal("a second commit of one append succeeded")
	}
	// The refused arena is reused by the next append.
	if _, err := f.append(0, k, data); err != nil {
		t.Fatal(err)
	}
	if f.allocs != 1 || f.s.Counts().Appended != 5000 {
		t.Fatalf("%d allocations, %d bytes appended; want 1 and 5000", f.allocs, f.s.Counts().Appended)
	}
}

// TestAbortKeepsArena: an aborted append's arena is kept within the cap
// for the next append.
func TestAbortKeepsArena(t *testing.T) {
	f := newFixture(t, 1<<20)
	data := msgBytes(8192, 5)
	p, err := f.s.Begin(3, key("a", 1, 0), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	p.Abort()
	p.Abort()
	if got := f.s.RankBytes(3); got != 8192 {
		t.Fatalf("rank 3 holds %d arena bytes after the abort, want the 8192 kept for reuse", got)
	}
	if _, err := f.append(3, key("a", 1, 0), data); err != nil {
		t.Fatal(err)
	}
	if f.allocs != 1 || f.s.RankHeld(3) != 8192 {
		t.Fatalf("%d allocations and %d bytes held, want 1 and 8192", f.allocs, f.s.RankHeld(3))
	}
}

func TestBeginChecksKey(t *testing.T) {
	f := newFixture(t, 1<<20)
	for _, tc := range []struct {
		k    Key
		size int64
		want string
	}{
		{key("", 1, 0), 1, "empty"},
		{key("a b", 1, 0), 1, "printable ASCII without spaces"},
		{key("a\n", 1, 0), 1, "printable ASCII"},
		{key(strings.Repeat("s", 65), 1, 0), 1, "longer than 64"},
		{key("a", -1, 0), 1, "step = -1"},
		{key("a", 1, -2), 1, "seq = -2"},
		{key("a", 1, 0), 0, "size 0 must be positive"},
	} {
		if _, err := f.s.Begin(0, tc.k, tc.size); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Begin(%+v, %d): %v, want an error saying %q", tc.k, tc.size, err, tc.want)
		}
	}
}

// TestConcurrent: ranks append, read, list and truncate side by side, and
// one rank's reads race its own truncations (from another connection);
// run under -race (make unit). A read either returns the bytes appended
// or says the message is gone; the byte counts add up at the end.
func TestConcurrent(t *testing.T) {
	f := newFixture(t, 1<<30)
	// memArena's Remove is not safe for concurrent use: count under a lock.
	var mu sync.Mutex
	removed := 0
	f.s.cfg.Alloc = func(path string, size int64) (Arena, error) {
		return &lockedArena{memArena{path: path, b: make([]byte, (size+4095)/4096*4096), removed: new(int)}, &mu, &removed}, nil
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for rank := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for step := int64(1); step <= 40; step++ {
				data := msgBytes(5000+rank, int(step))
				if _, err := f.append(rank, key("act>1", step, 0), data); err != nil {
					errs <- err
					return
				}
				st, err := f.s.Read(rank, key("act>1", step, 0))
				if err != nil && !errors.Is(err, ErrNotFound) {
					errs <- err
					return
				}
				if err == nil && (st.Size != int64(len(data)) || st.CRC32C != crc32c.Checksum(data)) {
					errs <- fmt.Errorf("rank %d step %d: read %d bytes with %#x", rank, step, st.Size, st.CRC32C)
					return
				}
				f.s.Steps(rank, "act>1")
				if step%5 == 0 {
					f.s.Truncate(rank, step-3)
				}
			}
		}()
	}
	wg.Add(1)
	go func() { // rank 0 truncated from elsewhere while it reads
		defer wg.Done()
		for i := int64(0); i < 40; i++ {
			f.s.Truncate(0, i)
			_ = f.s.Counts().Held
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	var sum int64
	for rank := range 4 {
		sum += f.s.RankHeld(rank)
	}
	if f.s.Counts().Held != sum {
		t.Fatalf("held %d bytes, the ranks %d", f.s.Counts().Held, sum)
	}
}

type lockedArena struct {
	memArena
	mu      *sync.Mutex
	removed *int
}

func (a *lockedArena) Remove() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	*a.removed++
	return nil
}
