package persist

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/internal/crc32c"
	"github.com/reft-hpc/reft/tmpfs"
)

func TestWriteAndLoad(t *testing.T) {
	st := localStore(t, filepath.Join(t.TempDir(), "shm"))
	dir := t.TempDir()
	disk := openDisk(t, dir)
	w := persistGen(t, st, disk, 3, 40, -1)
	if w.Dir != genDir(dir, 3, 40) || w.Already {
		t.Fatalf("written %+v", w)
	}
	gens, err := disk.List(3)
	if err != nil || !slices.Equal(steps(gens), []int64{40}) {
		t.Fatalf("List = %v, %v", steps(gens), err)
	}
	g := gens[0]
	if g.Bad || g.Manifest.ChunkSize != testChunk || g.Bytes() != 370_009 || g.Manifest.JobID != testJob {
		t.Fatalf("generation %+v", g)
	}
	// The data file is the arena: each buffer at its offset.
	data, err := os.ReadFile(filepath.Join(g.Dir, dataFile))
	if err != nil || int64(len(data)) != g.Manifest.ArenaSize {
		t.Fatalf("data file: %d bytes, %v; arena %d", len(data), err, g.Manifest.ArenaSize)
	}
	want := stateFor(3, 40)
	for _, b := range g.Manifest.Buffers {
		if string(data[b.Offset:b.Offset+b.Size]) != string(want[b.Name]) {
			t.Fatalf("data file: buffer %q is not at offset %d", b.Name, b.Offset)
		}
	}
	var mk marker
	raw, _ := os.ReadFile(filepath.Join(g.Dir, markerFile))
	if err := json.Unmarshal(raw, &mk); err != nil || mk.Step != 40 || mk.DataBytes != g.Manifest.ArenaSize || mk.Node != "n1" {
		t.Fatalf("COMMITTED %s: %+v, %v", raw, mk, err)
	}
	got, err := loadState(disk, g)
	if err != nil {
		t.Fatal(err)
	}
	checkState(t, got, 3, 40)
	// Writing the same generation again is a no-op.
	r, err := st.Open(gens0(t, st, 3))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if w, err := disk.Write(t.Context(), r, -1); err != nil || !w.Already {
		t.Fatalf("second write of the same generation: %+v, %v", w, err)
	}
}

func gens0(t *testing.T, st *tmpfs.Store, rank int) tmpfs.Generation {
	t.Helper()
	g, ok := st.Latest(tmpfs.Key{Rank: rank, Shard: tmpfs.DefaultShard})
	if !ok {
		t.Fatal("no local generation")
	}
	return g
}

func TestRetention(t *testing.T) {
	type write struct {
		step, abandonedAbove int64
	}
	tests := []struct {
		name   string
		writes []write
		want   []int64
	}{
		{"keeps the last two", []write{{1, -1}, {2, -1}, {3, -1}, {4, -1}}, []int64{4, 3}},
		{"one", []write{{7, -1}}, []int64{7}},
		// The job went back to 15: 20 belongs to the abandoned timeline.
		{"newer step is abandoned", []write{{10, -1}, {20, -1}, {15, -1}}, []int64{15, 10}},
		// The job restored 12 after 10 and 20 were written; 16 replaces 20.
		{"restored below a persisted step", []write{{10, -1}, {20, -1}, {16, 12}}, []int64{16, 10}},
		{"restored step kept", []write{{8, -1}, {12, -1}, {20, -1}, {24, 12}}, []int64{24, 12}},
		// The same step from another timeline replaces the old copy.
		{"same step rewritten", []write{{4, -1}, {8, -1}, {8, 4}}, []int64{8, 4}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := localStore(t, filepath.Join(t.TempDir(), "shm"))
			dir := t.TempDir()
			disk := openDisk(t, dir)
			for i, w := range tc.writes {
				// A rewrite of a step uses other bytes (another rank's
				// pattern under rank 0's key), as another timeline would.
				o, err := st.Begin(tmpfs.Key{Rank: 0, Shard: tmpfs.DefaultShard}, tmpfs.Spec{Step: w.step, Buffers: testBuffers})
				if err != nil {
					t.Fatal(err)
				}
				if err := o.CopyIn(stateFor(i, w.step)); err != nil {
					t.Fatal(err)
				}
				g, err := o.Commit()
				if err != nil {
					t.Fatal(err)
				}
				r, err := st.Open(g)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := disk.Write(t.Context(), r, w.abandonedAbove); err != nil {
					t.Fatal(err)
				}
				r.Close()
			}
			gens, err := disk.List(0)
			if err != nil || !slices.Equal(steps(gens), tc.want) {
				t.Fatalf("kept %v (%v), want %v", steps(gens), err, tc.want)
			}
			ents, _ := os.ReadDir(filepath.Dir(genDir(dir, 0, 0)))
			if len(ents) != len(tc.want) {
				t.Fatalf("rank directory holds %d entries, want only the %d kept generations", len(ents), len(tc.want))
			}
			// The newest holds the bytes of its last write.
			got, err := loadState(disk, gens[0])
			if err != nil {
				t.Fatal(err)
			}
			last := -1
			for i, w := range tc.writes {
				if w.step == tc.want[0] {
					last = i
				}
			}
			checkState(t, got, last, tc.want[0])
		})
	}
}

func TestPermissions(t *testing.T) {
	st := localStore(t, filepath.Join(t.TempDir(), "shm"))
	t.Run("modes", func(t *testing.T) {
		old := unix.Umask(0) // the modes must not depend on the umask
		defer unix.Umask(old)
		dir := t.TempDir()
		persistGen(t, st, openDisk(t, dir), 1, 5, -1)
		err := filepath.Walk(filepath.Join(dir, testJob), func(p string, fi os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			want := os.FileMode(0o600)
			if fi.IsDir() {
				want = os.ModeDir | 0o700
			}
			if fi.Mode() != want {
				t.Errorf("%s: mode %v, want %v", p, fi.Mode(), want)
			}
			if uid := fi.Sys().(*syscall.Stat_t).Uid; int(uid) != os.Getuid() {
				t.Errorf("%s: uid %d, want %d", p, uid, os.Getuid())
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
	t.Run("a wide job directory of our own is narrowed", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.Mkdir(filepath.Join(dir, testJob), 0o755); err != nil {
			t.Fatal(err)
		}
		os.Chmod(filepath.Join(dir, testJob), 0o755)
		openDisk(t, dir)
		if fi, _ := os.Stat(filepath.Join(dir, testJob)); fi.Mode().Perm() != 0o700 {
			t.Fatalf("job directory mode %v, want 0700", fi.Mode().Perm())
		}
	})
	refusals := []struct {
		name  string
		setup func(t *testing.T, dir string) (uid int)
		want  string
	}{
		{"job directory of another user", func(t *testing.T, dir string) int {
			os.Mkdir(filepath.Join(dir, testJob), 0o700)
			return os.Getuid() + 1 // as if someone else had made it
		}, "refusing"},
		{"job directory is a symlink", func(t *testing.T, dir string) int {
			os.Symlink(t.TempDir(), filepath.Join(dir, testJob))
			return os.Getuid()
		}, "refusing"},
		{"relative", func(t *testing.T, dir string) int { return os.Getuid() }, "absolute"},
	}
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			uid := tc.setup(t, dir)
			if tc.want == "absolute" {
				dir = "rel/dir"
			}
			_, err := OpenStore(dir, testJob, "n1", uid, Epoch{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("OpenStore = %v, want an error with %q", err, tc.want)
			}
		})
	}
	t.Run("rank directory of another user", func(t *testing.T) {
		dir := t.TempDir()
		disk := openDisk(t, dir)
		if err := os.Symlink(t.TempDir(), filepath.Join(dir, testJob, "r2")); err != nil {
			t.Fatal(err)
		}
		r, err := st.Open(commitGen(t, st, 2, 1))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if _, err := disk.Write(t.Context(), r, -1); err == nil || !strings.Contains(err.Error(), "refusing") {
			t.Fatalf("Write into a symlinked rank directory = %v", err)
		}
	})
}

func TestCorruptPersisted(t *testing.T) {
	tests := []struct {
		name    string
		damage  func(t *testing.T, g Generation)
		listed  bool   // still listed (as bad after the load)
		wantErr string // in Load's error
		chunks  []tmpfs.BadChunk
	}{
		{"flipped byte in a chunk", func(t *testing.T, g Generation) {
			b := g.Manifest.Buffers[0] // params: chunk 2
			flip(t, filepath.Join(g.Dir, dataFile), b.Offset+2*testChunk+17)
		}, true, `buffer "params" chunk 2`, []tmpfs.BadChunk{{Buffer: "params", Index: 2}}},
		{"two chunks", func(t *testing.T, g Generation) {
			flip(t, filepath.Join(g.Dir, dataFile), g.Manifest.Buffers[0].Offset)
			flip(t, filepath.Join(g.Dir, dataFile), g.Manifest.Buffers[1].Offset+testChunk)
		}, true, `buffer "adam" chunk 1`, []tmpfs.BadChunk{{Buffer: "params", Index: 0}, {Buffer: "adam", Index: 1}}},
		{"truncated data file", func(t *testing.T, g Generation) {
			os.Truncate(filepath.Join(g.Dir, dataFile), 1000)
		}, true, "the data file has 1000 bytes", nil},
		{"torn manifest", func(t *testing.T, g Generation) {
			flip(t, filepath.Join(g.Dir, manifestFile), 10)
		}, false, "", nil},
		{"manifest with too few checksums, marker rewritten to match", func(t *testing.T, g Generation) {
			m := g.Manifest
			m.Buffers = slices.Clone(m.Buffers)
			m.Buffers[0].CRC32C = m.Buffers[0].CRC32C[:1] // bytes past chunk 0 would go unchecked
			raw, _ := json.Marshal(m)
			os.WriteFile(filepath.Join(g.Dir, manifestFile), raw, 0o600)
			var mk marker
			old, _ := os.ReadFile(filepath.Join(g.Dir, markerFile))
			json.Unmarshal(old, &mk)
			mk.ManifestBytes, mk.ManifestCRC = len(raw), crc32c.Checksum(raw)
			newMk, _ := json.Marshal(mk)
			os.WriteFile(filepath.Join(g.Dir, markerFile), newMk, 0o600)
		}, false, "", nil},
		{"no commit marker", func(t *testing.T, g Generation) {
			os.Remove(filepath.Join(g.Dir, markerFile))
		}, false, "", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := localStore(t, filepath.Join(t.TempDir(), "shm"))
			disk := openDisk(t, t.TempDir())
			persistGen(t, st, disk, 0, 9, -1)
			gens, _ := disk.List(0)
			g := gens[0]
			tc.damage(t, g)
			gens, err := disk.List(0)
			if err != nil || (len(gens) == 1) != tc.listed {
				t.Fatalf("after damage List = %v, %v; want listed %v", steps(gens), err, tc.listed)
			}
			if !tc.listed {
				return
			}
			_, err = loadState(disk, gens[0])
			var cerr *CorruptError
			if !errors.As(err, &cerr) || !errors.Is(err, tmpfs.ErrCorrupt) {
				t.Fatalf("Load = %v, want a *CorruptError", err)
			}
			if cerr.File != filepath.Join(g.Dir, dataFile) || !strings.Contains(err.Error(), cerr.File) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %q: want the file %s and %q", err, filepath.Join(g.Dir, dataFile), tc.wantErr)
			}
			if len(cerr.Chunks) != len(tc.chunks) {
				t.Fatalf("bad chunks %+v, want %+v", cerr.Chunks, tc.chunks)
			}
			for i, c := range tc.chunks {
				if cerr.Chunks[i].Buffer != c.Buffer || cerr.Chunks[i].Index != c.Index {
					t.Fatalf("bad chunk %d: %+v, want %+v", i, cerr.Chunks[i], c)
				}
			}
			if gens, _ := disk.List(0); len(gens) != 1 || !gens[0].Bad {
				t.Fatalf("after a corrupt load the generation is not marked bad: %+v", gens)
			}
		})
	}
}

// flip inverts one byte of a file.
func flip(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// A generation whose memory changed after its commit is not persisted.
func TestWriteRefusesCorruptMemory(t *testing.T) {
	st := localStore(t, filepath.Join(t.TempDir(), "shm"))
	dir := t.TempDir()
	disk := openDisk(t, dir)
	g := commitGen(t, st, 0, 3)
	mem, err := os.OpenFile(g.ArenaPath, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	mem.WriteAt([]byte{0xAA, 0xBB}, g.Manifest.Buffers[1].Offset+5)
	mem.Close()
	r, err := st.Open(g)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := disk.Write(t.Context(), r, -1); !errors.Is(err, tmpfs.ErrCorrupt) || !strings.Contains(err.Error(), `buffer "adam" chunk 0`) {
		t.Fatalf("Write of corrupted memory = %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Dir(genDir(dir, 0, 3))); len(ents) != 0 {
		t.Fatalf("a refused write left %v", ents)
	}
}
