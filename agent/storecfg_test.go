package agent

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/tmpfs"
)

// saveSteps commits steps 1..n of one small buffer for rank 0.
func saveSteps(t *testing.T, st *tmpfs.Store, n int64) {
	t.Helper()
	for step := int64(1); step <= n; step++ {
		o, err := st.Begin(tmpfs.Key{Shard: tmpfs.DefaultShard}, tmpfs.Spec{Step: step, Buffers: []tmpfs.BufferSpec{{Name: "w", Size: 8192}}})
		if err != nil {
			t.Fatal(err)
		}
		if err := o.CopyIn(map[string][]byte{"w": make([]byte, 8192)}); err != nil {
			t.Fatal(err)
		}
		if _, err := o.Commit(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestStoreKeepConfig: [store] keep = N keeps N completed generations more
// than the agent's own retention (the newest and the two before it,
// alwaysKept).
func TestStoreKeepConfig(t *testing.T) {
	tests := []struct {
		keep int
		want []int64
	}{
		{0, []int64{6, 5, 4}},
		{2, []int64{6, 5, 4, 3, 2}},
	}
	for _, tc := range tests {
		t.Run("keep="+strconv.Itoa(tc.keep), func(t *testing.T) {
			cfg, err := config.Parse("t.toml", []byte("[store]\ntmpfs_root = \""+t.TempDir()+"\"\nkeep = "+strconv.Itoa(tc.keep)))
			if err != nil {
				t.Fatal(err)
			}
			st, err := openStore(cfg, "42", 64<<20, false, zerolog.Nop())
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			saveSteps(t, st, 6)
			var got []int64
			for _, g := range st.Generations(tmpfs.Key{Shard: tmpfs.DefaultShard}) {
				got = append(got, g.Step)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("keep = %d: generations %v, want %v", tc.keep, got, tc.want)
			}
		})
	}
}

// TestStoreHugeTLBFSConfig: [store] hugetlbfs reaches the allocator: the
// arenas live on the mount, linked from the store; a directory that is not
// a hugetlbfs mount is refused with the key to unset.
func TestStoreHugeTLBFSConfig(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("run the unit tests as root: this test mounts a hugetlbfs")
	}
	root := t.TempDir()
	cfg, err := config.Parse("t.toml", []byte("[store]\ntmpfs_root = \""+root+"\"\nhugetlbfs = \""+t.TempDir()+"\""))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := openStore(cfg, "42", 64<<20, false, zerolog.Nop()); err == nil ||
		!strings.Contains(err.Error(), "is not a hugetlbfs mount") || !strings.Contains(err.Error(), "unset [store] hugetlbfs in reft.toml") {
		t.Fatalf("openStore with a plain directory as hugetlbfs: %v", err)
	}

	huge := t.TempDir()
	if err := unix.Mount("none", huge, "hugetlbfs", 0, ""); err != nil {
		t.Fatalf("mount hugetlbfs on %s: %v", huge, err)
	}
	t.Cleanup(func() { unix.Unmount(huge, unix.MNT_DETACH) })
	const knob = "/proc/sys/vm/nr_hugepages"
	orig, err := os.ReadFile(knob)
	if err != nil {
		t.Fatal(err)
	}
	// Preallocation makes 3 arenas (ongoing, newest, previous) of one huge page each.
	n, _ := strconv.Atoi(strings.TrimSpace(string(orig)))
	if err := os.WriteFile(knob, []byte(strconv.Itoa(n+3)), 0o644); err != nil {
		t.Fatalf("raise %s: %v", knob, err)
	}
	t.Cleanup(func() { os.WriteFile(knob, orig, 0o644) })

	cfg.Store.HugeTLBFS = huge
	st, err := openStore(cfg, "42", 64<<20, false, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	saveSteps(t, st, 1)
	g, ok := st.Latest(tmpfs.Key{Shard: tmpfs.DefaultShard})
	if !ok {
		t.Fatal("no generation committed")
	}
	// Ranks are told the file itself, at the store's path below the
	// mount; the store keeps a link to it.
	if fi, err := os.Lstat(g.ArenaPath); err != nil || !fi.Mode().IsRegular() || !strings.HasPrefix(g.ArenaPath, huge+"/") {
		t.Fatalf("arena %s (%v): want a regular file below the hugetlbfs mount %s", g.ArenaPath, err, huge)
	}
	link := strings.TrimPrefix(g.ArenaPath, huge)
	if target, err := os.Readlink(link); err != nil || target != g.ArenaPath {
		t.Fatalf("store link %s -> %q (%v), want %s", link, target, err, g.ArenaPath)
	}
	if m := st.Allocator().Metrics(); m.HugePageArenas.Load() < 1 {
		t.Fatalf("HugePageArenas = %d, want the hugetlbfs arenas counted", m.HugePageArenas.Load())
	}
	if !strings.HasPrefix(link, filepath.Join(root, "0")) {
		t.Fatalf("arena link %s is not in the store root %s", link, root)
	}
}
