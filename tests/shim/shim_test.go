// Package shim tests spank/shim.c's root code (open_root_dir, spawn_agent's
// directories, marker and log directory) outside Slurm, through testdata/harness.c,
// which includes the shim and stubs Slurm's functions. It runs as root, as
// the shim does (make test runs as root).
package shim

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

const (
	alice = 4242 // the job's user
	bob   = 4243 // another user, the attacker
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// harness builds testdata/harness.c with the marker directory stateDir.
func harness(t *testing.T, stateDir string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the shim's tests need root, as the shim does; run them as root (make test does)")
	}
	_, file, _, _ := runtime.Caller(0)
	bin := filepath.Join(t.TempDir(), "harness")
	out, err := exec.Command("cc", "-O2", "-Wall", "-Wextra", "-Werror", "-DREFT_STATE_DIR=\""+stateDir+"\"",
		"-o", bin, filepath.Join(filepath.Dir(file), "testdata", "harness.c"), "-ldl").CombinedOutput()
	if err != nil {
		t.Fatalf("cc harness.c: %v\n%s", err, out)
	}
	return bin
}

func mkdir(t *testing.T, p string, mode os.FileMode, uid int) string {
	t.Helper()
	must(t, os.MkdirAll(p, 0o755))
	must(t, os.Chmod(p, mode))
	must(t, os.Chown(p, uid, uid))
	return p
}

func owner(t *testing.T, p string) (uid uint32, mode os.FileMode) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	return fi.Sys().(*syscall.Stat_t).Uid, fi.Mode()
}

func TestOpenRootDir(t *testing.T) {
	h := harness(t, "/nonexistent")
	for _, tc := range []struct {
		name       string
		setup      func(t *testing.T, b string) string
		create     bool
		stickyLast bool
		want       string // "" = ok
	}{
		{"root chain", func(t *testing.T, b string) string { return mkdir(t, b+"/a", 0o755, 0) }, false, false, ""},
		{"created", func(t *testing.T, b string) string { return b + "/x/y" }, true, false, ""},
		{"symlink", func(t *testing.T, b string) string {
			must(t, os.Symlink(mkdir(t, b+"/real", 0o755, 0), b+"/link"))
			return b + "/link/sub"
		}, true, false, "/link is a symlink: refusing it"},
		{"another user's", func(t *testing.T, b string) string { return mkdir(t, b+"/squat", 0o755, bob) }, true, false, "/squat is owned by uid 4243, not root"},
		{"world-writable", func(t *testing.T, b string) string { return mkdir(t, b+"/w", 0o777, 0) }, false, false, "/w is writable by group or other (mode 777)"},
		{"sticky ancestor", func(t *testing.T, b string) string {
			mkdir(t, b+"/s", 0o777|os.ModeSticky, 0)
			return mkdir(t, b+"/s/in", 0o755, 0)
		}, false, false, ""},
		{"sticky last", func(t *testing.T, b string) string { return mkdir(t, b+"/s", 0o777|os.ModeSticky, 0) }, false, false, "writable by group or other (mode 1777)"},
		{"sticky last allowed", func(t *testing.T, b string) string { return mkdir(t, b+"/s", 0o777|os.ModeSticky, 0) }, false, true, ""},
		{"dot dot", func(t *testing.T, b string) string { return b + "/../x" }, false, false, ". or .. in the path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.setup(t, t.TempDir())
			b01 := func(v bool) string {
				if v {
					return "1"
				}
				return "0"
			}
			out, err := exec.Command(h, "open", p, b01(tc.create), b01(tc.stickyLast)).CombinedOutput()
			if tc.want == "" {
				if err != nil || strings.TrimSpace(string(out)) != "ok" {
					t.Fatalf("open %s: %v: %s", p, err, out)
				}
				if uid, mode := owner(t, p); uid != 0 || mode&0o022 != 0 && mode&os.ModeSticky == 0 {
					t.Fatalf("%s: uid %d mode %v", p, uid, mode)
				}
				return
			}
			if err == nil || !strings.Contains(string(out), tc.want) {
				t.Fatalf("open %s: %v: %s; want a refusal with %q", p, err, out, tc.want)
			}
		})
	}
}

// spawn_agent as root for alice: what it makes, and what it refuses.
func TestSpawnAgentDirectories(t *testing.T) {
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, b, victim string)
		err   string // "" = started
		warn  string // substring of the warning ("" = none)
	}{
		{"clean", func(t *testing.T, b, victim string) {}, "", ""},
		{"store root is a symlink", func(t *testing.T, b, victim string) {
			mkdir(t, b+"/shm", 0o777|os.ModeSticky, 0)
			must(t, os.Symlink(victim, b+"/shm/reft"))
		}, "/shm/reft is a symlink: refusing it", ""},
		{"run dir squatted", func(t *testing.T, b, victim string) {
			mkdir(t, b+"/run", 0o755, bob)
		}, "/run is owned by uid 4243, not root", ""},
		{"job dir is a symlink", func(t *testing.T, b, victim string) {
			mkdir(t, b+"/run", 0o755, 0)
			must(t, os.Symlink(victim, b+"/run/7"))
		}, "/run/7 is a symlink: refusing it", ""},
		{"user store dir is another user's", func(t *testing.T, b, victim string) {
			mkdir(t, b+"/shm", 0o777|os.ModeSticky, 0)
			mkdir(t, b+"/shm/reft", 0o755, 0)
			mkdir(t, b+"/shm/reft/"+strconv.Itoa(alice), 0o700, bob)
		}, "is owned by uid 4243, not the job's uid 4242", ""},
		{"hugetlbfs subdirectory squatted", func(t *testing.T, b, victim string) {
			first := strings.Split(strings.TrimPrefix(b, "/"), "/")[0]
			mkdir(t, b+"/huge/"+first, 0o755, bob)
		}, "is owned by uid 4243, not root", ""},
		{"marker tmp planted", func(t *testing.T, b, victim string) {
			mkdir(t, b+"/state", 0o755, 0)
			mkdir(t, b+"/state/.plugin", 0o700, 0)
			must(t, os.Symlink(victim+"/canary", b+"/state/.plugin/7.spec.tmp"))
		}, "", ""},
		{"log dir squatted", func(t *testing.T, b, victim string) {
			mkdir(t, b+"/log/7", 0o777, bob)
		}, "", "exists with owner uid 4243 and mode 777, not the job's uid and 0700 (planted by another user?): moved aside to .squatted-7-"},
		{"log dir is a symlink", func(t *testing.T, b, victim string) {
			must(t, os.Symlink(victim, b+"/log/7"))
		}, "", "/log/7 is a symlink (planted by another user?): moved aside to .squatted-7-"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := t.TempDir()
			victim := mkdir(t, t.TempDir()+"/victim", 0o755, 0)
			must(t, os.WriteFile(victim+"/canary", []byte("canary\n"), 0o644))
			mkdir(t, b+"/huge", 0o777|os.ModeSticky, 0) // a 1777 mount
			mkdir(t, b+"/log", 0o777|os.ModeSticky, 0)
			tc.plant(t, b, victim)
			h := harness(t, b+"/state/.plugin")
			u := strconv.Itoa(alice)
			out, _ := exec.Command(h, "spawn", u, u, "7.spec",
				b+"/run", "7", b+"/shm/reft", u, b+"/huge", b+"/log", "/bin/true", "--flag").CombinedOutput()
			got := string(out)
			if ents, err := os.ReadDir(victim); err != nil || len(ents) != 1 {
				t.Errorf("victim directory changed: %v, %v", ents, err)
			}
			if c, _ := os.ReadFile(victim + "/canary"); string(c) != "canary\n" {
				t.Errorf("canary changed: %q", c)
			}
			if uid, mode := owner(t, victim); uid != 0 || mode.Perm() != 0o755 {
				t.Errorf("victim: uid %d mode %v", uid, mode)
			}
			if tc.err != "" {
				if !strings.Contains(got, "rc=-1") || !strings.Contains(got, tc.err) {
					t.Fatalf("spawn: %s; want a failure with %q", got, tc.err)
				}
				return
			}
			if !strings.Contains(got, "rc=0") {
				t.Fatalf("spawn: %s", got)
			}
			if tc.warn == "" && !strings.Contains(got, "warn=\n") || tc.warn != "" && !strings.Contains(got, tc.warn) {
				t.Errorf("spawn: %s; want warning %q", got, tc.warn)
			}
			hugeUser := filepath.Join(b+"/huge", b, "shm/reft", u)
			for _, d := range []string{b + "/run/7", b + "/shm/reft/" + u, hugeUser} {
				if uid, mode := owner(t, d); uid != alice || mode.Perm() != 0o700 || !mode.IsDir() {
					t.Errorf("%s: uid %d mode %v; want alice's 0700 directory", d, uid, mode)
				}
			}
			for _, d := range []string{b + "/run", b + "/shm/reft", filepath.Dir(hugeUser)} {
				if uid, mode := owner(t, d); uid != 0 || mode.Perm() != 0o755 {
					t.Errorf("%s: uid %d mode %v; want root's 0755", d, uid, mode)
				}
			}
			// a squatted one was moved aside: the job has its own now
			{
				if uid, mode := owner(t, b+"/log/7"); uid != alice || mode.Perm() != 0o700 || !mode.IsDir() {
					t.Errorf("log dir: uid %d mode %v; want alice's 0700", uid, mode)
				}
			}
			m, err := os.ReadFile(b + "/state/.plugin/7.spec")
			if uid, mode := owner(t, b+"/state/.plugin/7.spec"); err != nil || string(m) != "arc\n" || uid != 0 || mode != 0o600 {
				t.Errorf("marker: %q, %v, uid %d, mode %v", m, err, uid, mode)
			}
		})
	}
}
