package peer

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/tmpfs"
)

const storeChunk = 64 << 10

var storeBuffers = []tmpfs.BufferSpec{{Name: "params", Size: 5*storeChunk + 123}, {Name: "adam.m", Size: 70_001}, {Name: "empty", Size: 0}}

func openTestStore(t testing.TB, job string) *tmpfs.Store {
	t.Helper()
	s, err := tmpfs.Open(tmpfs.Options{Root: filepath.Join(t.TempDir(), "reft"), JobID: job, ChunkSize: storeChunk, Keep: 1,
		Log: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func stateFor(step int64) map[string][]byte {
	m := map[string][]byte{}
	for _, b := range storeBuffers {
		m[b.Name] = pattern(b.Size, b.Name+string(rune('0'+step)))
	}
	return m
}

func commit(t testing.TB, s *tmpfs.Store, k tmpfs.Key, step int64) tmpfs.Generation {
	t.Helper()
	o, err := s.Begin(k, tmpfs.Spec{Step: step, Buffers: storeBuffers})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.CopyIn(stateFor(step)); err != nil {
		t.Fatal(err)
	}
	g, err := o.Commit()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestStoreSource: a replacement node restores rank 3's state from the
// stores of two peers into its own store, through the transport: watermarks
// to pick the generation, the manifest for layout and checksums, fetches
// straight into the new generation's arena, then a commit whose restore
// verifies every chunk. A corrupt arena on the first peer costs only a
// failover.
func TestStoreSource(t *testing.T) {
	k := tmpfs.Key{Rank: 3, Shard: "state"}
	a, b := openTestStore(t, "500"), openTestStore(t, "500")
	commit(t, a, k, 1)
	ga := commit(t, a, k, 2)
	commit(t, b, k, 2)
	// Damage a chunk of the peer's arena behind the store's back.
	f, err := os.OpenFile(ga.ArenaPath, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("rot"), ga.Manifest.Buffers[0].Offset+2*storeChunk+5)
	f.Close()

	sa := startServer(t, baseConfig(t, "a"), StoreSource{a})
	sb := startServer(t, baseConfig(t, "b"), StoreSource{b})
	cl := newClient(t, baseConfig(t, "new"))
	ctx := testCtx(t, 20*time.Second)

	wm, err := cl.Watermarks(ctx, sa.Addr().String(), []int{3})
	if err != nil {
		t.Fatal(err)
	}
	if len(wm.Generations) != 2 || wm.Generations[0].Step != 2 {
		t.Fatalf("watermarks %+v, want steps 2 and 1, newest first", wm.Generations)
	}
	newest := wm.Generations[0]
	keyA := GenKey{Rank: 3, Shard: "state", Step: newest.Step, Seq: newest.Seq}
	info, err := cl.Manifest(ctx, sa.Addr().String(), keyA)
	if err != nil {
		t.Fatal(err)
	}
	wmb, err := cl.Watermarks(ctx, sb.Addr().String(), []int{3})
	if err != nil {
		t.Fatal(err)
	}
	keyB := GenKey{Rank: 3, Shard: "state", Step: wmb.Generations[0].Step, Seq: wmb.Generations[0].Seq}

	mine := openTestStore(t, "500")
	o, err := mine.Begin(k, tmpfs.Spec{Step: 2, Buffers: storeBuffers})
	if err != nil {
		t.Fatal(err)
	}
	var failovers int
	for _, bi := range info.Buffers {
		dst, err := o.Buffer(bi.Name)
		if err != nil {
			t.Fatal(err)
		}
		st, err := cl.Fetch(ctx, FetchSpec{ChunkSize: info.ChunkSize, Size: bi.Size, Dst: dst, CRC: bi.CRC32C,
			Sources: []Source{{sa.Addr().String(), ChunkKey{keyA, bi.Name}}, {sb.Addr().String(), ChunkKey{keyB, bi.Name}}}})
		if err != nil {
			t.Fatal(err)
		}
		failovers += st.Failovers
		if err := o.SetChecksums(bi.Name, bi.CRC32C); err != nil {
			t.Fatal(err)
		}
	}
	if failovers != 1 {
		t.Fatalf("%d failovers, want 1 (the rotten chunk)", failovers)
	}
	g, err := o.Commit()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]byte{}
	for _, bs := range storeBuffers {
		got[bs.Name] = make([]byte, bs.Size)
	}
	if err := mine.RestoreGeneration(g, got); err != nil {
		t.Fatal(err)
	}
	for name, want := range stateFor(2) {
		if !bytes.Equal(got[name], want) {
			t.Fatalf("buffer %s differs", name)
		}
	}

	// Once peer a's own restore finds the rot, the generation is marked
	// bad: a serves it no more and says why.
	if err := a.RestoreGeneration(ga, map[string][]byte{"params": make([]byte, storeBuffers[0].Size),
		"adam.m": make([]byte, storeBuffers[1].Size), "empty": {}}); !errors.Is(err, tmpfs.ErrCorrupt) {
		t.Fatalf("restore on a: %v", err)
	}
	_, err = cl.Fetch(ctx, FetchSpec{ChunkSize: storeChunk, Size: storeBuffers[1].Size, Dst: make([]byte, storeBuffers[1].Size),
		Sources: []Source{{sa.Addr().String(), ChunkKey{keyA, "adam.m"}}}})
	var fe *FetchError
	if !errors.As(err, &fe) || !IsCode(fe.Failed[0].Attempts[0].Err, CodeCorrupt) {
		t.Fatalf("fetch of a bad generation: %v", err)
	}
	if wm, _ := cl.Watermarks(ctx, sa.Addr().String(), nil); len(wm.Generations) != 1 {
		t.Fatalf("watermarks still list the bad generation: %+v", wm.Generations)
	}
	if _, err := (StoreSource{a}).Open(GenKey{Rank: 3, Shard: "state", Step: 9}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("open of a missing generation: %v", err)
	}
}
