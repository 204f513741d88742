package tmpfs

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// foreignUID is another user than the test's: a file of it stands for
// someone else's (reft-bob's, root's) that garbage collection must leave.
const foreignUID = 4242

// hostileCase plants something in a job directory (and around it) before
// garbage collection removes it as root.
type hostileCase struct {
	name string
	// plant gets the job directory, a directory outside the store holding
	// canaries, and the fake hugetlbfs mount; it returns the canaries that
	// must survive unchanged.
	plant    func(t *testing.T, job, outside, huge string) []string
	root     bool // needs root (chown to foreignUID)
	gone     bool // the job directory is removed
	wantErr  bool // Remove reports something it refused
	wantLock bool // ErrLocked
}

// TestRemoveHostile: `reft gc` runs as root on a directory its user
// writes (issue 14, finding 2). Whatever the user plants there, removal
// never deletes, opens or blocks on anything outside the user's own files,
// and follows an arena link only into the hugetlbfs mount, to a regular
// file of the same user in a directory of theirs.
func TestRemoveHostile(t *testing.T) {
	canary := func(t *testing.T, dir, name string, uid int) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("canary "+name), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
		return p
	}
	arenaDir := func(t *testing.T, job string) string {
		t.Helper()
		d := filepath.Join(job, "r0", "state")
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		return d
	}
	link := func(t *testing.T, target, name string) {
		t.Helper()
		if err := os.Symlink(target, name); err != nil {
			t.Fatal(err)
		}
	}
	tests := []hostileCase{
		{name: "arena link to a file outside", gone: true, wantErr: true,
			plant: func(t *testing.T, job, outside, huge string) []string {
				c := canary(t, outside, "passwd", os.Getuid())
				link(t, c, filepath.Join(arenaDir(t, job), "arena-0"))
				return []string{c}
			}},
		{name: "arena link escaping the mount with ..", gone: true, wantErr: true,
			plant: func(t *testing.T, job, outside, huge string) []string {
				c := canary(t, outside, "shadow", os.Getuid())
				rel, _ := filepath.Rel(huge, c)
				link(t, huge+"/"+rel, filepath.Join(arenaDir(t, job), "arena-0"))
				return []string{c}
			}},
		{name: "arena link through a symlinked directory in the mount", gone: true, wantErr: true,
			plant: func(t *testing.T, job, outside, huge string) []string {
				c := canary(t, outside, "x", os.Getuid())
				link(t, outside, filepath.Join(huge, "via"))
				link(t, filepath.Join(huge, "via", "x"), filepath.Join(arenaDir(t, job), "arena-0"))
				return []string{c}
			}},
		{name: "arena link to another user's file in the mount", root: true, gone: true, wantErr: true,
			plant: func(t *testing.T, job, outside, huge string) []string {
				d := filepath.Join(huge, "alice")
				os.Mkdir(d, 0o700)
				os.Chown(d, foreignUID, foreignUID)
				c := canary(t, d, "arena-0", foreignUID)
				link(t, c, filepath.Join(arenaDir(t, job), "arena-0"))
				return []string{c}
			}},
		{name: "arena link to own file in another user's directory", root: true, gone: true, wantErr: true,
			plant: func(t *testing.T, job, outside, huge string) []string {
				d := filepath.Join(huge, "shared")
				os.Mkdir(d, 0o777)
				os.Chown(d, foreignUID, foreignUID)
				c := canary(t, d, "arena-0", os.Getuid())
				link(t, c, filepath.Join(arenaDir(t, job), "arena-0"))
				return []string{c}
			}},
		{name: "lock is a FIFO", gone: true,
			plant: func(t *testing.T, job, outside, huge string) []string {
				if err := unix.Mkfifo(filepath.Join(job, LockName), 0o600); err != nil {
					t.Fatal(err)
				}
				return nil
			}},
		{name: "lock is a symlink to a file someone holds locked", gone: true,
			plant: func(t *testing.T, job, outside, huge string) []string {
				c := canary(t, outside, "held", os.Getuid())
				f, err := os.Open(c)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { f.Close() })
				if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
					t.Fatal(err)
				}
				link(t, c, filepath.Join(job, LockName))
				return []string{c}
			}},
		{name: "lock is a symlink to a FIFO outside", gone: true,
			plant: func(t *testing.T, job, outside, huge string) []string {
				p := filepath.Join(outside, "fifo")
				if err := unix.Mkfifo(p, 0o600); err != nil {
					t.Fatal(err)
				}
				link(t, p, filepath.Join(job, LockName))
				return nil
			}},
		{name: "directory symlink to a directory outside", gone: true,
			plant: func(t *testing.T, job, outside, huge string) []string {
				c := canary(t, outside, "keep", os.Getuid())
				link(t, outside, filepath.Join(job, "r1"))
				return []string{c}
			}},
		{name: "another user's directory inside the job", root: true, gone: false, wantErr: true,
			plant: func(t *testing.T, job, outside, huge string) []string {
				d := filepath.Join(job, "r2")
				os.Mkdir(d, 0o755)
				c := canary(t, d, "theirs", foreignUID)
				os.Chown(d, foreignUID, foreignUID)
				return []string{c}
			}},
		{name: "own arena file on the mount is removed", gone: true,
			plant: func(t *testing.T, job, outside, huge string) []string {
				d := filepath.Join(huge, "own")
				os.Mkdir(d, 0o700)
				p := filepath.Join(d, "arena-0")
				os.WriteFile(p, []byte("snapshot"), 0o600)
				link(t, p, filepath.Join(arenaDir(t, job), "arena-0"))
				t.Cleanup(func() {
					if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
						t.Errorf("the job's own hugetlbfs file %s was not removed (%v)", p, err)
					}
				})
				return nil
			}},
		{name: "a live agent's lock", wantLock: true,
			plant: func(t *testing.T, job, outside, huge string) []string {
				f, err := os.OpenFile(filepath.Join(job, LockName), os.O_RDWR|os.O_CREATE, 0o600)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { f.Close() })
				if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
					t.Fatal(err)
				}
				return nil
			}},
	}
	old := hugetlbfsCheck
	hugetlbfsCheck = func(int) bool { return true } // the fake mount is a plain directory
	t.Cleanup(func() { hugetlbfsCheck = old })
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.root && os.Geteuid() != 0 {
				t.Skip("needs root to give files to another uid")
			}
			base := t.TempDir()
			root, outside, huge := filepath.Join(base, "store"), filepath.Join(base, "outside"), filepath.Join(base, "huge")
			for _, d := range []string{root, outside, huge} {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			job := JobPath(root, os.Getuid(), "77")
			if err := os.MkdirAll(job, 0o700); err != nil {
				t.Fatal(err)
			}
			canaries := tc.plant(t, job, outside, huge)
			before := map[string]string{}
			for _, c := range canaries {
				b, err := os.ReadFile(c)
				if err != nil {
					t.Fatal(err)
				}
				before[c] = string(b)
			}
			dirs, err := ListJobDirs(root, -1)
			if err != nil || len(dirs) != 1 {
				t.Fatalf("ListJobDirs = %v, %v; want the one job", dirs, err)
			}
			done := make(chan error, 1)
			go func() { done <- removeForTest(dirs[0], huge) }()
			select {
			case err = <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("Remove blocked (on a FIFO?)")
			}
			switch {
			case tc.wantLock:
				if !errors.Is(err, ErrLocked) {
					t.Errorf("Remove = %v, want ErrLocked", err)
				}
			case tc.wantErr && err == nil:
				t.Errorf("Remove reported nothing it refused")
			case !tc.wantErr && err != nil:
				t.Errorf("Remove: %v", err)
			}
			if tc.wantErr && err != nil && !errors.Is(err, ErrForeign) {
				t.Errorf("Remove = %v, want an error wrapping ErrForeign", err)
			}
			if _, serr := os.Lstat(job); errors.Is(serr, os.ErrNotExist) != tc.gone {
				t.Errorf("job directory removed = %v, want %v (Remove: %v)", !tc.gone, tc.gone, err)
			}
			for c, want := range before {
				if b, err := os.ReadFile(c); err != nil || string(b) != want {
					t.Errorf("canary %s: %q, %v; want it untouched", c, b, err)
				}
			}
		})
	}
}

// TestListJobDirsForeignOwner: a <uid> directory that another user made
// (or a symlink in its place) is listed with its Problem, and Remove
// refuses it.
func TestListJobDirsForeignOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give a directory to another uid")
	}
	tests := []struct {
		name  string
		plant func(t *testing.T, root, outside string)
		keep  string // under base: must survive
	}{
		{"uid directory of another owner", func(t *testing.T, root, outside string) {
			d := filepath.Join(root, "1000")
			os.MkdirAll(filepath.Join(d, "5"), 0o777)
			os.Chown(d, foreignUID, foreignUID)
		}, "store/1000/5"},
		{"uid directory is a symlink", func(t *testing.T, root, outside string) {
			os.MkdirAll(filepath.Join(outside, "5"), 0o700)
			os.Chown(outside, 1000, 1000)
			os.Chown(filepath.Join(outside, "5"), 1000, 1000)
			os.Symlink(outside, filepath.Join(root, "1000"))
		}, "outside/5"},
		{"job directory others may write", func(t *testing.T, root, outside string) {
			d := filepath.Join(root, "1000", "5")
			os.MkdirAll(d, 0o700)
			os.Chmod(d, 0o777)
			os.Chown(filepath.Dir(d), 1000, 1000)
			os.Chown(d, 1000, 1000)
		}, "store/1000/5"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			root, outside := filepath.Join(base, "store"), filepath.Join(base, "outside")
			os.Mkdir(root, 0o755)
			os.Mkdir(outside, 0o755)
			tc.plant(t, root, outside)
			dirs, err := ListJobDirs(root, -1)
			if err != nil || len(dirs) != 1 {
				t.Fatalf("ListJobDirs = %+v, %v; want one entry", dirs, err)
			}
			if !errors.Is(dirs[0].Problem, ErrForeign) {
				t.Fatalf("Problem = %v, want ErrForeign", dirs[0].Problem)
			}
			if err := removeForTest(dirs[0], ""); !errors.Is(err, ErrForeign) {
				t.Errorf("Remove = %v, want ErrForeign", err)
			}
			if _, err := os.Lstat(filepath.Join(base, tc.keep)); err != nil {
				t.Errorf("%s: %v; want it kept", tc.keep, err)
			}
		})
	}
}

// TestUsageAge: Usage counts the files' bytes and reports the newest
// change anywhere in the tree.
func TestUsageAge(t *testing.T) {
	root := t.TempDir()
	job := JobPath(root, os.Getuid(), "9")
	os.MkdirAll(filepath.Join(job, "r0"), 0o700)
	os.WriteFile(filepath.Join(job, "r0", "a"), make([]byte, 1000), 0o600)
	os.WriteFile(filepath.Join(job, "b"), make([]byte, 24), 0o600)
	old, recent := time.Now().Add(-10*time.Hour), time.Now().Add(-time.Hour)
	for _, p := range []string{job, filepath.Join(job, "r0"), filepath.Join(job, "b")} {
		os.Chtimes(p, old, old)
	}
	os.Chtimes(filepath.Join(job, "r0", "a"), recent, recent)
	dirs, err := ListJobDirs(root, os.Getuid())
	if err != nil || len(dirs) != 1 {
		t.Fatalf("ListJobDirs = %v, %v", dirs, err)
	}
	n, mod := dirs[0].Usage("")
	if n != 1024 || mod.Sub(recent).Abs() > time.Second {
		t.Errorf("Usage = %d bytes, modified %v; want 1024, %v", n, mod, recent)
	}
	if want := strconv.Itoa(os.Getuid()); filepath.Base(filepath.Dir(dirs[0].Path)) != want {
		t.Errorf("listed %s", dirs[0].Path)
	}
}

// removeForTest is the removal under test.
func removeForTest(d JobDir, huge string) error { return d.Remove(huge) }
