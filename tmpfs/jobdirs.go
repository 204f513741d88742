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

	"golang.org/x/sys/unix"
)

// JobDir is one job's directory under a store root, as garbage collection
// sees it.
type JobDir struct {
	Path  string
	UID   int
	JobID string
}

// JobPath is where job's store lives under root for the user uid:
// <root>/<uid>/<jobid>. Whoever prepares it ahead of the agent (the SPANK
// plugin, as root) must make both <uid> and <jobid> 0700 and owned by uid.
func JobPath(root string, uid int, job string) string {
	return filepath.Join(root, strconv.Itoa(uid), job)
}

// ListJobDirs lists <root>/<uid>/<jobid> directories, for every uid or
// only for uid when uid >= 0.
func ListJobDirs(root string, uid int) ([]JobDir, error) {
	users, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("tmpfs: list store root: %w", err)
	}
	var out []JobDir
	for _, u := range users {
		id, err := strconv.Atoi(u.Name())
		if err != nil || !u.IsDir() || (uid >= 0 && id != uid) {
			continue
		}
		jobs, err := os.ReadDir(filepath.Join(root, u.Name()))
		if err != nil {
			return nil, fmt.Errorf("tmpfs: list jobs of uid %d: %w", id, err)
		}
		for _, j := range jobs {
			if j.IsDir() && nameRE.MatchString(j.Name()) {
				out = append(out, JobDir{Path: filepath.Join(root, u.Name(), j.Name()), UID: id, JobID: j.Name()})
			}
		}
	}
	slices.SortFunc(out, func(a, b JobDir) int { return cmp.Compare(a.Path, b.Path) })
	return out, nil
}

// Size is the bytes the job's files hold.
func (d JobDir) Size() int64 {
	var n int64
	filepath.WalkDir(d.Path, func(p string, e fs.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			if st, err := os.Stat(p); err == nil { // follows hugetlbfs links
				n += st.Size()
			}
		}
		return nil
	})
	return n
}

// Remove deletes the job's directory, and the hugetlbfs files its arenas
// link to, unless a live agent holds the job's lock (ErrLocked). The lock
// is held during removal, so no agent starts into a half-removed store.
func (d JobDir) Remove() error {
	f, err := os.Open(filepath.Join(d.Path, ".lock"))
	if err == nil {
		defer f.Close()
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			return fmt.Errorf("tmpfs: %s: %w", d.Path, ErrLocked)
		}
	}
	var errs []error
	filepath.WalkDir(d.Path, func(p string, e fs.DirEntry, err error) error {
		if err == nil && e.Type()&fs.ModeSymlink != 0 {
			if _, ok := parseArenaName(e.Name()); ok {
				if t, err := os.Readlink(p); err == nil {
					if err := os.Remove(t); err != nil && !os.IsNotExist(err) {
						errs = append(errs, err)
					}
				}
			}
		}
		return nil
	})
	if err := os.RemoveAll(d.Path); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("tmpfs: remove %s: %w", d.Path, err)
	}
	os.Remove(filepath.Dir(d.Path)) // the uid directory, if now empty
	return nil
}
