package persist

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/hostmem"
	"github.com/reft-hpc/reft/tmpfs"
)

// testBuffers: sizes that are not multiples of the chunk, an empty buffer,
// and padding between buffers in the arena.
var testBuffers = []tmpfs.BufferSpec{{Name: "params", Size: 300_000, Replicated: true}, {Name: "adam", Size: 70_001}, {Name: "empty", Size: 0}, {Name: "step", Size: 8}}

const testChunk = 64 << 10

const testJob = "42"

// pattern fills p with bytes determined by rank, step and buffer name.
func pattern(p []byte, rank int, step int64, name string) {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s/%d", rank, name, step)
	x := h.Sum64() | 1
	var w [8]byte
	for i := range p {
		if i%8 == 0 {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			binary.LittleEndian.PutUint64(w[:], x)
		}
		p[i] = w[i%8]
	}
}

func stateFor(rank int, step int64) map[string][]byte {
	m := map[string][]byte{}
	for _, b := range testBuffers {
		m[b.Name] = make([]byte, b.Size)
		pattern(m[b.Name], rank, step, b.Name)
	}
	return m
}

// openLocal opens a node-local store under root, as the agent does.
func openLocal(root string) (*tmpfs.Store, error) {
	alloc, err := hostmem.NewAllocator(hostmem.Config{NoPin: true})
	if err != nil {
		return nil, err
	}
	return tmpfs.Open(tmpfs.Options{Root: root, JobID: testJob, Keep: 1, Spare: 1, ChunkSize: testChunk, Alloc: alloc})
}

func localStore(t testing.TB, root string) *tmpfs.Store {
	t.Helper()
	st, err := openLocal(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// newGen commits rank's state of step to the local store.
func newGen(st *tmpfs.Store, rank int, step int64) (tmpfs.Generation, error) {
	o, err := st.Begin(tmpfs.Key{Rank: rank, Shard: tmpfs.DefaultShard}, tmpfs.Spec{Step: step, Layout: "dp=4", Buffers: testBuffers})
	if err != nil {
		return tmpfs.Generation{}, err
	}
	if err := o.CopyIn(stateFor(rank, step)); err != nil {
		return tmpfs.Generation{}, err
	}
	return o.Commit()
}

func commitGen(t testing.TB, st *tmpfs.Store, rank int, step int64) tmpfs.Generation {
	t.Helper()
	g, err := newGen(st, rank, step)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// persistGen commits step locally and writes it to disk.
func persistGen(t testing.TB, st *tmpfs.Store, disk *Store, rank int, step, abandonedAbove int64) Written {
	t.Helper()
	r, err := st.Open(commitGen(t, st, rank, step))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w, err := disk.Write(t.Context(), r, abandonedAbove)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func openDisk(t testing.TB, dir string) *Store {
	t.Helper()
	s, err := OpenStore(dir, testJob, "n1", os.Getuid(), Epoch{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func steps(gens []Generation) []int64 {
	out := []int64{}
	for _, g := range gens {
		out = append(out, g.Step)
	}
	return out
}

// loadState reads g into fresh buffers.
func loadState(disk *Store, g Generation) (map[string][]byte, error) {
	got := map[string][]byte{}
	for _, b := range g.Manifest.Buffers {
		got[b.Name] = make([]byte, b.Size)
	}
	return got, disk.Load(g, func(name string) ([]byte, error) { return got[name], nil })
}

func checkState(t testing.TB, got map[string][]byte, rank int, step int64) {
	t.Helper()
	for name, want := range stateFor(rank, step) {
		if !bytes.Equal(got[name], want) {
			t.Fatalf("buffer %q does not hold rank %d step %d's bytes", name, rank, step)
		}
	}
}

func testLog(t testing.TB) zerolog.Logger { return zerolog.New(zerolog.NewTestWriter(t)) }

func genDir(dir string, rank int, step int64) string {
	return filepath.Join(dir, testJob, fmt.Sprintf("r%d", rank), fmt.Sprintf("g%d", step))
}
