package hostmem

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// mountFS mounts a fresh filesystem of type fstype on a temporary directory
// (the tests run as root) and unmounts it at cleanup.
func mountFS(t *testing.T, fstype, opts string) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("none", dir, fstype, 0, opts); err != nil {
		t.Fatalf("mount %s on %s (tests need root): %v", fstype, dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

func newAlloc(t *testing.T, cfg Config) *Allocator {
	t.Helper()
	a, err := NewAllocator(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestArenaSharedBetweenAgentAndRank(t *testing.T) {
	dir := t.TempDir()
	a := newAlloc(t, Config{})
	path := filepath.Join(dir, "arena-0")
	ag, err := a.Create(path, 10000, Self())
	if err != nil {
		t.Fatal(err)
	}
	defer ag.Close()
	if ag.Size() != 12288 {
		t.Fatalf("size %d, want 10000 rounded up to pages (12288)", ag.Size())
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 || st.Size() != ag.Size() {
		t.Fatalf("arena file: %v %v", st.Mode(), err)
	}
	byPath, err := MapShared(path, MapOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer byPath.Close()
	byFD, err := MapSharedFD(int(ag.File().Fd()), MapOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer byFD.Close()

	copy(byPath.Bytes()[100:], "written by the rank")
	copy(ag.Bytes()[5000:], "written by the agent")
	for _, m := range []*Arena{ag, byPath, byFD} {
		if !bytes.HasPrefix(m.Bytes()[100:], []byte("written by the rank")) || !bytes.HasPrefix(m.Bytes()[5000:], []byte("written by the agent")) {
			t.Fatalf("%s does not see both writes", m.Path())
		}
	}
	// The bytes outlive every mapping: they are in the file.
	ag.Close()
	byPath.Close()
	byFD.Close()
	data, err := os.ReadFile(path)
	if err != nil || !bytes.HasPrefix(data[100:], []byte("written by the rank")) {
		t.Fatalf("file after unmapping: %v", err)
	}
}

func TestArenaOwnedByJobUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving files to another user needs root")
	}
	dir := t.TempDir()
	a := newAlloc(t, Config{})
	r, err := a.Create(filepath.Join(dir, "arena-0"), 4096, Owner{UID: 65534, GID: 65534})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Remove()
	var st unix.Stat_t
	if err := unix.Stat(r.Path(), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 65534 || st.Gid != 65534 || st.Mode&0o777 != 0o600 {
		t.Fatalf("owner %d:%d mode %o, want 65534:65534 0600", st.Uid, st.Gid, st.Mode&0o777)
	}
}

func TestPinWithinMemlockLimit(t *testing.T) {
	var logBuf bytes.Buffer
	m := new(Metrics)
	a := newAlloc(t, Config{Log: zerolog.New(&logBuf), Metrics: m,
		memlockLimit: func() (uint64, error) { return 8 << 20, nil }})
	dir := t.TempDir()
	var arenas []*Arena
	for i := range 3 {
		r, err := a.Create(filepath.Join(dir, "arena-"+strconv.Itoa(i)), 6<<20, Self())
		if err != nil {
			t.Fatal(err)
		}
		arenas = append(arenas, r)
	}
	if !arenas[0].Pinned() || arenas[1].Pinned() || arenas[2].Pinned() {
		t.Fatalf("pinned %v %v %v; want only the first 6 MiB under an 8 MiB limit", arenas[0].Pinned(), arenas[1].Pinned(), arenas[2].Pinned())
	}
	if m.UnpinnedArenas.Load() != 2 || m.PinnedBytes.Load() != 6<<20 {
		t.Fatalf("metrics: unpinned %d pinned bytes %d", m.UnpinnedArenas.Load(), m.PinnedBytes.Load())
	}
	log := logBuf.String()
	if strings.Count(log, "\n") != 1 || !strings.Contains(log, "RLIMIT_MEMLOCK is 8 MiB") ||
		!strings.Contains(log, "LimitMEMLOCK") || !strings.Contains(log, "ulimit -l") {
		t.Fatalf("want exactly one warning naming the limit and how to raise it, got:\n%s", log)
	}
	// Unpinned arenas still work.
	copy(arenas[2].Bytes(), "still works")
	for _, r := range arenas {
		if err := r.Remove(); err != nil {
			t.Fatal(err)
		}
	}
	if m.PinnedBytes.Load() != 0 || m.ArenaBytes.Load() != 0 {
		t.Fatalf("gauges after removal: pinned %d arena %d", m.PinnedBytes.Load(), m.ArenaBytes.Load())
	}
}

func TestPinUnderRealLimit(t *testing.T) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl); err != nil {
		t.Fatal(err)
	}
	a := newAlloc(t, Config{})
	r, err := a.Create(filepath.Join(t.TempDir(), "arena"), 1<<20, Self())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Remove()
	if want := rl.Cur == unix.RLIM_INFINITY || rl.Cur >= 1<<20; r.Pinned() != want {
		t.Fatalf("pinned = %v under RLIMIT_MEMLOCK %d, want %v", r.Pinned(), rl.Cur, want)
	}
}

func TestCreateFailsCleanly(t *testing.T) {
	small := mountFS(t, "tmpfs", "size=4m")
	tests := []struct {
		name   string
		dir    string
		cap    Cap
		size   int64
		is     error
		inText string
	}{
		{"tmpfs full", small, Cap{Fraction: 1}, 8 << 20, unix.ENOSPC, "free of 4 MiB"},
		{"over budget", t.TempDir(), Cap{Bytes: 1 << 20}, 2 << 20, ErrOverBudget, "exceeds the memory budget of 1 MiB"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := NewBudget(BudgetConfig{Cap: tc.cap}, nil)
			if err != nil {
				t.Fatal(err)
			}
			a := newAlloc(t, Config{Budget: b})
			path := filepath.Join(tc.dir, "arena")
			_, err = a.Create(path, tc.size, Self())
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.inText) {
				t.Fatalf("Create = %v; want %v mentioning %q", err, tc.is, tc.inText)
			}
			if _, serr := os.Lstat(path); !os.IsNotExist(serr) {
				t.Fatalf("failed Create left %s behind", path)
			}
			if b.InUse() != 0 {
				t.Fatalf("failed Create kept %d bytes of budget", b.InUse())
			}
		})
	}
}

type fakeGPU struct{ registered map[*byte]int }

func (g *fakeGPU) Register(b []byte) error { g.registered[&b[0]] = len(b); return nil }
func (g *fakeGPU) Unregister(b []byte) error {
	if _, ok := g.registered[&b[0]]; !ok {
		return errors.New("not registered")
	}
	delete(g.registered, &b[0])
	return nil
}

func TestGPURegistration(t *testing.T) {
	g := &fakeGPU{registered: map[*byte]int{}}
	m := new(Metrics)
	a := newAlloc(t, Config{GPU: g, Metrics: m})
	r, err := a.Create(filepath.Join(t.TempDir(), "arena"), 1<<20, Self())
	if err != nil {
		t.Fatal(err)
	}
	rank, err := MapShared(r.Path(), MapOptions{GPU: g})
	if err != nil {
		t.Fatal(err)
	}
	if len(g.registered) != 2 || m.GPURegistered.Load() != 1 {
		t.Fatalf("registered %d mappings (metric %d), want agent's and rank's", len(g.registered), m.GPURegistered.Load())
	}
	if err := rank.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if len(g.registered) != 0 || m.GPURegistered.Load() != 0 {
		t.Fatalf("%d mappings still registered after Close", len(g.registered))
	}
}

func TestAdoptAfterRestart(t *testing.T) {
	b, err := NewBudget(BudgetConfig{Cap: Cap{Bytes: 1 << 20}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	a := newAlloc(t, Config{Budget: b})
	path := filepath.Join(t.TempDir(), "arena")
	r, err := a.Create(path, 1<<20, Self())
	if err != nil {
		t.Fatal(err)
	}
	copy(r.Bytes(), "before the restart")
	r.Close()
	if b.InUse() != 0 {
		t.Fatalf("Close kept budget: %d", b.InUse())
	}
	again, err := a.Adopt(path)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Remove()
	if !bytes.HasPrefix(again.Bytes(), []byte("before the restart")) || b.InUse() != 1<<20 {
		t.Fatalf("adopted arena: content or budget (%d) wrong", b.InUse())
	}
}

func TestHugeTLBFS(t *testing.T) {
	if _, err := NewAllocator(Config{HugeTLBDir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "not a hugetlbfs mount") {
		t.Fatalf("plain directory as hugetlbfs: %v", err)
	}
	huge := mountFS(t, "hugetlbfs", "")
	store := t.TempDir()
	a := newAlloc(t, Config{HugeTLBDir: huge})

	const knob = "/proc/sys/vm/nr_hugepages"
	orig, err := os.ReadFile(knob)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := strconv.Atoi(strings.TrimSpace(string(orig))); n == 0 {
		_, err := a.Create(filepath.Join(store, "none"), 1<<20, Self())
		if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "vm.nr_hugepages") {
			t.Fatalf("Create without huge pages = %v; want ENOSPC naming vm.nr_hugepages", err)
		}
	}
	// Lend the pool two pages for the rest of the test.
	n, _ := strconv.Atoi(strings.TrimSpace(string(orig)))
	if err := os.WriteFile(knob, []byte(strconv.Itoa(n+2)), 0o644); err != nil {
		t.Fatalf("raise %s: %v", knob, err)
	}
	t.Cleanup(func() { os.WriteFile(knob, orig, 0o644) })

	path := filepath.Join(store, "arena")
	r, err := a.Create(path, 1<<20, Self())
	if err != nil {
		t.Fatal(err)
	}
	if r.Size() != 2<<20 {
		t.Fatalf("size %d, want one 2 MiB huge page", r.Size())
	}
	if target, err := os.Readlink(path); err != nil || target != filepath.Join(huge, path) || target != r.FilePath() {
		t.Fatalf("store path should link to its path below the hugetlbfs mount: %q (FilePath %q) %v", target, r.FilePath(), err)
	}
	copy(r.Bytes(), "huge")
	rank, err := MapShared(path, MapOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if string(rank.Bytes()[:4]) != "huge" {
		t.Fatal("rank mapping of hugetlbfs arena does not see the agent's bytes")
	}
	rank.Close()
	target, _ := os.Readlink(path)
	if err := r.Remove(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path, target} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Fatalf("Remove left %s", p)
		}
	}
}

func TestMapByDescriptorOverSCMRights(t *testing.T) {
	a := newAlloc(t, Config{})
	ag, err := a.Create(filepath.Join(t.TempDir(), "arena"), 1<<20, Self())
	if err != nil {
		t.Fatal(err)
	}
	defer ag.Remove()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	// The agent sends the arena's descriptor; the rank receives its own.
	if err := unix.Sendmsg(fds[0], []byte("arena"), unix.UnixRights(int(ag.File().Fd())), nil, 0); err != nil {
		t.Fatal(err)
	}
	buf, oob := make([]byte, 16), make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := unix.Recvmsg(fds[1], buf, oob, 0)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		t.Fatalf("control messages %v: %v", msgs, err)
	}
	got, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(got) != 1 {
		t.Fatalf("rights %v: %v", got, err)
	}
	rank, err := MapSharedFD(got[0], MapOptions{})
	unix.Close(got[0]) // MapSharedFD keeps its own duplicate
	if err != nil {
		t.Fatal(err)
	}
	defer rank.Close()
	copy(rank.Bytes()[4096:], "sent over SCM_RIGHTS")
	if !bytes.HasPrefix(ag.Bytes()[4096:], []byte("sent over SCM_RIGHTS")) || rank.Size() != ag.Size() {
		t.Fatal("the rank's mapping from a passed descriptor is not the agent's arena")
	}
}

// vmFlags returns the VmFlags of the mapping that starts at b, from
// /proc/self/smaps.
func vmFlags(t *testing.T, b []byte) []string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	start := strconv.FormatUint(uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))), 16)
	in := false
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if lo, _, ok := strings.Cut(f[0], "-"); ok && !strings.HasSuffix(f[0], ":") {
			in = strings.TrimLeft(lo, "0") == start
			continue
		}
		if in && f[0] == "VmFlags:" {
			return f[1:]
		}
	}
	t.Fatalf("no mapping at %#x in /proc/self/smaps", uintptr(unsafe.Pointer(unsafe.SliceData(b))))
	return nil
}

// TestTransparentHugePages: an arena on tmpfs is advised MADV_HUGEPAGE
// (VmFlags "hg") and counted by default; NoHugePages leaves it alone.
func TestTransparentHugePages(t *testing.T) {
	if _, err := os.Stat("/sys/kernel/mm/transparent_hugepage"); errors.Is(err, os.ErrNotExist) {
		t.Skip("this kernel has no transparent huge pages (/sys/kernel/mm/transparent_hugepage is missing): nothing to advise")
	}
	tests := []struct {
		name    string
		noHuge  bool
		arenas  int64
		advised bool
	}{
		{"default", false, 1, true},
		{"NoHugePages", true, 0, false},
	}
	store := mountFS(t, "tmpfs", "size=16m")
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := new(Metrics)
			a := newAlloc(t, Config{NoHugePages: tc.noHuge, NoPin: true, Metrics: m})
			r, err := a.Create(filepath.Join(store, tc.name), 4<<20, Self())
			if err != nil {
				t.Fatal(err)
			}
			defer r.Remove()
			flags := vmFlags(t, r.Bytes())
			if got := m.HugePageArenas.Load(); got != tc.arenas {
				t.Errorf("HugePageArenas = %d, want %d", got, tc.arenas)
			}
			if got := slices.Contains(flags, "hg"); got != tc.advised {
				t.Errorf("VmFlags %v: advised huge pages (hg) = %v, want %v", flags, got, tc.advised)
			}
		})
	}
}

// TestHugeTLBFSForeignDirs: the hugetlbfs mount is 1777, so another user
// (reft-bob) can make names in it before the job's agent does (issue 14,
// finding 7). A directory on the arena's way that is not the owner's own,
// or is a symlink, is refused with a message naming it, and nothing is
// created through it.
func TestHugeTLBFSForeignDirs(t *testing.T) {
	const alice, bob = 1000, 4242
	tests := []struct {
		name  string
		plant func(t *testing.T, huge, outside, store string)
	}{
		{"uid directory of another user", func(t *testing.T, huge, outside, store string) {
			for _, d := range []string{filepath.Join(huge, strconv.Itoa(alice)), filepath.Join(huge, strings.Split(store, "/")[1])} {
				os.Mkdir(d, 0o777)
				os.Chmod(d, 0o777)
				os.Chown(d, bob, bob)
			}
		}},
		// (hugetlbfs refuses symlinks, EINVAL; the code refuses them too)
		{"uid name taken by a file", func(t *testing.T, huge, outside, store string) {
			for _, p := range []string{filepath.Join(huge, strconv.Itoa(alice)), filepath.Join(huge, strings.Split(store, "/")[1])} {
				if err := unix.Mkfifo(p, 0o666); err != nil {
					t.Fatal(err)
				}
				os.Chown(p, bob, bob)
			}
		}},
		{"uid directory others may write", func(t *testing.T, huge, outside, store string) {
			for _, d := range []string{filepath.Join(huge, strconv.Itoa(alice)), filepath.Join(huge, strings.Split(store, "/")[1])} {
				os.Mkdir(d, 0o777)
				os.Chmod(d, 0o777)
				os.Chown(d, alice, alice)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			huge := mountFS(t, "hugetlbfs", "mode=1777")
			outside, store := t.TempDir(), t.TempDir()
			tc.plant(t, huge, outside, store)
			a := newAlloc(t, Config{HugeTLBDir: huge})
			_, err := a.Create(filepath.Join(store, "arena-0"), 1<<20, Owner{UID: alice, GID: alice})
			if err == nil || !strings.Contains(err.Error(), "refusing hugetlbfs directory") {
				t.Fatalf("Create = %v; want it to refuse the planted directory", err)
			}
			var left []string
			filepath.Walk(huge, func(p string, _ os.FileInfo, _ error) error { left = append(left, p); return nil })
			if len(left) != 3 {
				t.Errorf("Create left %v on the mount; want only the planted names", left)
			}
		})
	}
}
