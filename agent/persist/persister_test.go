package persist

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/logging/logtest"
	"github.com/reft-hpc/reft/tmpfs"
)

// syncBuf is a log sink the writer goroutine and the test share.
type syncBuf = logtest.Buffer

func newPersister(t *testing.T, st *tmpfs.Store, dir, policy string, logs *syncBuf) *Persister {
	t.Helper()
	p, err := New(Options{Dir: dir, Job: testJob, Node: "n1", UID: os.Getuid(), Policy: mustPolicy(t, policy),
		FailuresPerNodeDay: 0.016, Store: st, Log: zerolog.New(logs).Level(zerolog.DebugLevel)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// gate blocks the writer at a hook point until released.
type gate struct {
	at      string
	reached chan struct{}
	release chan struct{}
	once    sync.Once
}

func newGate(at string) *gate {
	return &gate{at: at, reached: make(chan struct{}), release: make(chan struct{})}
}

func (g *gate) hook(p string) {
	if p == g.at {
		g.once.Do(func() {
			close(g.reached)
			<-g.release
		})
	}
}

func TestPersisterBackground(t *testing.T) {
	st := localStore(t, filepath.Join(t.TempDir(), "shm"))
	dir := t.TempDir()
	logs := new(syncBuf)
	p := newPersister(t, st, dir, "2", logs)
	g := newGate("write:half")
	p.disk.hook = g.hook
	released := false
	defer func() {
		if !released {
			close(g.release) // let Close finish after a failure
		}
	}()

	for rank := range 2 {
		if err := st.Preallocate(tmpfs.Key{Rank: rank, Shard: tmpfs.DefaultShard}, tmpfs.Spec{Buffers: testBuffers}); err != nil {
			t.Fatal(err)
		}
		p.Registered(rank, 2)
	}
	prealloc := st.Metrics().StoredBytes.Load()
	p.Committed(commitGen(t, st, 0, 1), 0) // not due
	p.Committed(commitGen(t, st, 0, 2), 0) // due: the write starts and blocks
	<-g.reached
	// Training goes on: commits return while the write is blocked, and
	// saves find arenas (the spare) although step 2 stays pinned.
	p.Committed(commitGen(t, st, 1, 2), 0) // same step: queued behind rank 0
	p.Committed(commitGen(t, st, 0, 3), 0)
	p.Committed(commitGen(t, st, 0, 4), 0) // due, but step 2 is being written: skipped
	p.Committed(commitGen(t, st, 0, 5), 0)
	if n := st.Metrics().StoredBytes.Load(); n != prealloc {
		t.Fatalf("saves while a generation was pinned changed the store from %d to %d bytes; the spare arena should serve them", prealloc, n)
	}
	close(g.release)
	released = true
	p.Wait()
	for rank, want := range map[int][]int64{0: {2}, 1: {2}} {
		gens, err := p.Generations(rank)
		if err != nil || !slices.Equal(steps(gens), want) {
			t.Fatalf("rank %d persisted %v (%v), want %v", rank, steps(gens), err, want)
		}
	}
	if !strings.Contains(logs.String(), `"event":"persist_skipped","rank":0,"step":4,"writing_step":2`) {
		t.Fatalf("no debug line for the skipped step 4:\n%s", logs.String())
	}
	for _, s := range []int64{6, 8} {
		p.Committed(commitGen(t, st, 0, s-1), 0)
		p.Committed(commitGen(t, st, 0, s), 0)
		p.Wait()
	}
	gens, _ := p.Generations(0)
	if !slices.Equal(steps(gens), []int64{8, 6}) {
		t.Fatalf("rank 0 keeps %v, want the last two, 8 and 6", steps(gens))
	}
	if n := strings.Count(logs.String(), `"event":"persist_interval"`); n != 1 {
		t.Fatalf("%d interval lines, want 1:\n%s", n, logs.String())
	}
}

// Close stops a running write; its temporary copy goes, nothing is
// committed, and the local store may be closed after Close returns.
func TestPersisterCloseMidWrite(t *testing.T) {
	st := localStore(t, filepath.Join(t.TempDir(), "shm"))
	dir := t.TempDir()
	logs := new(syncBuf)
	p := newPersister(t, st, dir, "1", logs)
	g := newGate("write:half")
	p.disk.hook = g.hook
	p.Committed(commitGen(t, st, 0, 1), 0)
	<-g.reached
	done := make(chan struct{})
	go func() { p.Close(); close(done) }()
	// Close must wait for the writer, which is still blocked.
	select {
	case <-done:
		t.Fatal("Close returned while the write was still running")
	case <-time.After(50 * time.Millisecond):
	}
	close(g.release)
	<-done
	if gens, _ := p.disk.List(0); len(gens) != 0 {
		t.Fatalf("a stopped write committed %v", steps(gens))
	}
	if ents, _ := filepath.Glob(filepath.Join(dir, testJob, "r0", "*")); len(ents) != 0 {
		t.Fatalf("a stopped write left %v", ents)
	}
	if !strings.Contains(logs.String(), `"event":"persist_stopped"`) {
		t.Fatalf("no persist_stopped line:\n%s", logs.String())
	}
	p.Committed(commitGen(t, st, 0, 2), 0) // after Close: ignored
	p.Wait()
}

// Load puts a persisted generation into a fresh node-local store (a
// replacement node) as a committed generation with the same bytes.
func TestPersisterLoadIntoNewStore(t *testing.T) {
	dir := t.TempDir()
	old := localStore(t, filepath.Join(t.TempDir(), "shm"))
	p := newPersister(t, old, dir, "5", new(syncBuf))
	p.Committed(commitGen(t, old, 3, 5), 0)
	p.Wait()

	fresh := localStore(t, filepath.Join(t.TempDir(), "shm"))
	q := newPersister(t, fresh, dir, "5", new(syncBuf))
	gens, err := q.Generations(3)
	if err != nil || !slices.Equal(steps(gens), []int64{5}) {
		t.Fatalf("persisted %v, %v", steps(gens), err)
	}
	key := tmpfs.Key{Rank: 3, Shard: tmpfs.DefaultShard}
	if err := fresh.Preallocate(key, tmpfs.Spec{Buffers: testBuffers}); err != nil {
		t.Fatal(err)
	}
	lg, err := q.Load(gens[0], key, tmpfs.Spec{Layout: "dp=4", Buffers: testBuffers, ChunkSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	if lg.Step != 5 || lg.Manifest.ChunkSize != testChunk {
		t.Fatalf("loaded %+v", lg)
	}
	got := map[string][]byte{}
	for _, b := range testBuffers {
		got[b.Name] = make([]byte, b.Size)
	}
	if err := fresh.RestoreGeneration(lg, got); err != nil {
		t.Fatal(err)
	}
	checkState(t, got, 3, 5)
}
