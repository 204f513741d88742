package logging

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// The log directory is shared by every user of a node (mode 1777, like
// /tmp, or created by the administrator). Another user can create the
// directory of an upcoming job there before the job does: to lock its
// agents out, or to write forged lines that reft run would act on
// (issue 14, finding 4). So a job's directory is trusted only if it is
// a real directory of the job's uid that nobody else can enter, and
// every file in it is opened without following links.

// ErrNotPrivate: the job's log directory, or a file in it, is not the
// job user's alone.
var ErrNotPrivate = errors.New("not private to the job's user")

// JobDirPath is <dir>/<job>.
func JobDirPath(dir, job string) string { return filepath.Join(dir, safe(job)) }

// JobDir opens the job's log directory <dir>/<job> for OpenIn, creating
// it (mode 0700) when it is missing, and checks that it is a directory
// owned by uid (the job's, which the caller runs as), taking away any
// permissions of group or other. The caller closes it.
func JobDir(dir, job string, uid int) (*os.File, error) {
	path := JobDirPath(dir, job)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating log directory %s: %w (check log.dir in reft.toml: it must exist, writable by job users, e.g. mode 1777)", dir, err)
	}
	if err := os.Mkdir(path, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("creating the job's log directory %s: %w (check log.dir in reft.toml)", path, err)
	}
	return OpenJobDir(path, uid)
}

// OpenJobDir opens an existing job log directory with JobDir's checks,
// for readers (reft run's watcher). Errors wrap fs.ErrNotExist when it
// does not exist.
func OpenJobDir(path string, uid int) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return nil, fmt.Errorf("the job's log directory %s is a symbolic link or not a directory: %w; %s", path, ErrNotPrivate, squatFix(path))
		}
		return nil, fmt.Errorf("opening the job's log directory %s: %w", path, os.NewSyscallError("open", err))
	}
	d := os.NewFile(uintptr(fd), path)
	if err := checkPrivate(d, path, uid, true); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// squatFix says what to do about a job log directory another user made.
func squatFix(path string) string {
	return fmt.Sprintf("another user may have created it before this job did, in the shared log directory; "+
		"reft neither writes nor trusts logs there (an administrator removes %s; reft's prolog creates it as the job's user, mode 0700)", path)
}

// checkPrivate checks that f is a directory (dir) or a regular file
// owned by uid, and takes away any group or other permissions.
func checkPrivate(f *os.File, path string, uid int, dir bool) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("checking %s: %w", path, err)
	}
	what, typ := "regular file", uint32(unix.S_IFREG)
	if dir {
		what, typ = "directory", unix.S_IFDIR
	}
	switch {
	case st.Mode&unix.S_IFMT != typ:
		return fmt.Errorf("%s is not a %s: %w; %s", path, what, ErrNotPrivate, squatFix(filepath.Dir(path)))
	case int(st.Uid) != uid:
		return fmt.Errorf("%s belongs to uid %d, this job runs as uid %d: %w; %s", path, st.Uid, uid, ErrNotPrivate, squatFix(jobDirOf(path, dir)))
	case st.Mode&0o077 != 0:
		// Ours, but open to others (made by an older reft, or by hand):
		// closed now. Whatever others put in it meanwhile is refused by
		// the owner check of each file.
		if err := unix.Fchmod(int(f.Fd()), st.Mode&0o700); err != nil {
			return fmt.Errorf("%s has mode %04o, open to other users, and cannot be made private: %w", path, st.Mode&0o7777, err)
		}
	}
	return nil
}

func jobDirOf(path string, dir bool) string {
	if dir {
		return path
	}
	return filepath.Dir(path)
}

// OpenIn opens name in the job directory d (from JobDir) with flag plus
// O_NOFOLLOW and O_CLOEXEC; a file it creates has mode 0600. The file
// must be a regular file owned by uid (any group or other permissions
// are taken away): a link, a FIFO or another user's file is refused.
func OpenIn(d *os.File, name string, flag int, uid int) (*os.File, error) {
	path := filepath.Join(d.Name(), name)
	if name != filepath.Base(name) || name == "." || name == ".." {
		return nil, fmt.Errorf("log file name %q is not a plain name", name)
	}
	// O_NONBLOCK: a FIFO planted under the name must not block the open;
	// it is refused below as not a regular file.
	fd, err := unix.Openat(int(d.Fd()), name, flag|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0o600)
	if err != nil {
		switch {
		case errors.Is(err, unix.ELOOP):
			return nil, fmt.Errorf("%s is a symbolic link: %w; %s", path, ErrNotPrivate, squatFix(d.Name()))
		case errors.Is(err, unix.ENXIO): // a FIFO without a reader, opened for writing
			return nil, fmt.Errorf("%s is not a regular file (a FIFO or device): %w; %s", path, ErrNotPrivate, squatFix(d.Name()))
		}
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	if err := checkPrivate(f, path, uid, false); err != nil {
		f.Close()
		return nil, err
	}
	// Regular files ignore O_NONBLOCK, but clear it all the same.
	if err := unix.SetNonblock(fd, false); err != nil {
		f.Close()
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	return f, nil
}
