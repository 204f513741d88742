package rootfs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The tests run as root (make test does): they plant what a hostile user
// would, owned by a uid that is not root.
const hostile = 4242

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("rootfs tests need root (they chown files to another uid); run them as root, as make test does")
	}
}

func TestOpenRootDir(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		name   string
		setup  func(t *testing.T, base string) string // returns the path to open
		create bool
		unsafe string // "" = success; else a substring of the refusal
	}{
		{"root chain", func(t *testing.T, b string) string { return mkdir(t, b, "a", 0o755, 0) }, false, ""},
		{"created", func(t *testing.T, b string) string { return filepath.Join(b, "x", "y") }, true, ""},
		{"symlink last", func(t *testing.T, b string) string {
			must(t, os.Symlink(mkdir(t, b, "real", 0o755, 0), filepath.Join(b, "link")))
			return filepath.Join(b, "link")
		}, true, "is a symlink"},
		{"symlink middle", func(t *testing.T, b string) string {
			mkdir(t, b, "real/sub", 0o755, 0)
			must(t, os.Symlink(filepath.Join(b, "real"), filepath.Join(b, "link")))
			return filepath.Join(b, "link", "sub")
		}, false, "is a symlink"},
		{"user owned", func(t *testing.T, b string) string { return mkdir(t, b, "squat", 0o755, hostile) }, true, "owned by uid 4242"},
		{"user owned ancestor", func(t *testing.T, b string) string {
			mkdir(t, b, "squat", 0o755, hostile)
			return mkdir(t, b, "squat/in", 0o755, 0)
		}, false, "owned by uid 4242"},
		{"world writable last", func(t *testing.T, b string) string { return mkdir(t, b, "w", 0o777, 0) }, false, "writable by group or other"},
		{"sticky last", func(t *testing.T, b string) string { return mkdir(t, b, "s", 0o1777, 0) }, false, "writable by group or other"},
		{"world writable ancestor", func(t *testing.T, b string) string {
			mkdir(t, b, "w", 0o777, 0)
			return mkdir(t, b, "w/in", 0o755, 0)
		}, false, "writable by group or other"},
		{"sticky ancestor", func(t *testing.T, b string) string {
			mkdir(t, b, "s", 0o1777, 0)
			return mkdir(t, b, "s/in", 0o700, 0)
		}, false, ""},
		{"file", func(t *testing.T, b string) string {
			must(t, os.WriteFile(filepath.Join(b, "f"), nil, 0o644))
			return filepath.Join(b, "f")
		}, false, "not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.setup(t, t.TempDir())
			d, err := OpenRootDir(p, tc.create, 0o700)
			if tc.unsafe == "" {
				if err != nil {
					t.Fatalf("OpenRootDir(%s): %v", p, err)
				}
				defer d.Close()
				var st unix.Stat_t
				must(t, unix.Fstat(d.Fd(), &st))
				if st.Uid != 0 || st.Mode&0o022 != 0 {
					t.Fatalf("opened %s: uid %d mode %o", p, st.Uid, st.Mode)
				}
				return
			}
			if err == nil {
				d.Close()
				t.Fatalf("OpenRootDir(%s) accepted it; want a refusal containing %q", p, tc.unsafe)
			}
			if !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), tc.unsafe) {
				t.Fatalf("OpenRootDir(%s): %v; want ErrUnsafe containing %q", p, err, tc.unsafe)
			}
		})
	}
}

// A planted <name>.tmp symlink, the attack on the prolog's marker, must
// not make root write through it.
func TestWriteFileAtomicPlantedTmp(t *testing.T) {
	needRoot(t)
	base := t.TempDir()
	canary := filepath.Join(t.TempDir(), "canary")
	must(t, os.WriteFile(canary, []byte("canary\n"), 0o644))
	for _, plant := range []func(p string) error{
		func(p string) error { return os.Symlink(canary, p) },
		func(p string) error { return unix.Mkfifo(p, 0o644) },
		func(p string) error { return os.Link(canary, p) },
	} {
		must(t, plant(filepath.Join(base, "7.spec.tmp")))
		d, err := OpenRootDir(base, false, 0)
		must(t, err)
		must(t, d.WriteFileAtomic("7.spec", []byte("arc\n"), 0o600))
		d.Close()
		if b, _ := os.ReadFile(canary); string(b) != "canary\n" {
			t.Fatalf("canary changed: %q", b)
		}
		b, err := os.ReadFile(filepath.Join(base, "7.spec"))
		if err != nil || string(b) != "arc\n" {
			t.Fatalf("7.spec: %q, %v", b, err)
		}
		if fi, err := os.Lstat(filepath.Join(base, "7.spec")); err != nil || fi.Mode() != 0o600 {
			t.Fatalf("7.spec mode %v, %v", fi.Mode(), err)
		}
		os.Remove(filepath.Join(base, "7.spec"))
	}
}

func TestReadFileAndOpenUserFile(t *testing.T) {
	needRoot(t)
	base := t.TempDir()
	canary := filepath.Join(t.TempDir(), "secret")
	must(t, os.WriteFile(canary, []byte("secret\n"), 0o600))
	must(t, os.WriteFile(filepath.Join(base, "ok"), []byte("arc\n"), 0o600))
	must(t, os.Symlink(canary, filepath.Join(base, "link")))
	must(t, unix.Mkfifo(filepath.Join(base, "fifo"), 0o666))
	must(t, os.WriteFile(filepath.Join(base, "theirs"), []byte("x"), 0o600))
	must(t, os.Chown(filepath.Join(base, "theirs"), hostile, hostile))
	must(t, os.WriteFile(filepath.Join(base, "big"), make([]byte, 100), 0o600))
	must(t, os.WriteFile(filepath.Join(base, "open"), []byte("x"), 0o666))
	must(t, os.Chmod(filepath.Join(base, "open"), 0o666))
	d, err := OpenRootDir(base, false, 0)
	must(t, err)
	defer d.Close()
	for _, tc := range []struct {
		name, file string
		uid        uint32 // OpenUserFile's uid; 0: ReadFile
		want       string // "" = success
	}{
		{"root file", "ok", 0, ""},
		{"symlink", "link", 0, "is a symlink"},
		{"fifo", "fifo", 0, "not a regular file"},
		{"other owner", "theirs", 0, "owned by uid 4242"},
		{"too big", "big", 0, "larger than"},
		{"writable", "open", 0, "writable by group or other"},
		{"missing", "none", 0, "file does not exist"},
		{"user file", "theirs", hostile, ""},
		{"user fifo", "fifo", hostile, "not a regular file"},
		{"user symlink", "link", hostile, "is a symlink"},
		{"user: root's file", "ok", hostile, "owned by uid 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() {
				if tc.uid == 0 {
					_, err := d.ReadFile(tc.file, 64)
					done <- err
					return
				}
				f, err := d.OpenUserFile(tc.file, tc.uid)
				if err == nil {
					f.Close()
				}
				done <- err
			}()
			var err error
			select {
			case err = <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("blocked (a FIFO must not block root)")
			}
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v; want one containing %q", err, tc.want)
			}
		})
	}
	if b, _ := os.ReadFile(canary); string(b) != "secret\n" {
		t.Fatalf("canary changed: %q", b)
	}
}

func TestRemoveUserDir(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, base string)
		want  string // "" = removed
		stays string // a path that must survive
	}{
		{"user dir", func(t *testing.T, b string) {
			mkdir(t, b, "7", 0o700, hostile)
			must(t, os.WriteFile(filepath.Join(b, "7", "agent.lock"), nil, 0o600))
		}, "", ""},
		{"missing", func(t *testing.T, b string) {}, "", ""},
		{"symlink to a root dir", func(t *testing.T, b string) {
			victim := mkdir(t, b, "victim", 0o755, 0)
			must(t, os.WriteFile(filepath.Join(victim, "agent.lock"), nil, 0o600))
			must(t, os.Symlink(victim, filepath.Join(b, "7")))
		}, "is a symlink", "victim/agent.lock"},
		{"another user's dir", func(t *testing.T, b string) {
			mkdir(t, b, "7", 0o700, hostile+1)
			must(t, os.WriteFile(filepath.Join(b, "7", "agent.lock"), nil, 0o600))
		}, "owned by uid 4243", "7/agent.lock"},
		{"other files stay", func(t *testing.T, b string) {
			mkdir(t, b, "7", 0o700, hostile)
			must(t, os.WriteFile(filepath.Join(b, "7", "keep"), nil, 0o600))
		}, "directory not empty", "7/keep"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			tc.setup(t, base)
			d, err := OpenRootDir(base, false, 0)
			must(t, err)
			defer d.Close()
			err = d.RemoveUserDir("7", hostile, []string{"agent.lock", "agent.sock"})
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if _, err := os.Lstat(filepath.Join(base, "7")); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("7 is still there: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v; want one containing %q", err, tc.want)
			}
			if _, err := os.Lstat(filepath.Join(base, tc.stays)); err != nil {
				t.Fatalf("%s is gone: %v", tc.stays, err)
			}
		})
	}
}

func mkdir(t *testing.T, base, rel string, mode os.FileMode, uid int) string {
	t.Helper()
	p := filepath.Join(base, rel)
	must(t, os.MkdirAll(p, 0o755))
	must(t, os.Chmod(p, mode|modeBits(mode)))
	must(t, os.Chown(p, uid, uid))
	return p
}

// modeBits maps the numeric sticky bit (01000) to Go's os.ModeSticky.
func modeBits(m os.FileMode) os.FileMode {
	if m&0o1000 != 0 {
		return os.ModeSticky
	}
	return 0
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
