package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/spank/rootfs"
	"github.com/reft-hpc/reft/spank/spec"
	"golang.org/x/sys/unix"
)

// The plugin runs as root; so do these tests (make test runs as root). What
// a hostile user would plant is owned by uid bob.
const bob = 4242

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the plugin's tests need root, as the plugin does; run them as root (make test does)")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// within fails the test if f does not return within 5 s (a FIFO opened
// without O_NONBLOCK blocks root forever).
func within(t *testing.T, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("blocked for 5 s")
		return nil
	}
}

func canary(t *testing.T) (path string, check func()) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "canary")
	must(t, os.WriteFile(path, []byte("canary\n"), 0o644))
	return path, func() {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil || string(b) != "canary\n" {
			t.Fatalf("canary %s changed: %q, %v", path, b, err)
		}
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o644 {
			t.Fatalf("canary %s mode changed: %v", path, fi.Mode())
		}
	}
}

// Finding 1: the prolog's marker. A planted state directory (a symlink, or
// another user's directory) and a planted <job>.spec.tmp must not make root
// write anywhere but its own file.
func TestWriteMarkerPlanted(t *testing.T) {
	needRoot(t)
	s, err := spec.Parse("arc")
	must(t, err)
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, state, victim string)
		want  string // "" = written
	}{
		{"fresh", func(t *testing.T, state, victim string) {}, ""},
		{"state dir is a symlink", func(t *testing.T, state, victim string) {
			d := t.TempDir()
			must(t, os.Chown(d, bob, bob))
			must(t, os.Symlink(victim, filepath.Join(d, "7.spec.tmp")))
			must(t, os.Symlink(d, state))
		}, "is a symlink"},
		{"state dir owned by another user", func(t *testing.T, state, victim string) {
			must(t, os.Mkdir(state, 0o755))
			must(t, os.Chown(state, bob, bob))
			must(t, os.Symlink(victim, filepath.Join(state, "7.spec.tmp")))
		}, "owned by uid 4242"},
		{"world-writable state dir", func(t *testing.T, state, victim string) {
			must(t, os.Mkdir(state, 0o777))
			must(t, os.Chmod(state, 0o777))
		}, "writable by group or other"},
		{"planted tmp symlink", func(t *testing.T, state, victim string) {
			must(t, os.Mkdir(state, 0o700))
			must(t, os.Symlink(victim, filepath.Join(state, "7.spec.tmp")))
		}, ""},
		{"planted marker symlink", func(t *testing.T, state, victim string) {
			must(t, os.Mkdir(state, 0o700))
			must(t, os.Symlink(victim, filepath.Join(state, "7.spec")))
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			victim, check := canary(t)
			state := filepath.Join(t.TempDir(), "state")
			tc.plant(t, state, victim)
			err := within(t, func() error { return writeMarker(state, "7", s) })
			check()
			if tc.want != "" {
				if err == nil || !errors.Is(err, rootfs.ErrUnsafe) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("writeMarker: %v; want a refusal containing %q", err, tc.want)
				}
				return
			}
			must(t, err)
			fi, err := os.Lstat(filepath.Join(state, "7.spec"))
			must(t, err)
			st := fi.Sys().(*syscall.Stat_t)
			if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 || st.Uid != 0 {
				t.Fatalf("marker: mode %v uid %d", fi.Mode(), st.Uid)
			}
			if got, err := readMarker(state, "7"); err != nil || got != "arc" {
				t.Fatalf("readMarker: %q, %v", got, err)
			}
		})
	}
}

// Finding 1: the extern step reads the marker as root and hands it to the
// agent. A symlink, a FIFO, or content that is not a SPEC is refused, and
// the refusal never quotes the file.
func TestReadMarker(t *testing.T) {
	needRoot(t)
	secret := filepath.Join(t.TempDir(), "shadow")
	must(t, os.WriteFile(secret, []byte("root:$6$secret-hash:19000:0:99999:7:::\n"), 0o600))
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, state string)
		spec  string // the SPEC read
		want  string // "" = no error
	}{
		{"none", func(t *testing.T, state string) {}, "", ""},
		{"valid", func(t *testing.T, state string) {
			must(t, os.WriteFile(filepath.Join(state, "7.spec"), []byte("aec+arc,dp=2\n"), 0o600))
		}, "arc+aec,dp=2", ""},
		{"off", func(t *testing.T, state string) {
			must(t, os.WriteFile(filepath.Join(state, "7.spec"), []byte("off\n"), 0o600))
		}, "", ""},
		{"symlink to a secret", func(t *testing.T, state string) {
			must(t, os.Symlink(secret, filepath.Join(state, "7.spec")))
		}, "", "is a symlink"},
		{"fifo", func(t *testing.T, state string) {
			must(t, unix.Mkfifo(filepath.Join(state, "7.spec"), 0o600))
		}, "", "not a regular file"},
		{"not a SPEC", func(t *testing.T, state string) {
			must(t, os.WriteFile(filepath.Join(state, "7.spec"), []byte("root:$6$secret-hash:19000\n"), 0o600))
		}, "", "does not hold a valid SPEC"},
		{"another user's file", func(t *testing.T, state string) {
			must(t, os.WriteFile(filepath.Join(state, "7.spec"), []byte("arc\n"), 0o600))
			must(t, os.Chown(filepath.Join(state, "7.spec"), bob, bob))
		}, "", "owned by uid 4242"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := t.TempDir()
			tc.plant(t, state)
			var got string
			err := within(t, func() (err error) { got, err = readMarker(state, "7"); return })
			if tc.want == "" {
				if err != nil || got != tc.spec {
					t.Fatalf("readMarker: %q, %v; want %q", got, err, tc.spec)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || got != "" {
				t.Fatalf("readMarker: %q, %v; want an error containing %q", got, err, tc.want)
			}
			if strings.Contains(err.Error(), "secret-hash") {
				t.Fatalf("the error quotes the file: %v", err)
			}
		})
	}
}

// Finding 3: the extern step's exit opens <run_dir>/<job>/agent.lock as
// root. A FIFO must not block it, a symlink must not open another file, and
// the job directory is removed only when it is the job user's.
func TestExternExitHostileLock(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		name    string
		plant   func(t *testing.T, jobDir, victim string)
		want    string // substring of the error; "" = none
		removed bool   // <run_dir>/7 is gone afterwards
	}{
		{"clean", func(t *testing.T, jobDir, victim string) {
			must(t, os.WriteFile(filepath.Join(jobDir, "agent.lock"), []byte("1\n"), 0o600))
			must(t, os.Chown(filepath.Join(jobDir, "agent.lock"), bob, bob))
		}, "", true},
		{"fifo lock", func(t *testing.T, jobDir, victim string) {
			must(t, unix.Mkfifo(filepath.Join(jobDir, "agent.lock"), 0o600))
			must(t, os.Chown(filepath.Join(jobDir, "agent.lock"), bob, bob))
		}, "not a regular file", true},
		{"symlink lock", func(t *testing.T, jobDir, victim string) {
			must(t, os.Symlink(victim, filepath.Join(jobDir, "agent.lock")))
		}, "is a symlink", true},
		{"root's file as lock", func(t *testing.T, jobDir, victim string) {
			must(t, os.Link(victim, filepath.Join(jobDir, "agent.lock")))
		}, "owned by uid 0", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			victim, check := canary(t)
			runDir := filepath.Join(t.TempDir(), "run")
			must(t, os.Mkdir(runDir, 0o755))
			jobDir := filepath.Join(runDir, "7")
			must(t, os.Mkdir(jobDir, 0o700))
			must(t, os.Chown(jobDir, bob, bob))
			tc.plant(t, jobDir, victim)
			state := t.TempDir()
			must(t, os.WriteFile(filepath.Join(state, "7.spec"), []byte("arc\n"), 0o600))
			cfg := config.Default()
			cfg.Agent.RunDir = runDir
			err := within(t, func() error {
				return externExit(cfg, state, "7", bob, func(config.Config, string) bool { return false })
			})
			check()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("externExit: %v; want %q", err, tc.want)
			}
			if _, err := os.Lstat(jobDir); tc.removed != errors.Is(err, os.ErrNotExist) {
				t.Fatalf("job dir removed: %v, want %v", err, tc.removed)
			}
			if _, err := os.Lstat(filepath.Join(state, "7.spec")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("marker still there: %v", err)
			}
		})
	}
}

// Finding 3: a job directory that is not the user's (a symlink to a root
// directory, another user's) is neither searched nor removed.
func TestExternExitForeignJobDir(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, runDir, victimDir string)
		want  string
	}{
		{"symlink to a root dir", func(t *testing.T, runDir, victimDir string) {
			must(t, os.Symlink(victimDir, filepath.Join(runDir, "7")))
		}, "is a symlink"},
		{"another user's dir", func(t *testing.T, runDir, victimDir string) {
			must(t, os.Mkdir(filepath.Join(runDir, "7"), 0o700))
			must(t, os.Chown(filepath.Join(runDir, "7"), bob+1, bob+1))
			must(t, os.WriteFile(filepath.Join(runDir, "7", "agent.lock"), nil, 0o600))
		}, "owned by uid 4243"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runDir := filepath.Join(t.TempDir(), "run")
			must(t, os.Mkdir(runDir, 0o755))
			victimDir := t.TempDir()
			must(t, os.WriteFile(filepath.Join(victimDir, "agent.lock"), []byte("keep"), 0o644))
			tc.plant(t, runDir, victimDir)
			cfg := config.Default()
			cfg.Agent.RunDir = runDir
			err := within(t, func() error {
				return externExit(cfg, t.TempDir(), "7", bob, func(config.Config, string) bool { return false })
			})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("externExit: %v; want %q", err, tc.want)
			}
			if _, err := os.Lstat(filepath.Join(victimDir, "agent.lock")); err != nil {
				t.Fatalf("victim's file gone: %v", err)
			}
		})
	}
}

// Finding 3: the agent is signalled through a pidfd, only if it still is a
// process of the job's uid that started before the agent was found.
func TestStopPID(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		name     string
		uid      uint32
		notAfter func(start uint64) uint64
		want     string // "" = stopped
	}{
		{"the agent", bob, func(s uint64) uint64 { return bootTicks() }, ""},
		{"another uid", bob + 1, func(s uint64) uint64 { return bootTicks() }, "not the job's agent"},
		{"started later (pid reused)", bob, func(s uint64) uint64 { return s - 1 }, "not the job's agent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("sleep", "60")
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: bob, Gid: bob}}
			must(t, cmd.Start())
			waited := make(chan error, 1)
			go func() { waited <- cmd.Wait() }()
			defer cmd.Process.Kill()
			_, start, err := procIdentity(cmd.Process.Pid)
			must(t, err)
			err = stopPID(cmd.Process.Pid, tc.uid, tc.notAfter(start), 2*time.Second)
			if tc.want == "" {
				must(t, err)
				select {
				case <-waited:
				case <-time.After(5 * time.Second):
					t.Fatal("not stopped")
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("stopPID: %v; want %q", err, tc.want)
			}
			select {
			case <-waited:
				t.Fatal("a process that is not the agent was signalled")
			case <-time.After(300 * time.Millisecond):
			}
		})
	}
}

// The plan's fixed items are what spawn_agent (shim.c, P_*) reads.
func TestPlanLayout(t *testing.T) {
	cfg := config.Default()
	cfg.Store.HugeTLBFS = ""
	p := plan("/etc/reft/reft.toml", cfg, "arc", "7", 1000, "n1", 0, "extern")
	want := []string{cfg.Agent.RunDir, "7", cfg.Store.TmpfsRoot, "1000", "", cfg.Log.Dir, cfg.Agent.Binary, "--config"}
	for i, w := range want {
		if p[i] != w {
			t.Errorf("plan[%d] = %q, want %q", i, p[i], w)
		}
	}
	for i, it := range p[6:] {
		if it == "" {
			t.Errorf("argv item %d is empty: it would end the plan early", i)
		}
	}
}
