package logging

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestOpenRefusesSquattedJobDir: the agent logs only into a job
// directory of its own uid, through no link, into a regular file of its
// own; what another user planted in the shared log directory is refused
// with one error naming the cause and the fix, and files the plant
// points at are untouched (issue 14, finding 4).
func TestOpenRefusesSquattedJobDir(t *testing.T) {
	me := os.Getuid()
	cases := []struct {
		name  string
		plant func(t *testing.T, logDir, canary string) // before the agent opens its log
		uid   int                                       // the job's uid
		want  string                                    // "" opened
	}{
		{"nothing planted", func(*testing.T, string, string) {}, me, ""},
		{"directory of another user", func(t *testing.T, d, _ string) { mkdir(t, filepath.Join(d, "7"), 0o777) }, me + 1,
			"belongs to uid"},
		{"directory of another user, mode 0700", func(t *testing.T, d, _ string) { mkdir(t, filepath.Join(d, "7"), 0o700) }, me + 1,
			"belongs to uid"},
		{"directory is a link", func(t *testing.T, d, c string) { symlink(t, filepath.Dir(c), filepath.Join(d, "7")) }, me,
			"symbolic link"},
		{"log file is a link", func(t *testing.T, d, c string) {
			mkdir(t, filepath.Join(d, "7"), 0o700)
			symlink(t, c, filepath.Join(d, "7", "n1.jsonl"))
		}, me, "symbolic link"},
		{"log file is a FIFO", func(t *testing.T, d, _ string) {
			mkdir(t, filepath.Join(d, "7"), 0o700)
			if err := syscall.Mkfifo(filepath.Join(d, "7", "n1.jsonl"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, me, "not a regular file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			logDir := t.TempDir()
			canary := filepath.Join(t.TempDir(), "canary")
			if err := os.WriteFile(canary, []byte("canary"), 0o600); err != nil {
				t.Fatal(err)
			}
			tc.plant(t, logDir, canary)
			l, c, err := Open(Options{Dir: logDir, Level: "info", UID: func() int { return tc.uid }}, Fields{Job: "7", Node: "n1"})
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Open: %v", err)
				}
				l.Info().Msg("hello")
				c.Close()
				for path, mode := range map[string]os.FileMode{filepath.Join(logDir, "7"): 0o700 | os.ModeDir, filepath.Join(logDir, "7", "n1.jsonl"): 0o600} {
					if fi, err := os.Stat(path); err != nil || fi.Mode() != mode {
						t.Errorf("%s: %v %v, want mode %v", path, fi.Mode(), err, mode)
					}
				}
			} else {
				if !errors.Is(err, ErrNotPrivate) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("Open = %v, want ErrNotPrivate saying %q", err, tc.want)
				}
				if c != nil {
					c.Close()
				}
			}
			if b, err := os.ReadFile(canary); err != nil || string(b) != "canary" {
				t.Fatalf("canary: %q, %v", b, err)
			}
		})
	}
}

// TestOwnLooseJobDirMadePrivate: the job's own directory and log of a
// looser mode (an older reft made them 0750 and 0640) are made private.
func TestOwnLooseJobDirMadePrivate(t *testing.T) {
	logDir := t.TempDir()
	dir := filepath.Join(logDir, "7")
	mkdir(t, dir, 0o777)
	if err := os.WriteFile(filepath.Join(dir, "n1.jsonl"), nil, 0o640); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(dir, "n1.jsonl"), 0o640)
	_, c, err := Open(Options{Dir: logDir, Level: "info"}, Fields{Job: "7", Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	for path, mode := range map[string]os.FileMode{dir: 0o700 | os.ModeDir, filepath.Join(dir, "n1.jsonl"): 0o600} {
		if fi, err := os.Stat(path); err != nil || fi.Mode() != mode {
			t.Errorf("%s: %v %v, want mode %v", path, fi.Mode(), err, mode)
		}
	}
}

func mkdir(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.Mkdir(path, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // past the umask
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}
