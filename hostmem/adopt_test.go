package hostmem

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestAdoptOwnedHugeTLBFS: under hugetlbfs an arena an earlier agent left
// is a link in the store to exactly its file below the mount. AdoptOwned
// maps only that; a link elsewhere, or a regular file where the link
// should be, is refused with ErrNotArena. Discard removes the link and
// the mount's file it names, and never what a stray link names.
func TestAdoptOwnedHugeTLBFS(t *testing.T) {
	huge := mountFS(t, "hugetlbfs", "")
	const knob = "/proc/sys/vm/nr_hugepages"
	orig, err := os.ReadFile(knob)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(orig)))
	if err := os.WriteFile(knob, []byte(strconv.Itoa(n+2)), 0o644); err != nil {
		t.Fatalf("raise %s: %v", knob, err)
	}
	t.Cleanup(func() { os.WriteFile(knob, orig, 0o644) })

	cases := []struct {
		name    string
		damage  func(t *testing.T, path, file string) // path: the store's link; file: the mount's
		adopted bool
		kept    bool // Discard leaves the mount's file (the link did not name it)
	}{
		{name: "the link to its file", damage: func(*testing.T, string, string) {}, adopted: true},
		{name: "a link elsewhere", damage: func(t *testing.T, path, _ string) {
			other := filepath.Join(t.TempDir(), "other")
			if err := os.WriteFile(other, make([]byte, 4096), 0o600); err != nil {
				t.Fatal(err)
			}
			os.Remove(path)
			if err := os.Symlink(other, path); err != nil {
				t.Fatal(err)
			}
		}, kept: true},
		{name: "a regular file for the link", damage: func(t *testing.T, path, _ string) {
			os.Remove(path)
			if err := os.WriteFile(path, make([]byte, 4096), 0o600); err != nil {
				t.Fatal(err)
			}
		}, kept: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := newAlloc(t, Config{HugeTLBDir: huge, NoPin: true})
			path := filepath.Join(t.TempDir(), "arena-0")
			r, err := a.Create(path, 1<<20, Self())
			if err != nil {
				t.Fatal(err)
			}
			file := r.FilePath()
			copy(r.Bytes(), "logged")
			r.Close()
			tc.damage(t, path, file)
			got, err := a.AdoptOwned(path, os.Geteuid())
			if tc.adopted {
				if err != nil || got.FilePath() != file || string(got.Bytes()[:6]) != "logged" {
					t.Fatalf("AdoptOwned: %v", err)
				}
				got.Close()
			} else if !errors.Is(err, ErrNotArena) {
				t.Fatalf("AdoptOwned: %v, want ErrNotArena", err)
			}
			if err := a.Discard(path); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Lstat(path); !os.IsNotExist(err) {
				t.Errorf("Discard left %s: %v", path, err)
			}
			if _, err := os.Stat(file); os.IsNotExist(err) == tc.kept {
				t.Errorf("the mount's file after Discard: %v, want kept %v", err, tc.kept)
			}
			os.Remove(file)
		})
	}
}
