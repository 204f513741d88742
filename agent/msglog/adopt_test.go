package msglog

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/reft-hpc/reft/hostmem"
	"github.com/reft-hpc/reft/internal/crc32c"
)

// realStore is a store of job over hostmem arena files in dir, as the
// agent makes it (msglog.go in package agent).
func realStore(t *testing.T, dir, job string) *Store {
	t.Helper()
	alloc, err := hostmem.NewAllocator(hostmem.Config{NoPin: true})
	if err != nil {
		t.Fatal(err)
	}
	uid := os.Geteuid()
	return New(Config{Dir: dir, Job: job, UID: uid, Cap: func() (int64, string) { return 1 << 30, "the test's cap" },
		Alloc: func(path string, size int64) (Arena, error) {
			a, err := alloc.Create(path, size, hostmem.Owner{UID: -1, GID: -1})
			if err != nil {
				return nil, err
			}
			return a, nil
		},
		Adopt: func(path string) (Arena, error) {
			a, err := alloc.AdoptOwned(path, uid)
			if err != nil {
				return nil, err
			}
			return a, nil
		},
		Discard: alloc.Discard})
}

func realAppend(t *testing.T, s *Store, rank int, k Key, data []byte) {
	t.Helper()
	p, err := s.Begin(rank, k, int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Commit(crc32c.Copy(0, p.Arena().Bytes()[:len(data)], data)); err != nil {
		t.Fatal(err)
	}
}

// realRead reads rank's message k as a rank does: maps the arena Read
// names and copies the bytes out.
func realRead(s *Store, rank int, k Key) ([]byte, error) {
	st, err := s.Read(rank, k)
	if err != nil {
		return nil, err
	}
	a, err := hostmem.MapShared(st.Arena, hostmem.MapOptions{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer a.Close()
	return slices.Clone(a.Bytes()[:st.Size]), nil
}

// TestAdopt: a new store over the directory an earlier one closed (an
// agent restart) adopts every intact message, bit-exact, counted against
// the held bytes and the rank's cap; every file it cannot use is removed
// and counted once under its reason; and its own appends go on beside the
// adopted ones.
func TestAdopt(t *testing.T) {
	k1, k2, k3 := Key{Stream: "act>1", Step: 1}, Key{Stream: "act>1", Step: 2}, Key{Stream: "grad<1", Step: 2, Seq: 3}
	a1, a2, a3 := msgBytes(10000, 1), msgBytes(5000, 2), msgBytes(300, 3)
	// damage is done to the directory between the two agents; path is
	// the arena of k2 (rank 0's second message).
	cases := []struct {
		name    string
		job     string // the new store's job; "" the same
		damage  func(t *testing.T, dir, arena string)
		lost    map[string]int
		unused  int
		k2Lost  bool // k2 does not read back intact after the restart
		corrupt bool // k2 is adopted and fails its CRC-32C at read
	}{
		{name: "intact", damage: func(*testing.T, string, string) {}},
		{name: "arena truncated", damage: func(t *testing.T, _, arena string) {
			must(t, os.Truncate(arena, 4096))
		}, lost: map[string]int{LostTruncated: 1}, k2Lost: true},
		{name: "arena emptied", damage: func(t *testing.T, _, arena string) {
			must(t, os.Truncate(arena, 0))
		}, lost: map[string]int{LostNotArena: 1}, k2Lost: true},
		{name: "record header corrupt", damage: func(t *testing.T, _, arena string) {
			b, err := os.ReadFile(arena + recordExt)
			must(t, err)
			b[20] ^= 1 // the step
			must(t, os.WriteFile(arena+recordExt, b, 0o600))
		}, lost: map[string]int{LostBadRecord: 1}, k2Lost: true},
		{name: "record cut short", damage: func(t *testing.T, _, arena string) {
			must(t, os.Truncate(arena+recordExt, 100))
		}, lost: map[string]int{LostBadRecord: 1}, k2Lost: true},
		{name: "record a symlink", damage: func(t *testing.T, dir, arena string) {
			other := filepath.Join(t.TempDir(), "rec")
			b, err := os.ReadFile(arena + recordExt)
			must(t, err)
			must(t, os.WriteFile(other, b, 0o600))
			must(t, os.Remove(arena+recordExt))
			must(t, os.Symlink(other, arena+recordExt))
		}, lost: map[string]int{LostForeign: 1}, k2Lost: true},
		{name: "arena a symlink", damage: func(t *testing.T, dir, arena string) {
			other := filepath.Join(t.TempDir(), "target")
			b, err := os.ReadFile(arena)
			must(t, err)
			must(t, os.WriteFile(other, b, 0o600))
			must(t, os.Remove(arena))
			must(t, os.Symlink(other, arena))
			t.Cleanup(func() {
				if _, err := os.Stat(other); err != nil {
					t.Errorf("the symlink's target was touched: %v", err)
				}
			})
		}, lost: map[string]int{LostNotArena: 1}, k2Lost: true},
		{name: "arena a directory", damage: func(t *testing.T, dir, arena string) {
			must(t, os.Remove(arena))
			must(t, os.Mkdir(arena, 0o700))
		}, lost: map[string]int{LostNotArena: 1}, k2Lost: true},
		{name: "arena of another user", damage: func(t *testing.T, dir, arena string) {
			if os.Geteuid() != 0 {
				t.Skip("needs root to give a file away")
			}
			must(t, os.Chown(arena, 4242, 4242))
		}, lost: map[string]int{LostNotArena: 1}, k2Lost: true},
		{name: "record of another user", damage: func(t *testing.T, dir, arena string) {
			if os.Geteuid() != 0 {
				t.Skip("needs root to give a file away")
			}
			must(t, os.Chown(arena+recordExt, 4242, 4242))
		}, lost: map[string]int{LostForeign: 1}, k2Lost: true},
		{name: "record of another arena", damage: func(t *testing.T, dir, arena string) {
			// arena-0's record copied onto arena-1's: two records of k1.
			b, err := os.ReadFile(filepath.Join(dir, "arena-0"+recordExt))
			must(t, err)
			must(t, os.WriteFile(arena+recordExt, b, 0o600))
		}, lost: map[string]int{LostForeign: 1}, k2Lost: true},
		{name: "another job's log", job: "8", damage: func(*testing.T, string, string) {},
			lost: map[string]int{LostForeign: 3}, k2Lost: true},
		{name: "payload corrupt", damage: func(t *testing.T, _, arena string) {
			f, err := os.OpenFile(arena, os.O_WRONLY, 0)
			must(t, err)
			_, err = f.WriteAt([]byte{0xff, 0xee}, 17)
			must(t, err)
			must(t, f.Close())
		}, corrupt: true, k2Lost: true},
		{name: "stale temp and strangers", damage: func(t *testing.T, dir, _ string) {
			must(t, os.WriteFile(filepath.Join(dir, tempPrefix+"arena-7"+recordExt), []byte("half"), 0o600))
			must(t, os.WriteFile(filepath.Join(dir, "notes.txt"), nil, 0o600))
		}, lost: map[string]int{LostStaleTemp: 1, LostUnknown: 1}},
		{name: "record without arena", damage: func(t *testing.T, _, arena string) {
			must(t, os.Remove(arena))
		}, lost: map[string]int{LostNoArena: 1}, k2Lost: true},
		{name: "arena without record", damage: func(t *testing.T, _, arena string) {
			must(t, os.Remove(arena+recordExt))
		}, unused: 1, k2Lost: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			old := realStore(t, dir, "7")
			realAppend(t, old, 0, k1, a1)
			realAppend(t, old, 0, k2, a2)
			realAppend(t, old, 3, k3, a3)
			// A truncated message leaves a spare, which Close deletes.
			realAppend(t, old, 0, Key{Stream: "act>1", Step: 0}, a3)
			old.Truncate(0, 0)
			must(t, old.Close())
			tc.damage(t, dir, filepath.Join(dir, "arena-1"))

			job := tc.job
			if job == "" {
				job = "7"
			}
			s := realStore(t, dir, job)
			ad, err := s.Adopt()
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if tc.lost == nil {
				tc.lost = map[string]int{}
			}
			if !mapsEqual(ad.Lost, tc.lost) || ad.Unused != tc.unused || len(ad.Errors) != 0 {
				t.Fatalf("adopted %+v; want lost %v, %d unused, no errors", ad, tc.lost, tc.unused)
			}
			if n := ad.LostCount(); n > 0 && len(ad.Details) != n {
				t.Errorf("%d files lost and %d named: %v", n, len(ad.Details), ad.Details)
			}
			want := map[Key][]byte{}
			if job == "7" {
				want[k1] = a1
				if !tc.k2Lost {
					want[k2] = a2
				}
			}
			var held int64
			for k, b := range want {
				held += int64(len(b))
				if got, err := realRead(s, 0, k); err != nil || !slices.Equal(got, b) {
					t.Errorf("rank 0's %s after the restart: %d bytes, %v", k, len(got), err)
				}
			}
			if job == "7" {
				held += int64(len(a3))
				if got, err := realRead(s, 3, k3); err != nil || !slices.Equal(got, a3) {
					t.Errorf("rank 3's %s after the restart: %v", k3, err)
				}
			}
			if tc.corrupt {
				held += int64(len(a2))
				if _, err := s.Read(0, k2); !errors.Is(err, ErrCorrupt) {
					t.Errorf("the damaged message read: %v, want ErrCorrupt", err)
				}
			} else if _, ok := want[k2]; !ok {
				if _, err := s.Read(0, k2); !errors.Is(err, ErrNotFound) {
					t.Errorf("a lost message read: %v, want ErrNotFound", err)
				}
			}
			if got := s.Counts().Held; got != held {
				t.Errorf("held %d bytes after the restart, want %d", got, held)
			}
			if s.RankHeld(0)+s.RankHeld(3) != held || (held > 0 && s.RankBytes(0)+s.RankBytes(3) < held) {
				t.Errorf("the ranks hold %d+%d bytes (%d+%d in arenas), want %d", s.RankHeld(0), s.RankHeld(3), s.RankBytes(0), s.RankBytes(3), held)
			}
			// Nothing left that the store does not hold: every arena is a
			// message's, with its record.
			ents, _ := os.ReadDir(dir)
			if len(ents) != 2*(len(want)+boolInt(job == "7")+boolInt(tc.corrupt)) {
				t.Errorf("%d files left in the directory: %v", len(ents), ents)
			}
			// The new agent's appends get fresh arenas and records.
			realAppend(t, s, 0, Key{Stream: "act>1", Step: 3}, a3)
			if got, err := realRead(s, 0, Key{Stream: "act>1", Step: 3}); err != nil || !slices.Equal(got, a3) {
				t.Errorf("an append after the restart: %v", err)
			}
			for k, b := range want {
				if got, err := realRead(s, 0, k); err != nil || !slices.Equal(got, b) {
					t.Errorf("rank 0's %s after a new append: %v", k, err)
				}
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
