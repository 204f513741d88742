package tmpfs

import (
	"errors"
	"fmt"
	"github.com/reft-hpc/reft/internal/crc32c"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/hostmem"
)

func TestSaveAndRestore(t *testing.T) {
	s := openStore(t, filepath.Join(t.TempDir(), "reft"), nil)
	k := Key{Rank: 3, Shard: DefaultShard}
	if _, err := s.Restore(k, emptyState(testBuffers)); !errors.Is(err, ErrNoGeneration) {
		t.Fatalf("restore of an empty store: %v, want ErrNoGeneration", err)
	}
	g := save(t, s, k, 7, testBuffers)
	if g.Step != 7 || g.Manifest.Rank != 3 || g.Manifest.Layout != "dp=2" || len(g.Manifest.Buffers) != len(testBuffers) {
		t.Fatalf("generation %+v", g)
	}
	for _, b := range g.Manifest.Buffers {
		if b.Offset%4096 != 0 || len(b.CRC32C) != chunks(b.Size, testChunk) {
			t.Fatalf("buffer %q: offset %d, %d checksums", b.Name, b.Offset, len(b.CRC32C))
		}
	}
	got := emptyState(testBuffers)
	rg, err := s.Restore(k, got)
	if err != nil || rg.Step != 7 {
		t.Fatalf("restore: step %d, %v", rg.Step, err)
	}
	checkState(t, got, 7, testBuffers)
	if keys := s.Keys(); !slices.Equal(keys, []Key{k}) {
		t.Fatalf("keys %v", keys)
	}
}

func TestRestoreNeedsTheSavedBuffers(t *testing.T) {
	s := openStore(t, filepath.Join(t.TempDir(), "reft"), nil)
	k := Key{Shard: DefaultShard}
	save(t, s, k, 1, testBuffers)
	tests := map[string]func(map[string][]byte){
		"missing buffer": func(m map[string][]byte) { delete(m, "params") },
		"wrong size":     func(m map[string][]byte) { m["params"] = m["params"][:10] },
		"extra buffer":   func(m map[string][]byte) { m["other"] = nil },
	}
	for name, mod := range tests {
		dst := emptyState(testBuffers)
		mod(dst)
		if _, err := s.Restore(k, dst); err == nil || !strings.Contains(err.Error(), "buffer") {
			t.Errorf("%s: restore = %v, want an error naming the buffer", name, err)
		}
	}
}

func TestRetention(t *testing.T) {
	tests := []struct {
		name  string
		keep  int
		steps []int64 // saved in this order
		want  []int64 // kept, newest first
	}{
		{"keep 0", 0, []int64{1, 2, 3}, []int64{3}},
		{"keep 1", 1, []int64{1, 2, 3}, []int64{3, 2}},
		{"keep 2", 2, []int64{1, 2, 3, 4}, []int64{4, 3, 2}},
		// After restoring step 2 the job trains on: step 3 again supersedes
		// the old 3 and 4 from the abandoned timeline (1 was already gone).
		{"resave supersedes", 2, []int64{1, 2, 3, 4, 3}, []int64{3, 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "reft")
			s := openStore(t, root, func(o *Options) { o.Keep = tc.keep })
			k := Key{Rank: 0, Shard: DefaultShard}
			for _, st := range tc.steps {
				save(t, s, k, st, testBuffers)
			}
			if got := steps(s.Generations(k)); !slices.Equal(got, tc.want) {
				t.Fatalf("kept %v, want %v", got, tc.want)
			}
			// Disk agrees: one directory per kept generation, and no more
			// arenas than the rank's working set (Keep+2: the next saves
			// reuse them rather than allocate).
			ents, _ := os.ReadDir(filepath.Join(s.Dir(), k.rel()))
			var gens, arenas int
			for _, e := range ents {
				if strings.HasPrefix(e.Name(), "g") {
					gens++
				} else if strings.HasPrefix(e.Name(), "arena-") {
					arenas++
				}
			}
			if gens != len(tc.want) || arenas > tc.keep+2 {
				t.Fatalf("on disk: %d generations, %d arenas; want %d and at most %d", gens, arenas, len(tc.want), tc.keep+2)
			}
			s.Close()
			s2 := openStore(t, root, func(o *Options) { o.Keep = tc.keep })
			if got := steps(s2.Generations(k)); !slices.Equal(got, tc.want) {
				t.Fatalf("after re-index: %v, want %v", got, tc.want)
			}
			got := emptyState(testBuffers)
			if _, err := s2.Restore(k, got); err != nil {
				t.Fatal(err)
			}
			checkState(t, got, tc.want[0], testBuffers)
		})
	}
}

func TestArenasAreReused(t *testing.T) {
	s := openStore(t, filepath.Join(t.TempDir(), "reft"), nil)
	k := Key{Shard: DefaultShard}
	paths := map[string]bool{}
	for st := int64(1); st <= 6; st++ {
		paths[save(t, s, k, st, testBuffers).ArenaPath] = true
	}
	if len(paths) != 2 {
		t.Fatalf("6 saves used %d arena files, want 2 (completed + ongoing, alternating)", len(paths))
	}
}

func TestOngoingDiscardedByNextSave(t *testing.T) {
	root := filepath.Join(t.TempDir(), "reft")
	s := openStore(t, root, nil)
	k := Key{Shard: DefaultShard}
	save(t, s, k, 1, testBuffers)
	o, err := s.Begin(k, Spec{Step: 2, Buffers: testBuffers})
	if err != nil {
		t.Fatal(err)
	}
	save(t, s, k, 3, testBuffers) // step 2's writer died; the next save goes on
	if _, err := o.Commit(); err == nil {
		t.Fatal("a superseded generation committed")
	}
	if got := steps(s.Generations(k)); !slices.Equal(got, []int64{3}) {
		t.Fatalf("generations %v", got)
	}
	if s.Metrics().Aborted.Load() != 1 {
		t.Fatalf("aborted %d", s.Metrics().Aborted.Load())
	}
}

func TestRankWritesThroughItsOwnMapping(t *testing.T) {
	s := openStore(t, filepath.Join(t.TempDir(), "reft"), nil)
	k := Key{Rank: 1, Shard: "arc-r0"}
	o, err := s.Begin(k, Spec{Step: 5, Buffers: testBuffers})
	if err != nil {
		t.Fatal(err)
	}
	rank, err := hostmem.MapShared(o.ArenaPath(), hostmem.MapOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer rank.Close()
	state := stateFor(5, testBuffers)
	m := o.Manifest()
	for i, b := range m.Buffers {
		crcs := make([]uint32, len(b.CRC32C))
		CopyChunks(rank.Bytes()[b.Offset:b.Offset+b.Size], state[b.Name], m.ChunkSize, crcs, 2)
		if i%2 == 0 {
			err = o.SetChecksums(b.Name, crcs)
		} else {
			err = o.ComputeChecksums(b.Name) // a writer that cannot checksum
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := o.Commit(); err != nil {
		t.Fatal(err)
	}
	got := emptyState(testBuffers)
	if _, err := s.Restore(k, got); err != nil {
		t.Fatal(err)
	}
	checkState(t, got, 5, testBuffers)
}

func TestReaderPinsArena(t *testing.T) {
	s := openStore(t, filepath.Join(t.TempDir(), "reft"), nil)
	k := Key{Shard: DefaultShard}
	g1 := save(t, s, k, 1, testBuffers)
	r, err := s.Open(g1)
	if err != nil {
		t.Fatal(err)
	}
	save(t, s, k, 2, testBuffers)
	save(t, s, k, 3, testBuffers) // would reuse step 1's arena without the pin
	chunk, crc, err := r.Chunk("params", 1)
	if err != nil {
		t.Fatal(err)
	}
	if crc32c.Checksum(chunk) != crc {
		t.Fatal("a pinned arena was overwritten by a later generation")
	}
	r.Close()
	if _, err := s.Open(g1); !errors.Is(err, ErrNoGeneration) {
		t.Fatalf("released generation opened: %v", err)
	}
}

func TestLayoutOwnershipAndModes(t *testing.T) {
	root := filepath.Join(t.TempDir(), "reft")
	nobody := hostmem.Owner{UID: 65534, GID: 65534}
	s := openStore(t, root, func(o *Options) { o.Owner = &nobody })
	save(t, s, Key{Rank: 0, Shard: DefaultShard}, 1, testBuffers)
	if want := filepath.Join(root, "65534", "4242"); s.Dir() != want {
		t.Fatalf("job dir %s, want %s", s.Dir(), want)
	}
	var st unix.Stat_t
	if err := unix.Stat(root, &st); err != nil || st.Mode&0o7777 != 0o1777 {
		t.Fatalf("root mode %o, want 1777 (agents of every user add their uid directory)", st.Mode&0o7777)
	}
	n := 0
	err := filepath.Walk(filepath.Join(root, "65534"), func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		unix.Lstat(p, &st)
		want := uint32(0o600)
		if fi.IsDir() {
			want = 0o700
		}
		if st.Uid != 65534 || st.Gid != 65534 || st.Mode&0o7777 != want {
			t.Errorf("%s: %d:%d mode %o, want 65534:65534 %o", p, st.Uid, st.Gid, st.Mode&0o7777, want)
		}
		n++
		return nil
	})
	if err != nil || n < 9 {
		t.Fatalf("walked %d entries: %v", n, err)
	}
}

func TestRefusesForeignDirectories(t *testing.T) {
	tests := []struct {
		name string
		prep func(t *testing.T, root string)
	}{
		{"uid dir owned by someone else", func(t *testing.T, root string) {
			os.MkdirAll(filepath.Join(root, "65534"), 0o700) // root-owned
		}},
		{"job dir readable by others", func(t *testing.T, root string) {
			os.MkdirAll(filepath.Join(root, "65534", "4242"), 0o755)
			os.Chown(filepath.Join(root, "65534"), 65534, 65534)
			os.Chmod(filepath.Join(root, "65534"), 0o700)
			os.Chown(filepath.Join(root, "65534", "4242"), 65534, 65534)
		}},
		{"job dir is a symlink", func(t *testing.T, root string) {
			os.MkdirAll(filepath.Join(root, "65534"), 0o700)
			os.Chown(filepath.Join(root, "65534"), 65534, 65534)
			os.Symlink(t.TempDir(), filepath.Join(root, "65534", "4242"))
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "reft")
			tc.prep(t, root)
			_, err := Open(Options{Root: root, JobID: "4242", Owner: &hostmem.Owner{UID: 65534, GID: 65534}})
			if err == nil || !strings.Contains(err.Error(), "refusing") {
				t.Fatalf("Open = %v, want a refusal", err)
			}
		})
	}
}

func TestOneAgentPerStore(t *testing.T) {
	root := filepath.Join(t.TempDir(), "reft")
	s := openStore(t, root, nil)
	if _, err := Open(Options{Root: root, JobID: "4242"}); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open = %v, want ErrLocked", err)
	}
	s.Close()
	openStore(t, root, nil) // the lock went with the first agent
}

func TestBadSpecs(t *testing.T) {
	s := openStore(t, filepath.Join(t.TempDir(), "reft"), nil)
	tests := map[string]struct {
		k    Key
		spec Spec
	}{
		"no buffers":     {Key{Shard: "state"}, Spec{Step: 1}},
		"duplicate name": {Key{Shard: "state"}, Spec{Step: 1, Buffers: []BufferSpec{{Name: "a", Size: 1}, {Name: "a", Size: 2}}}},
		"negative size":  {Key{Shard: "state"}, Spec{Step: 1, Buffers: []BufferSpec{{Name: "a", Size: -1}}}},
		"negative step":  {Key{Shard: "state"}, Spec{Step: -1, Buffers: []BufferSpec{{Name: "a", Size: 1}}}},
		"shard path":     {Key{Shard: "../x"}, Spec{Step: 1, Buffers: []BufferSpec{{Name: "a", Size: 1}}}},
		"negative rank":  {Key{Rank: -1, Shard: "state"}, Spec{Step: 1, Buffers: []BufferSpec{{Name: "a", Size: 1}}}},
		"tiny chunks":    {Key{Shard: "state"}, Spec{Step: 1, ChunkSize: 100, Buffers: []BufferSpec{{Name: "a", Size: 1}}}},
		"regions without sources": {Key{Shard: "state"}, Spec{Step: 1, Buffers: []BufferSpec{{Name: "s", Size: 10}},
			Regions: []Region{{Buffer: "a", Size: 10}}}},
		"region of an unknown source": {Key{Shard: "state"}, Spec{Step: 1, Buffers: []BufferSpec{{Name: "s", Size: 10}},
			Sources: []Source{{Name: "a", Size: 10}}, Regions: []Region{{Buffer: "b", Size: 10}}}},
		"region beyond its source": {Key{Shard: "state"}, Spec{Step: 1, Buffers: []BufferSpec{{Name: "s", Size: 10}},
			Sources: []Source{{Name: "a", Size: 10}}, Regions: []Region{{Buffer: "a", Offset: 1, Size: 10}}}},
		"region beyond its section": {Key{Shard: "state"}, Spec{Step: 1, Buffers: []BufferSpec{{Name: "s", Size: 10}},
			Sources: []Source{{Name: "a", Size: 20}}, Regions: []Region{{Buffer: "a", Size: 11}}}},
		"overlapping regions": {Key{Shard: "state"}, Spec{Step: 1, Buffers: []BufferSpec{{Name: "s", Size: 10}},
			Sources: []Source{{Name: "a", Size: 20}}, Regions: []Region{{Buffer: "a", Size: 6}, {Buffer: "a", Offset: 6, Size: 4, ArenaOffset: 5}}}},
	}
	for name, tc := range tests {
		if _, err := s.Begin(tc.k, tc.spec); err == nil {
			t.Errorf("%s: Begin accepted %+v", name, tc.spec)
		}
	}
}

func TestPreallocate(t *testing.T) {
	root := mountTmpfs(t, "8m")
	s := openStore(t, root, nil)
	k := Key{Shard: DefaultShard}
	if err := s.Preallocate(k, Spec{Buffers: []BufferSpec{{Name: "params", Size: 3 << 20}}}); err != nil {
		t.Fatal(err)
	}
	if s.Metrics().StoredBytes.Load() != 6<<20 {
		t.Fatalf("stored %d bytes after preallocating, want two 3 MiB arenas", s.Metrics().StoredBytes.Load())
	}
	paths := map[string]bool{}
	for st := int64(1); st <= 4; st++ {
		paths[save(t, s, k, st, []BufferSpec{{Name: "params", Size: 3 << 20}}).ArenaPath] = true
	}
	if len(paths) != 2 || s.Metrics().StoredBytes.Load() != 6<<20 {
		t.Fatalf("saves used %d arenas, %d bytes; want the two preallocated", len(paths), s.Metrics().StoredBytes.Load())
	}
	// A state that cannot fit fails at registration, not at the first save.
	if err := s.Preallocate(Key{Rank: 1, Shard: DefaultShard}, Spec{Buffers: []BufferSpec{{Name: "params", Size: 3 << 20}}}); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Preallocate on a full store = %v, want ErrNoSpace", err)
	}
}

func TestDiscardedWriterKeepsItsArena(t *testing.T) {
	s := openStore(t, filepath.Join(t.TempDir(), "reft"), nil)
	k := Key{Shard: DefaultShard}
	save(t, s, k, 1, testBuffers)
	o, err := s.Begin(k, Spec{Step: 2, Buffers: testBuffers})
	if err != nil {
		t.Fatal(err)
	}
	// Simulate CopyIn still running for step 2 while step 3 begins.
	s.mu.Lock()
	o.slot.readers++
	s.mu.Unlock()
	o3, err := s.Begin(k, Spec{Step: 3, Buffers: testBuffers})
	if err != nil {
		t.Fatal(err)
	}
	if o3.ArenaPath() == o.ArenaPath() {
		t.Fatal("a new generation got the arena a discarded writer may still be copying into")
	}
	if err := o.CopyIn(stateFor(2, testBuffers)); err == nil {
		t.Fatal("CopyIn into a discarded generation succeeded")
	}
}

// A generation pinned past its retention (the persistent writer reading
// it) holds its arena; Options.Spare keeps one preallocated so saves go on
// without allocating, and the spare survives trimming.
func TestSpareArenaForPinnedReader(t *testing.T) {
	bufs := []BufferSpec{{Name: "params", Size: 1 << 20}}
	for _, tc := range []struct {
		keep, spare int
		wantArenas  int // after saves while a pin is held
	}{
		{0, 0, 3}, // one allocated in the middle of training
		{0, 1, 3}, // preallocated at registration
		{1, 0, 4},
		{1, 1, 4}, // the agent's store with persistent checkpoints on
	} {
		t.Run(fmt.Sprintf("keep=%d,spare=%d", tc.keep, tc.spare), func(t *testing.T) {
			s := openStore(t, filepath.Join(t.TempDir(), "reft"), func(o *Options) { o.Keep, o.Spare = tc.keep, tc.spare })
			k := Key{Shard: DefaultShard}
			if err := s.Preallocate(k, Spec{Buffers: bufs}); err != nil {
				t.Fatal(err)
			}
			want := int64(tc.keep + 2 + tc.spare)
			if pre := s.Metrics().StoredBytes.Load() / (1 << 20); pre != want {
				t.Fatalf("preallocated %d arenas, want %d", pre, want)
			}
			g := save(t, s, k, 1, bufs)
			for st := int64(2); st <= 3; st++ {
				if n := s.Metrics().StoredBytes.Load() / (1 << 20); n != want {
					t.Fatalf("%d arenas before save %d, want the %d preallocated", n, st, want)
				}
				g = save(t, s, k, st, bufs)
			}
			r, err := s.Open(g)
			if err != nil {
				t.Fatal(err)
			}
			for st := int64(4); st <= 8; st++ {
				save(t, s, k, st, bufs)
			}
			if n := s.Metrics().StoredBytes.Load() / (1 << 20); n != int64(tc.wantArenas) {
				t.Fatalf("%d arenas while a generation is pinned, want %d", n, tc.wantArenas)
			}
			checkArena := r.Manifest().Step
			r.Close()
			for st := int64(9); st <= 11; st++ {
				save(t, s, k, st, bufs)
			}
			if n := s.Metrics().StoredBytes.Load() / (1 << 20); n != want {
				t.Fatalf("%d arenas after the pin of step %d closed, want %d", n, checkArena, want)
			}
		})
	}
}

// TestRegionsInManifest: a generation's sources and regions survive a
// restart of the store (restore needs them), and a manifest without them
// (written before regions) reads as one whole region per buffer.
func TestRegionsInManifest(t *testing.T) {
	root := filepath.Join(t.TempDir(), "reft")
	k := Key{Rank: 1, Shard: DefaultShard}
	sources := []Source{{Name: "w", Size: 10_000, Replicated: true}, {Name: "m", Size: 3}}
	spec := Spec{Step: 4, Buffers: []BufferSpec{{Name: "a", Size: 5003}, {Name: "b", Size: 5000}}, Sources: sources}
	secs, _, err := Plan(spec)
	if err != nil {
		t.Fatal(err)
	}
	regions := []Region{{Buffer: "m", Size: 3, ArenaOffset: 0}, {Buffer: "w", Offset: 5000, Size: 5000, ArenaOffset: 3},
		{Buffer: "w", Size: 5000, ArenaOffset: secs[1].Offset}}
	spec.Regions = regions
	s := openStore(t, root, nil)
	o, err := s.Begin(k, spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.Commit(); err != nil {
		t.Fatal(err)
	}
	old := save(t, s, Key{Rank: 2, Shard: DefaultShard}, 1, testBuffers)
	s.Close()
	s = openStore(t, root, nil)
	g, ok := s.Latest(k)
	if !ok || !slices.Equal(g.Manifest.SourceList(), sources) || !slices.Equal(g.Manifest.RegionList(), regions) {
		t.Fatalf("after a restart: %v, sources %+v regions %+v", ok, g.Manifest.SourceList(), g.Manifest.RegionList())
	}
	var want []Region
	var wantSrc []Source
	for _, b := range old.Manifest.Buffers {
		wantSrc = append(wantSrc, Source{Name: b.Name, Size: b.Size, Replicated: b.Replicated})
		if b.Size > 0 {
			want = append(want, Region{Buffer: b.Name, Size: b.Size, ArenaOffset: b.Offset})
		}
	}
	if m := old.Manifest; !slices.Equal(m.SourceList(), wantSrc) || !slices.Equal(m.RegionList(), want) {
		t.Fatalf("a manifest without regions: sources %+v regions %+v, want %+v %+v", m.SourceList(), m.RegionList(), wantSrc, want)
	}
}

func TestDropFreesTransientKey(t *testing.T) {
	s := openStore(t, t.TempDir(), nil)
	k := Key{Rank: 0, Shard: "restore"}
	spec := Spec{Step: 1, Buffers: []BufferSpec{{Name: "rep", Size: 10_000}}}
	o, err := s.Begin(k, spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Drop(k); err == nil {
		t.Fatal("Drop with a save open: no error")
	}
	if err := o.ComputeChecksums("rep"); err != nil {
		t.Fatal(err)
	}
	g, err := o.Commit()
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.Open(g)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Drop(k); err != nil {
		t.Fatal(err)
	}
	if gens := s.Generations(k); len(gens) != 0 {
		t.Fatalf("generations after Drop: %v", gens)
	}
	if _, err := os.Stat(g.ArenaPath); err != nil {
		t.Fatalf("the arena a reader still uses is gone: %v", err)
	}
	r.Close()
	if err := s.Drop(k); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(g.ArenaPath); !os.IsNotExist(err) {
		t.Fatalf("arena %s still there after the reader closed and Drop: %v", g.ArenaPath, err)
	}
}
