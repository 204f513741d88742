package tmpfs

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/hostmem"
)

// testBuffers is a small model state: sizes that are not multiples of the
// chunk size, and an empty buffer, so chunk edges get exercised.
var testBuffers = []BufferSpec{{Name: "params", Size: 300_000, Replicated: true}, {Name: "adam.m", Size: 70_001}, {Name: "empty", Size: 0}, {Name: "step", Size: 8}}

const testChunk = 64 << 10

// pattern fills p with bytes determined by step and buffer name, so any
// process can check what any step should contain.
func pattern(p []byte, step int64, name string) {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d", name, step)
	x := h.Sum64() | 1
	for i := 0; i+8 <= len(p); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(p[i:], x)
	}
	for i := len(p) &^ 7; i < len(p); i++ {
		p[i] = byte(x >> (8 * (i & 7)))
	}
}

func stateFor(step int64, specs []BufferSpec) map[string][]byte {
	m := map[string][]byte{}
	for _, b := range specs {
		m[b.Name] = make([]byte, b.Size)
		pattern(m[b.Name], step, b.Name)
	}
	return m
}

func emptyState(specs []BufferSpec) map[string][]byte {
	m := map[string][]byte{}
	for _, b := range specs {
		m[b.Name] = make([]byte, b.Size)
	}
	return m
}

// checkState fails unless got holds exactly step's pattern.
func checkState(t *testing.T, got map[string][]byte, step int64, specs []BufferSpec) {
	t.Helper()
	want := stateFor(step, specs)
	for name, w := range want {
		if !bytes.Equal(got[name], w) {
			t.Fatalf("buffer %q does not hold step %d's bytes", name, step)
		}
	}
}

func openStore(t *testing.T, root string, mod func(*Options)) *Store {
	t.Helper()
	opt := Options{Root: root, JobID: "4242", ChunkSize: testChunk, Log: zerolog.New(zerolog.NewTestWriter(t))}
	if mod != nil {
		mod(&opt)
	}
	s, err := Open(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// save writes and commits step's pattern for k.
func save(t *testing.T, s *Store, k Key, step int64, specs []BufferSpec) Generation {
	t.Helper()
	o, err := s.Begin(k, Spec{Step: step, Layout: "dp=2", Buffers: specs})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.CopyIn(stateFor(step, specs)); err != nil {
		t.Fatal(err)
	}
	g, err := o.Commit()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func steps(gs []Generation) []int64 {
	var out []int64
	for _, g := range gs {
		out = append(out, g.Step)
	}
	return out
}

// mountTmpfs mounts a private tmpfs of the given size (tests run as root)
// and unmounts it at cleanup.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Fatalf("mount a %s tmpfs on %s (tests need root): %v", size, dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return filepath.Join(dir, "reft")
}

func newBudgetAlloc(t *testing.T, capBytes int64, log zerolog.Logger) *hostmem.Allocator {
	t.Helper()
	b, err := hostmem.NewBudget(hostmem.BudgetConfig{Cap: hostmem.Cap{Bytes: capBytes}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := hostmem.NewAllocator(hostmem.Config{Budget: b, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	return a
}
