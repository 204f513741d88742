package tmpfs

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Garbage collection runs as root (`reft gc`, the job epilog) on
// directories that users own and write. So it never resolves a user's
// path: every directory is opened relative to its verified parent with
// O_NOFOLLOW and checked to belong to the job's user, entries are removed
// with unlinkat on those descriptors, a hugetlbfs link is followed only to
// a regular file of the same user below the configured mount, and the lock
// is opened only when it is a regular file of the user's. Removing a name
// from a directory that only its user can write gives root's caller nothing
// that user could not do; everything else is refused and reported.

// JobDir is one job's directory under a store root, as garbage collection
// sees it.
type JobDir struct {
	Path  string
	Root  string // the store root it was listed under
	UID   int
	JobID string
	// Problem, when set, is why the directory must not be touched (e.g. it
	// belongs to another user than its name says); Remove refuses it.
	Problem error
}

// JobPath is where job's store lives under root for the user uid:
// <root>/<uid>/<jobid>. Whoever prepares it ahead of the agent (the SPANK
// plugin, as root) must make both <uid> and <jobid> 0700 and owned by uid.
func JobPath(root string, uid int, job string) string {
	return filepath.Join(root, strconv.Itoa(uid), job)
}

// maxDepth bounds the walk below a job directory: the store nests four
// levels (r<rank>/<shard>/<generation>/<file>); a deeper tree is a user's
// doing, refused rather than recursed into without end.
const maxDepth = 8

const dirFlags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC

// openRoot opens the store root itself (an administrator's path).
func openRoot(root string) (int, error) {
	fd, err := unix.Open(root, dirFlags, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: root, Err: err}
	}
	return fd, nil
}

// openOwnedDir opens name below dirfd as a directory, never through a
// symlink, and checks that uid owns it and that nobody else may write it.
func openOwnedDir(dirfd int, name string, uid int, path string) (int, error) {
	fd, err := unix.Openat(dirfd, name, dirFlags, 0)
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		return -1, fmt.Errorf("%s is a symlink or not a directory: %w", path, ErrForeign)
	}
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if int(st.Uid) != uid || st.Mode&0o022 != 0 {
		unix.Close(fd)
		return -1, fmt.Errorf("%s is owned by uid %d with mode %#o, not by uid %d and writable only by it: %w", path, st.Uid, st.Mode&0o7777, uid, ErrForeign)
	}
	return fd, nil
}

// ErrForeign says a directory or file is not what its place in the store
// promises (owner, type or mode), so garbage collection leaves it alone.
var ErrForeign = errors.New("not the job user's own; left alone")

// readNames lists a directory by descriptor (dirfd stays open).
func readNames(dirfd int, path string) ([]string, error) {
	dup, err := unix.FcntlInt(uintptr(dirfd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("tmpfs: list %s: %w", path, err)
	}
	f := os.NewFile(uintptr(dup), path)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("tmpfs: list %s: %w", path, err)
	}
	slices.Sort(names)
	return names, nil
}

// ListJobDirs lists <root>/<uid>/<jobid> directories, for every uid or
// only for uid when uid >= 0. A directory that is not its user's own (a
// <uid> directory of another owner, a symlink, a job directory that
// others may write) is listed with its Problem set.
func ListJobDirs(root string, uid int) ([]JobDir, error) {
	rfd, err := openRoot(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("tmpfs: list store root: %w", err)
	}
	defer unix.Close(rfd)
	users, err := readNames(rfd, root)
	if err != nil {
		return nil, err
	}
	var out []JobDir
	for _, u := range users {
		id, err := strconv.Atoi(u)
		if err != nil || id < 0 || strconv.Itoa(id) != u || (uid >= 0 && id != uid) {
			continue
		}
		upath := filepath.Join(root, u)
		var st unix.Stat_t
		if unix.Fstatat(rfd, u, &st, unix.AT_SYMLINK_NOFOLLOW) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR && st.Mode&unix.S_IFMT != unix.S_IFLNK {
			continue // a plain file is no user directory
		}
		ufd, err := openOwnedDir(rfd, u, id, upath)
		if err != nil {
			out = append(out, JobDir{Path: upath, Root: root, UID: id, Problem: err})
			continue
		}
		jobs, err := readNames(ufd, upath)
		if err != nil {
			unix.Close(ufd)
			return nil, fmt.Errorf("tmpfs: list jobs of uid %d: %w", id, err)
		}
		for _, j := range jobs {
			if !nameRE.MatchString(j) || j == "." || j == ".." {
				continue
			}
			d := JobDir{Path: filepath.Join(upath, j), Root: root, UID: id, JobID: j}
			if err := unix.Fstatat(ufd, j, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				continue // gone meanwhile
			}
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFDIR:
				if int(st.Uid) != id || st.Mode&0o022 != 0 {
					d.Problem = fmt.Errorf("%s is owned by uid %d with mode %#o, not by uid %d and writable only by it: %w", d.Path, st.Uid, st.Mode&0o7777, id, ErrForeign)
				}
			case unix.S_IFLNK:
				d.Problem = fmt.Errorf("%s is a symlink: %w", d.Path, ErrForeign)
			default:
				continue
			}
			out = append(out, d)
		}
		unix.Close(ufd)
	}
	slices.SortFunc(out, func(a, b JobDir) int { return cmp.Compare(a.Path, b.Path) })
	return out, nil
}

// open opens the job directory through verified descriptors: the root,
// then <uid> and <jobid>, each owned by the user. The caller closes both.
func (d JobDir) open() (ufd, jfd int, err error) {
	if d.Problem != nil {
		return -1, -1, fmt.Errorf("tmpfs: %w", d.Problem)
	}
	root := d.Root
	if root == "" {
		root = filepath.Dir(filepath.Dir(d.Path))
	}
	rfd, err := openRoot(root)
	if err != nil {
		return -1, -1, fmt.Errorf("tmpfs: %w", err)
	}
	defer unix.Close(rfd)
	u := strconv.Itoa(d.UID)
	if ufd, err = openOwnedDir(rfd, u, d.UID, filepath.Join(root, u)); err != nil {
		return -1, -1, fmt.Errorf("tmpfs: %w", err)
	}
	if jfd, err = openOwnedDir(ufd, d.JobID, d.UID, d.Path); err != nil {
		unix.Close(ufd)
		return -1, -1, fmt.Errorf("tmpfs: %w", err)
	}
	return ufd, jfd, nil
}

// Usage is the bytes the job's files hold, arena files on hugetlbfs
// included (followed under the same rules as Remove), and when anything in
// the directory last changed (zero when it cannot be read).
func (d JobDir) Usage(hugetlbfs string) (int64, time.Time) {
	ufd, jfd, err := d.open()
	if err != nil {
		return 0, time.Time{}
	}
	defer unix.Close(ufd)
	defer unix.Close(jfd)
	w := walker{uid: d.UID, huge: hugetlbfs, dryRun: true}
	var st unix.Stat_t
	if unix.Fstat(jfd, &st) == nil {
		w.touch(&st)
	}
	w.walk(jfd, d.Path, 0)
	return w.bytes, w.newest
}

// Remove deletes the job's directory, and the hugetlbfs files its arenas
// link to (only regular files of the job's user below the mount hugetlbfs,
// "" for none), unless a live agent holds the job's lock (ErrLocked). The
// lock is held during removal, so no agent starts into a half-removed
// store. Anything that is not the user's own is left in place and named
// in the error.
func (d JobDir) Remove(hugetlbfs string) error {
	ufd, jfd, err := d.open()
	if err != nil {
		return err
	}
	defer unix.Close(ufd)
	defer unix.Close(jfd)
	lfd, err := openLock(jfd, d.UID)
	if err != nil {
		return fmt.Errorf("tmpfs: %s: %w", d.Path, err)
	}
	if lfd >= 0 {
		defer unix.Close(lfd)
		if err := unix.Flock(lfd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
			return fmt.Errorf("tmpfs: %s: %w", d.Path, ErrLocked)
		}
	}
	w := walker{uid: d.UID, huge: hugetlbfs}
	w.walk(jfd, d.Path, 0)
	if err := unix.Unlinkat(ufd, d.JobID, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		w.errs = append(w.errs, &os.PathError{Op: "remove", Path: d.Path, Err: err})
	}
	if err := errors.Join(w.errs...); err != nil {
		return fmt.Errorf("tmpfs: remove %s: %w", d.Path, err)
	}
	// The uid directory, if now empty; through the root's descriptor, and
	// only a directory (unlinkat with AT_REMOVEDIR removes nothing else).
	if rfd, err := openRoot(d.Root); err == nil {
		unix.Unlinkat(rfd, strconv.Itoa(d.UID), unix.AT_REMOVEDIR)
		unix.Close(rfd)
	}
	return nil
}

// openLock opens <job>/.lock for flock: only a regular file of uid, never
// through a symlink, never blocking (a FIFO is not opened at all). It
// returns -1 when there is no usable lock: then no agent holds one.
func openLock(jfd, uid int) (int, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(jfd, LockName, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return -1, nil
		}
		return -1, fmt.Errorf("stat lock: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != uid {
		return -1, nil // an agent's lock is its user's regular file; this is none, and goes with the rest
	}
	fd, err := unix.Openat(jfd, LockName, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open lock: %w", err)
	}
	var st2 unix.Stat_t
	if err := unix.Fstat(fd, &st2); err != nil || st2.Dev != st.Dev || st2.Ino != st.Ino || st2.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return -1, fmt.Errorf("lock changed while it was opened: %w", ErrForeign)
	}
	return fd, nil
}

// LockName is the agent's lock file in its job directory.
const LockName = ".lock"

// walker removes (or, dryRun, measures) a job directory's contents.
type walker struct {
	uid    int
	huge   string
	dryRun bool
	bytes  int64
	newest time.Time
	errs   []error
}

func (w *walker) touch(st *unix.Stat_t) {
	if t := time.Unix(st.Mtim.Unix()); t.After(w.newest) {
		w.newest = t
	}
}

func (w *walker) walk(dirfd int, path string, depth int) {
	names, err := readNames(dirfd, path)
	if err != nil {
		w.errs = append(w.errs, err)
		return
	}
	for _, name := range names {
		p := filepath.Join(path, name)
		var st unix.Stat_t
		if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if !errors.Is(err, unix.ENOENT) {
				w.errs = append(w.errs, &os.PathError{Op: "stat", Path: p, Err: err})
			}
			continue
		}
		w.touch(&st)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if depth >= maxDepth {
				w.errs = append(w.errs, fmt.Errorf("%s: nested deeper than a store ever is: %w", p, ErrForeign))
				continue
			}
			fd, err := openOwnedDir(dirfd, name, w.uid, p)
			if err != nil {
				w.errs = append(w.errs, err)
				continue
			}
			w.walk(fd, p, depth+1)
			unix.Close(fd)
			w.unlink(dirfd, name, p, unix.AT_REMOVEDIR)
		case unix.S_IFLNK:
			if _, ok := parseArenaName(name); ok {
				w.arenaTarget(dirfd, name, p)
			}
			w.unlink(dirfd, name, p, 0)
		default:
			if st.Mode&unix.S_IFMT == unix.S_IFREG {
				w.bytes += st.Size
			}
			w.unlink(dirfd, name, p, 0)
		}
	}
}

func (w *walker) unlink(dirfd int, name, path string, flags int) {
	if w.dryRun {
		return
	}
	if err := unix.Unlinkat(dirfd, name, flags); err != nil && !errors.Is(err, unix.ENOENT) {
		w.errs = append(w.errs, &os.PathError{Op: "remove", Path: path, Err: err})
	}
}

// arenaTarget removes (measures) the hugetlbfs file an arena link names:
// only a clean absolute path strictly below the configured mount, reached
// with openat2 beneath the mount without symlinks, in a directory of the
// user's that nobody else may write, and only a regular file of the user.
// A link that names anything else is reported and its target left alone.
func (w *walker) arenaTarget(dirfd int, name, path string) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(dirfd, name, buf)
	if err != nil {
		w.errs = append(w.errs, &os.PathError{Op: "readlink", Path: path, Err: err})
		return
	}
	target := string(buf[:n])
	refuse := func(why string) {
		w.errs = append(w.errs, fmt.Errorf("arena link %s -> %s: %s; the target is left alone: %w", path, target, why, ErrForeign))
	}
	if w.huge == "" {
		refuse("no hugetlbfs mount is configured")
		return
	}
	huge := filepath.Clean(w.huge)
	rel, ok := strings.CutPrefix(target, huge+"/")
	if !filepath.IsAbs(target) || filepath.Clean(target) != target || !ok || rel == "" {
		refuse("not a clean path below the hugetlbfs mount " + huge)
		return
	}
	hfd, err := unix.Open(huge, dirFlags, 0)
	if err != nil {
		refuse("cannot open the hugetlbfs mount: " + err.Error())
		return
	}
	defer unix.Close(hfd)
	if !hugetlbfsCheck(hfd) {
		refuse(huge + " is not a hugetlbfs mount")
		return
	}
	pfd := hfd
	if dir := filepath.Dir(rel); dir != "." {
		pfd, err = unix.Openat2(hfd, dir, &unix.OpenHow{
			Flags:   uint64(dirFlags),
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
		})
		if errors.Is(err, unix.ENOENT) {
			return // already gone
		}
		if err != nil {
			refuse("its directory cannot be opened beneath the mount without symlinks: " + err.Error())
			return
		}
		defer unix.Close(pfd)
	}
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil || int(st.Uid) != w.uid || st.Mode&0o022 != 0 {
		refuse(fmt.Sprintf("its directory is not uid %d's own", w.uid))
		return
	}
	base := filepath.Base(rel)
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if !errors.Is(err, unix.ENOENT) {
			refuse(err.Error())
		}
		return
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != w.uid {
		refuse(fmt.Sprintf("not a regular file of uid %d", w.uid))
		return
	}
	w.bytes += st.Size
	w.unlink(pfd, base, target, 0)
}

// hugetlbfsCheck says whether fd is on hugetlbfs; a variable for tests,
// which cannot mount one everywhere.
var hugetlbfsCheck = func(fd int) bool {
	var s unix.Statfs_t
	return unix.Fstatfs(fd, &s) == nil && s.Type == unix.HUGETLBFS_MAGIC
}
