// Package rootfs holds the file operations of reft's code that runs as root
// (the SPANK plugin's prolog, extern step and step callbacks, and any root
// cleanup) on nodes that hostile users share. It is a leaf package (only the
// standard library and x/sys), so that anything that runs as root can use it.
//
// The rules it enforces, which docs/SECURITY.md states for the whole project:
//
//   - Root resolves no path a user can write. A root directory is opened
//     component by component from "/" with openat(O_DIRECTORY|O_NOFOLLOW):
//     a symlink anywhere is refused, and so is any component not owned by
//     root or writable by group or other. The one exception: an ancestor may
//     be a root-owned sticky directory (/tmp, /dev/shm), whose entries other
//     users can neither rename nor remove; the directory itself never.
//   - Every later operation is relative to a verified directory fd: openat
//     with O_NOFOLLOW (and O_EXCL when creating, O_NONBLOCK when opening, so
//     that a FIFO cannot block root), then fstat of what was opened before it
//     is trusted; fchmod/fchown on fds, never on names.
//   - A user's directory or file inside a root directory is accepted only when
//     fstat says it belongs to that user (and is what it should be: a
//     directory, a regular file).
//
// Errors name the path and what was wrong with it in one line, so that the
// caller can log them as they are.
package rootfs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Dir is a directory opened and verified by OpenRootDir or OpenUserDir.
type Dir struct {
	fd   int
	path string
}

// Path is the path the directory was opened by (for messages).
func (d *Dir) Path() string { return d.path }

// Fd is the directory's file descriptor, valid until Close.
func (d *Dir) Fd() int { return d.fd }

// Close closes the directory's fd.
func (d *Dir) Close() error {
	if d == nil || d.fd < 0 {
		return nil
	}
	err := unix.Close(d.fd)
	d.fd = -1
	return err
}

// ErrUnsafe is wrapped by every refusal: a symlink, a wrong owner, a wrong
// mode or type. Callers tell a refusal from an I/O error with errors.Is.
var ErrUnsafe = errors.New("unsafe")

// refusal is the error of a refused path: one line, worded as the shim's
// (spank/shim.c, open_root_dir), that errors.Is matches with ErrUnsafe.
type refusal struct{ msg string }

func (r *refusal) Error() string        { return r.msg }
func (r *refusal) Is(target error) bool { return target == ErrUnsafe }

func unsafeErr(path, format string, a ...any) error {
	return &refusal{fmt.Sprintf("%s %s: refusing it (root never uses a path another user could have planted)",
		path, fmt.Sprintf(format, a...))}
}

const dirFlags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC

// openDirAt opens name under dirfd without following a symlink. A symlink
// gives ELOOP (or ENOTDIR), reported as a refusal.
func openDirAt(dirfd int, name, path string) (int, error) {
	fd, err := unix.Openat(dirfd, name, dirFlags, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			var st unix.Stat_t
			if unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
				return -1, unsafeErr(path, "is a symlink")
			}
			return -1, unsafeErr(path, "is not a directory")
		}
		return -1, fmt.Errorf("opening %s: %w", path, err)
	}
	return fd, nil
}

// checkRootDir verifies an opened directory: owned by root, and not
// writable by group or other, unless ancestor and sticky.
func checkRootDir(fd int, path string, ancestor bool) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("fstat %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return unsafeErr(path, "is not a directory")
	}
	if st.Uid != 0 {
		return unsafeErr(path, "is owned by uid %d, not root", st.Uid)
	}
	if st.Mode&0o022 != 0 && !(ancestor && st.Mode&unix.S_ISVTX != 0) {
		return unsafeErr(path, "is writable by group or other (mode %04o)", st.Mode&0o7777)
	}
	return nil
}

// OpenRootDir opens the absolute directory path, verifying every component
// from "/" (see the package comment). With create, missing components are
// made by root, 0755, and the last one with mode (fchmod'ed on its fd to
// exactly that, which must not be writable by group or other).
func OpenRootDir(path string, create bool, mode uint32) (*Dir, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("%s: not an absolute path", path)
	}
	if mode&0o022 != 0 {
		return nil, fmt.Errorf("%s: internal: mode %04o is writable by group or other", path, mode)
	}
	clean := filepath.Clean(path)
	fd, err := unix.Open("/", dirFlags, 0)
	if err != nil {
		return nil, fmt.Errorf("opening /: %w", err)
	}
	parts := strings.Split(strings.TrimPrefix(clean, "/"), "/")
	if clean == "/" {
		parts = nil
	}
	cur := "/"
	if err := checkRootDir(fd, cur, len(parts) > 0); err != nil {
		unix.Close(fd)
		return nil, err
	}
	for i, p := range parts {
		cur = filepath.Join(cur, p)
		made, m := false, uint32(0o755)
		if i == len(parts)-1 {
			m = mode
		}
		if create {
			if err := unix.Mkdirat(fd, p, m); err == nil {
				made = true
			} else if !errors.Is(err, unix.EEXIST) {
				unix.Close(fd)
				return nil, fmt.Errorf("creating %s: %w", cur, err)
			}
		}
		next, err := openDirAt(fd, p, cur)
		unix.Close(fd)
		if err != nil {
			return nil, err
		}
		fd = next
		if made {
			if err := unix.Fchmod(fd, m); err != nil {
				unix.Close(fd)
				return nil, fmt.Errorf("chmod %s: %w", cur, err)
			}
		}
		if err := checkRootDir(fd, cur, i < len(parts)-1); err != nil {
			unix.Close(fd)
			return nil, err
		}
	}
	return &Dir{fd: fd, path: clean}, nil
}

func (d *Dir) sub(name string) (string, error) {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') {
		return "", fmt.Errorf("%s: internal: %q is not a single file name", d.path, name)
	}
	return filepath.Join(d.path, name), nil
}

// WriteFileAtomic replaces name in d with data, mode mode, owned by the
// caller (root): it writes name+".tmp" (a stale one is removed first),
// created with O_CREAT|O_EXCL|O_NOFOLLOW, and renames it over name.
func (d *Dir) WriteFileAtomic(name string, data []byte, mode uint32) error {
	p, err := d.sub(name)
	if err != nil {
		return err
	}
	tmp := name + ".tmp"
	if err := unix.Unlinkat(d.fd, tmp, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("removing stale %s.tmp: %w", p, err)
	}
	fd, err := unix.Openat(d.fd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	if err != nil {
		return fmt.Errorf("creating %s.tmp: %w", p, err)
	}
	f := os.NewFile(uintptr(fd), p+".tmp")
	_, werr := f.Write(data)
	if werr == nil {
		werr = unix.Fchmod(fd, mode)
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = unix.Renameat(d.fd, tmp, d.fd, name)
	}
	if werr != nil {
		_ = unix.Unlinkat(d.fd, tmp, 0)
		return fmt.Errorf("writing %s: %w", p, werr)
	}
	return nil
}

// ReadFile reads name in d, at most max bytes. It must be a regular file
// owned by root and not writable by group or other; it is opened with
// O_NOFOLLOW|O_NONBLOCK, so neither a symlink nor a FIFO gets through.
// A missing file gives an error that wraps fs.ErrNotExist.
func (d *Dir) ReadFile(name string, max int64) ([]byte, error) {
	f, err := d.openFile(name, 0, max)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", f.Name(), err)
	}
	if int64(len(b)) > max {
		return nil, unsafeErr(f.Name(), "is larger than %d bytes", max)
	}
	return b, nil
}

func (d *Dir) openFile(name string, uid uint32, max int64) (*os.File, error) {
	p, err := d.sub(name)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Openat(d.fd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return nil, unsafeErr(p, "is a symlink")
		}
		if errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("opening %s: %w", p, os.ErrNotExist)
		}
		return nil, fmt.Errorf("opening %s: %w", p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("fstat %s: %w", p, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		err = unsafeErr(p, "is not a regular file (mode %07o)", st.Mode)
	case st.Uid != uid:
		err = unsafeErr(p, "is owned by uid %d, not %d", st.Uid, uid)
	case uid == 0 && st.Mode&0o022 != 0:
		err = unsafeErr(p, "is writable by group or other (mode %04o)", st.Mode&0o7777)
	case max > 0 && st.Size > max:
		err = unsafeErr(p, "is larger than %d bytes", max)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// OpenUserFile opens name in d for reading, with O_NOFOLLOW|O_NONBLOCK, and
// returns it only if it is a regular file owned by uid.
func (d *Dir) OpenUserFile(name string, uid uint32) (*os.File, error) {
	return d.openFile(name, uid, 0)
}

// Remove removes the file name from d; a missing one is fine.
func (d *Dir) Remove(name string) error {
	p, err := d.sub(name)
	if err != nil {
		return err
	}
	if err := unix.Unlinkat(d.fd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("removing %s: %w", p, err)
	}
	return nil
}

// OpenUserDir opens the directory name in d (no symlink followed) and returns
// it only if it is a directory owned by uid that neither group nor other can
// write.
func (d *Dir) OpenUserDir(name string, uid uint32) (*Dir, error) {
	p, err := d.sub(name)
	if err != nil {
		return nil, err
	}
	fd, err := openDirAt(d.fd, name, p)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("fstat %s: %w", p, err)
	}
	if st.Uid != uid {
		unix.Close(fd)
		return nil, unsafeErr(p, "is owned by uid %d, not the job's uid %d", st.Uid, uid)
	}
	if st.Mode&0o022 != 0 {
		unix.Close(fd)
		return nil, unsafeErr(p, "is writable by group or other (mode %04o)", st.Mode&0o7777)
	}
	return &Dir{fd: fd, path: p}, nil
}

// RemoveUserDir removes the directory name of d, which must be uid's (as
// OpenUserDir checks), after removing the given entries in it (missing ones
// are fine). Nothing else in it is touched: a directory that still holds
// anything else stays, and the error says so.
func (d *Dir) RemoveUserDir(name string, uid uint32, entries []string) error {
	u, err := d.OpenUserDir(name, uid)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	for _, e := range entries {
		if err := u.Remove(e); err != nil {
			u.Close()
			return err
		}
	}
	u.Close()
	if err := unix.Unlinkat(d.fd, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("removing %s: %w", filepath.Join(d.path, name), err)
	}
	return nil
}
