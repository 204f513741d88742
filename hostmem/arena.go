package hostmem

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// HostRegistrar registers host memory with a GPU runtime so device-to-host
// copies DMA straight into it. hostmem/cuda provides one; nil means none.
type HostRegistrar interface {
	Register(b []byte) error
	Unregister(b []byte) error
}

// Owner is the user and group that arena files and directories belong to:
// the job's user. -1 leaves the creating process's ids.
type Owner struct{ UID, GID int }

// Self is the calling process's own ids.
func Self() Owner { return Owner{UID: os.Geteuid(), GID: os.Getegid()} }

// Config configures an Allocator.
type Config struct {
	Budget      *Budget // nil: no cap (rank side, tests)
	NoPin       bool    // do not mlock
	NoHugePages bool    // do not advise transparent huge pages
	// HugeTLBDir is a hugetlbfs mount. When set, arena files live there
	// (under the same absolute path as asked for) and the store path is a
	// symlink to them.
	HugeTLBDir string
	GPU        HostRegistrar
	Log        zerolog.Logger
	Metrics    *Metrics // nil: a fresh one

	// memlockLimit overrides getrlimit(RLIMIT_MEMLOCK), for tests.
	memlockLimit func() (uint64, error)
}

// Allocator creates and adopts arenas for the agent.
type Allocator struct {
	cfg      Config
	metrics  *Metrics
	hugeSize int64 // page size of HugeTLBDir, 0 without it
	pinWarn  sync.Once
	gpuWarn  sync.Once
}

// lockedBytes is what this process has mlocked through hostmem:
// RLIMIT_MEMLOCK counts per process, not per allocator.
var lockedBytes atomic.Int64

const hugetlbfsMagic = 0x958458f6

// NewAllocator checks the configuration (a HugeTLBDir must be a hugetlbfs
// mount) and returns an allocator.
func NewAllocator(cfg Config) (*Allocator, error) {
	a := &Allocator{cfg: cfg, metrics: cfg.Metrics}
	if a.metrics == nil {
		a.metrics = new(Metrics)
	}
	if cfg.HugeTLBDir != "" {
		var st unix.Statfs_t
		if err := unix.Statfs(cfg.HugeTLBDir, &st); err != nil {
			return nil, fmt.Errorf("hostmem: hugetlbfs directory %s: %w; mount one (mount -t hugetlbfs none DIR) or unset [store] hugetlbfs in reft.toml", cfg.HugeTLBDir, err)
		}
		if int64(st.Type) != hugetlbfsMagic {
			return nil, fmt.Errorf("hostmem: %s is not a hugetlbfs mount (filesystem type %#x); mount one (mount -t hugetlbfs none DIR) or unset [store] hugetlbfs in reft.toml", cfg.HugeTLBDir, st.Type)
		}
		a.hugeSize = int64(st.Bsize)
	}
	return a, nil
}

// Metrics returns the allocator's metrics.
func (a *Allocator) Metrics() *Metrics { return a.metrics }

// Budget is the memory budget arenas are charged to; nil: none.
func (a *Allocator) Budget() *Budget { return a.cfg.Budget }

// Arena is one shared mapping of an arena file.
type Arena struct {
	path    string // as asked for (a symlink when on hugetlbfs)
	target  string // the real file, when it differs from path
	f       *os.File
	mem     []byte
	size    int64
	pinned  bool
	charged int64
	gpu     HostRegistrar
	a       *Allocator // nil for a rank-side mapping
	closed  bool
}

// Bytes is the mapped arena, len == Size().
func (r *Arena) Bytes() []byte { return r.mem[:r.size] }

// Size is the arena's length in bytes (page-rounded).
func (r *Arena) Size() int64 { return r.size }

// Path is the arena's path in the store.
func (r *Arena) Path() string { return r.path }

// FilePath is the arena file itself: on hugetlbfs the file the store's
// link names, else Path. Ranks map this one: they open it with O_NOFOLLOW.
func (r *Arena) FilePath() string {
	if r.target != "" {
		return r.target
	}
	return r.path
}

// File is the open arena file, e.g. to pass to a rank with SCM_RIGHTS.
func (r *Arena) File() *os.File { return r.f }

// Pinned says whether the mapping is locked in memory.
func (r *Arena) Pinned() bool { return r.pinned }

func roundUp(n, to int64) int64 { return (n + to - 1) / to * to }

// Create makes a new arena file of at least size bytes at path (which must
// not exist), owned by o with mode 0600, charges it to the budget, reserves
// all its pages, and maps, advises, pins and registers it. A full tmpfs or
// hugetlbfs pool fails here with an error wrapping unix.ENOSPC, and a full
// budget with a *BudgetError; nothing is left behind either way.
func (a *Allocator) Create(path string, size int64, o Owner) (_ *Arena, err error) {
	if size <= 0 {
		return nil, fmt.Errorf("hostmem: arena %s: size %d must be positive", path, size)
	}
	r := &Arena{path: path, a: a, gpu: a.cfg.GPU}
	file := path
	if a.hugeSize > 0 {
		r.size = roundUp(size, a.hugeSize)
		// <mount><store path>: under the plugin's root-made (0755)
		// <mount><tmpfs_root>/<uid>/, the user's own from there down
		// (docs/SECURITY.md). The mount may be world-writable (1777), so
		// another user may have made any name in it first: every existing
		// directory on the way must be root's or the owner's, writable by
		// nobody else, or it is refused.
		uid := o.UID
		if uid < 0 {
			uid = os.Geteuid()
		}
		file = filepath.Join(a.cfg.HugeTLBDir, path)
		r.target = file
		if err := mkdirOwned(a.cfg.HugeTLBDir, filepath.Dir(file), o, uid); err != nil {
			return nil, err
		}
	} else {
		r.size = roundUp(size, int64(os.Getpagesize()))
	}
	if b := a.cfg.Budget; b != nil {
		if err := b.Reserve(r.size); err != nil {
			return nil, fmt.Errorf("hostmem: arena %s: %w", path, err)
		}
		r.charged = r.size
	}
	defer func() {
		if err != nil {
			r.cleanup()
			os.Remove(file)
			if r.target != "" {
				os.Remove(path)
			}
		}
	}()
	r.f, err = os.OpenFile(file, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("hostmem: create arena: %w", err)
	}
	if err := setOwner(r.f, o); err != nil {
		return nil, err
	}
	if err := unix.Fallocate(int(r.f.Fd()), 0, 0, r.size); err != nil {
		return nil, fmt.Errorf("hostmem: reserve %s for arena %s: %w (%s)", FormatBytes(r.size), file, err, a.spaceHint(filepath.Dir(file), err))
	}
	if r.target != "" {
		if err := os.Symlink(r.target, path); err != nil {
			return nil, fmt.Errorf("hostmem: link arena %s to its hugetlbfs file: %w", path, err)
		}
		if o.UID >= 0 && o.UID != os.Geteuid() {
			if err := os.Lchown(path, o.UID, o.GID); err != nil {
				return nil, fmt.Errorf("hostmem: give arena link %s to uid %d: %w", path, o.UID, err)
			}
		}
	}
	if err := r.mapFile(false); err != nil {
		return nil, err
	}
	a.setup(r)
	return r, nil
}

// Adopt maps an arena file that already exists, e.g. one found by an agent
// re-indexing the store after a restart. Its size is charged to the budget
// without refusal: that memory is in use whether or not it is mapped.
func (a *Allocator) Adopt(path string) (*Arena, error) {
	r := &Arena{path: path, a: a, gpu: a.cfg.GPU}
	if t, err := os.Readlink(path); err == nil {
		r.target = t
	}
	var err error
	if r.f, err = os.OpenFile(path, os.O_RDWR, 0); err != nil {
		return nil, fmt.Errorf("hostmem: adopt arena: %w", err)
	}
	st, err := r.f.Stat()
	if err != nil || st.Size() <= 0 {
		r.f.Close()
		return nil, fmt.Errorf("hostmem: adopt arena %s: empty or unreadable (%v)", path, err)
	}
	r.size = st.Size()
	if err := r.mapFile(false); err != nil {
		r.f.Close()
		return nil, err
	}
	if b := a.cfg.Budget; b != nil {
		b.Adopt(r.size)
		r.charged = r.size
	}
	a.setup(r)
	return r, nil
}

// ErrNotArena is wrapped by AdoptOwned's refusals of a file that is not
// what Create makes (type, link, owner, links).
var ErrNotArena = errors.New("not an arena file")

// AdoptOwned adopts an arena file left by an earlier agent in a directory
// of the user's, as Adopt does, after checking that it is what Create
// makes: without hugetlbfs a regular file; with it a link whose target is
// exactly the mount's file Create names for path, itself a regular file.
// The file is opened with O_NOFOLLOW and must be uid's (when uid >= 0)
// with one link. Anything else is refused with an error saying what it
// is; the caller decides what to do with it (Discard).
func (a *Allocator) AdoptOwned(path string, uid int) (*Arena, error) {
	file, err := a.arenaFile(path)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(file, os.O_RDWR|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("hostmem: adopt arena: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("hostmem: adopt arena %s: %w", file, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		err = fmt.Errorf("not a regular file (type %#o)", st.Mode&unix.S_IFMT)
	case uid >= 0 && int(st.Uid) != uid:
		err = fmt.Errorf("owned by uid %d, not the job's user %d", st.Uid, uid)
	case st.Nlink != 1:
		err = fmt.Errorf("has %d hard links, an arena has one", st.Nlink)
	case st.Size <= 0:
		err = fmt.Errorf("is empty")
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("hostmem: adopt arena %s: %w: %w", file, ErrNotArena, err)
	}
	r := &Arena{path: path, f: f, size: st.Size, a: a, gpu: a.cfg.GPU}
	if file != path {
		r.target = file
	}
	if err := r.mapFile(false); err != nil {
		f.Close()
		return nil, err
	}
	if b := a.cfg.Budget; b != nil {
		b.Adopt(r.size)
		r.charged = r.size
	}
	a.setup(r)
	return r, nil
}

// arenaFile is the file an arena at path is, checked without following
// anything: path itself when it is a regular file and there is no
// hugetlbfs; the mount's file when path is a link naming exactly it.
func (a *Allocator) arenaFile(path string) (string, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return "", fmt.Errorf("hostmem: adopt arena: %w", &os.PathError{Op: "lstat", Path: path, Err: err})
	}
	typ := st.Mode & unix.S_IFMT
	if a.hugeSize == 0 {
		if typ != unix.S_IFREG {
			return "", fmt.Errorf("hostmem: adopt arena %s: not a regular file (type %#o; a symlink without [store] hugetlbfs is never an arena): %w", path, typ, ErrNotArena)
		}
		return path, nil
	}
	want := filepath.Join(a.cfg.HugeTLBDir, path)
	if typ != unix.S_IFLNK {
		return "", fmt.Errorf("hostmem: adopt arena %s: not a link to the hugetlbfs file %s (type %#o): %w", path, want, typ, ErrNotArena)
	}
	if t, err := os.Readlink(path); err != nil || t != want {
		return "", fmt.Errorf("hostmem: adopt arena %s: links to %q, not to its hugetlbfs file %s (%v): %w", path, t, want, err, ErrNotArena)
	}
	return want, nil
}

// Discard removes what an earlier agent left at path in a directory of
// the user's: the name itself (a link is unlinked, never followed), and,
// with hugetlbfs, the mount's file Create would have made for path when
// path links exactly to it (a link to anything else removes only the
// link).
func (a *Allocator) Discard(path string) error {
	var errs []error
	if a.hugeSize > 0 {
		want := filepath.Join(a.cfg.HugeTLBDir, path)
		if t, err := os.Readlink(path); err == nil && t == want {
			if err := os.Remove(want); err != nil && !os.IsNotExist(err) {
				errs = append(errs, err)
			}
		}
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("hostmem: discard %s: %w", path, err)
	}
	return nil
}

func (a *Allocator) spaceHint(dir string, err error) string {
	if !errors.Is(err, unix.ENOSPC) {
		return "the store's filesystem must support fallocate (tmpfs or hugetlbfs)"
	}
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil {
		return "the store is full"
	}
	if a.hugeSize > 0 {
		return fmt.Sprintf("hugetlbfs %s has %d free huge pages of %s; raise vm.nr_hugepages", a.cfg.HugeTLBDir, st.Bfree, FormatBytes(a.hugeSize))
	}
	return fmt.Sprintf("the store's tmpfs has %s free of %s; enlarge the mount or protect less state",
		FormatBytes(int64(st.Bavail)*st.Bsize), FormatBytes(int64(st.Blocks)*st.Bsize))
}

// mapFile maps r.f shared and populated, so neither the agent nor the rank
// takes page faults during a snapshot copy.
func (r *Arena) mapFile(readOnly bool) error {
	prot := unix.PROT_READ | unix.PROT_WRITE
	if readOnly {
		prot = unix.PROT_READ
	}
	mem, err := unix.Mmap(int(r.f.Fd()), 0, int(r.size), prot, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("hostmem: map arena %s (%s): %w", r.path, FormatBytes(r.size), err)
	}
	r.mem = mem
	return nil
}

// setup advises huge pages, pins and registers a fresh agent mapping.
func (a *Allocator) setup(r *Arena) {
	a.metrics.ArenaBytes.Add(r.size)
	if a.hugeSize > 0 {
		a.metrics.HugePageArenas.Add(1)
	} else if !a.cfg.NoHugePages {
		// Takes effect on tmpfs when shmem_enabled allows "advise"; an
		// error only means the kernel has no THP, which is fine.
		if unix.Madvise(r.mem, unix.MADV_HUGEPAGE) == nil {
			a.metrics.HugePageArenas.Add(1)
		}
	}
	if !a.cfg.NoPin {
		a.pin(r)
	}
	r.register(a.metrics, a.cfg.Log, &a.gpuWarn)
}

func (a *Allocator) limit() (uint64, error) {
	if a.cfg.memlockLimit != nil {
		return a.cfg.memlockLimit()
	}
	var rl unix.Rlimit
	err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl)
	return rl.Cur, err
}

func (a *Allocator) pin(r *Arena) {
	lim, err := a.limit()
	if err == nil && lim != unix.RLIM_INFINITY && uint64(lockedBytes.Load()+r.size) > lim {
		a.unpinned(r, lim, nil)
		return
	}
	if err := unix.Mlock(r.mem); err != nil {
		a.unpinned(r, lim, err)
		return
	}
	lockedBytes.Add(r.size)
	a.metrics.PinnedBytes.Add(r.size)
	r.pinned = true
}

// unpinned counts an arena left unpinned and warns once per allocator.
func (a *Allocator) unpinned(r *Arena, lim uint64, err error) {
	a.metrics.UnpinnedArenas.Add(1)
	a.pinWarn.Do(func() {
		limit := "unlimited"
		if lim != unix.RLIM_INFINITY {
			limit = FormatBytes(int64(lim))
		}
		ev := a.cfg.Log.Warn().Str("rlimit_memlock", limit).Int64("arena_bytes", r.size).
			Int64("locked_bytes", lockedBytes.Load())
		if err != nil {
			ev = ev.Err(err)
		}
		ev.Msgf("hostmem: snapshot arenas are not pinned: RLIMIT_MEMLOCK is %s, too low to lock %s more; "+
			"snapshots still work but the kernel may swap them out. Raise the limit: LimitMEMLOCK=infinity in slurmd's systemd unit "+
			"(Slurm propagates it to jobs), or 'ulimit -l unlimited' before the job starts", limit, FormatBytes(r.size))
	})
}

func (r *Arena) register(m *Metrics, log zerolog.Logger, once *sync.Once) {
	if r.gpu == nil {
		return
	}
	if err := r.gpu.Register(r.mem); err != nil {
		r.gpu = nil
		once.Do(func() {
			log.Warn().Err(err).Msg("hostmem: GPU runtime refused to register a snapshot arena; device-to-host copies will stage through a bounce buffer")
		})
		return
	}
	if m != nil {
		m.GPURegistered.Add(1)
	}
}

// cleanup undoes whatever part of the setup happened; safe to call twice.
func (r *Arena) cleanup() error {
	if r.closed {
		return nil
	}
	r.closed = true
	var errs []error
	if r.mem != nil {
		if r.gpu != nil {
			errs = append(errs, r.gpu.Unregister(r.mem))
			if r.a != nil {
				r.a.metrics.GPURegistered.Add(-1)
			}
		}
		if r.pinned {
			lockedBytes.Add(-r.size)
			r.a.metrics.PinnedBytes.Add(-r.size)
		}
		if r.a != nil {
			r.a.metrics.ArenaBytes.Add(-r.size)
		}
		errs = append(errs, unix.Munmap(r.mem))
		r.mem = nil
	}
	if r.f != nil {
		errs = append(errs, r.f.Close())
	}
	if r.charged > 0 {
		r.a.cfg.Budget.Release(r.charged)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("hostmem: close arena %s: %w", r.path, err)
	}
	return nil
}

// Close unmaps the arena and returns its budget. The file and its bytes
// stay in the store.
func (r *Arena) Close() error { return r.cleanup() }

// Remove closes the arena and deletes its file, freeing the memory.
func (r *Arena) Remove() error {
	err := r.cleanup()
	if r.target != "" {
		if e := os.Remove(r.target); e != nil && !os.IsNotExist(e) {
			err = errors.Join(err, e)
		}
	}
	if e := os.Remove(r.path); e != nil && !os.IsNotExist(e) {
		err = errors.Join(err, e)
	}
	return err
}

// MapOptions configures a rank-side mapping.
type MapOptions struct {
	GPU      HostRegistrar
	ReadOnly bool
	Log      zerolog.Logger
}

// MapShared maps an arena the agent created, by path. The rank writes
// snapshot bytes into Bytes() directly.
func MapShared(path string, o MapOptions) (*Arena, error) {
	flag := os.O_RDWR
	if o.ReadOnly {
		flag = os.O_RDONLY
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return nil, fmt.Errorf("hostmem: open arena: %w", err)
	}
	return mapOpen(f, path, o)
}

// MapSharedFD maps an arena from a descriptor received with SCM_RIGHTS. It
// duplicates fd; the caller keeps and closes its own.
func MapSharedFD(fd int, o MapOptions) (*Arena, error) {
	nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("hostmem: duplicate arena descriptor %d: %w", fd, err)
	}
	return mapOpen(os.NewFile(uintptr(nfd), fmt.Sprintf("fd:%d", fd)), fmt.Sprintf("fd:%d", fd), o)
}

func mapOpen(f *os.File, name string, o MapOptions) (*Arena, error) {
	st, err := f.Stat()
	if err != nil || st.Size() <= 0 {
		f.Close()
		return nil, fmt.Errorf("hostmem: arena %s is empty or unreadable (%v); is it still being created?", name, err)
	}
	r := &Arena{path: name, f: f, size: st.Size(), gpu: o.GPU}
	if err := r.mapFile(o.ReadOnly); err != nil {
		f.Close()
		return nil, err
	}
	var once sync.Once
	r.register(nil, o.Log, &once)
	return r, nil
}

// mkdirOwned makes dir and its missing parents below base, 0700 and owned
// by o. An existing one must be a real directory (no symlink) of root (the
// plugin's) or uid that nobody else may write: base may be a
// world-writable hugetlbfs mount, where
// another user could have made the name first to watch or swap the
// arenas. Such a directory is refused, never used.
func mkdirOwned(base, dir string, o Owner, uid int) error {
	if dir == base || dir == "/" || dir == "." {
		return nil
	}
	if err := mkdirOwned(base, filepath.Dir(dir), o, uid); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err == nil {
		if o.UID >= 0 && o.UID != os.Geteuid() {
			if err := os.Lchown(dir, o.UID, o.GID); err != nil {
				return fmt.Errorf("hostmem: give %s to uid %d: %w", dir, o.UID, err)
			}
		}
		return nil
	} else if !os.IsExist(err) {
		return fmt.Errorf("hostmem: make directory: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("hostmem: inspect %s: %w", dir, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || (int(st.Uid) != uid && st.Uid != 0) || st.Mode&0o022 != 0 {
		return fmt.Errorf("hostmem: refusing hugetlbfs directory %s: it must be a directory of root or uid %d that nobody else may write, "+
			"but is uid %d mode %#o (type %#o); another user may have made it to watch or swap this user's arenas: an administrator must remove it",
			dir, uid, st.Uid, st.Mode&0o7777, st.Mode&unix.S_IFMT)
	}
	return nil
}

func setOwner(f *os.File, o Owner) error {
	// Explicit, so a restrictive or lax umask cannot change the mode.
	if err := f.Chmod(0o600); err != nil {
		return fmt.Errorf("hostmem: chmod arena: %w", err)
	}
	if o.UID >= 0 && o.UID != os.Geteuid() {
		if err := f.Chown(o.UID, o.GID); err != nil {
			return fmt.Errorf("hostmem: give arena %s to uid %d (the agent must run as root or as that user): %w", f.Name(), o.UID, err)
		}
	}
	return nil
}
