package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/reft-hpc/reft/agent/logging/logtest"
	"github.com/reft-hpc/reft/agent/proto"
)

func TestRunRefusesRoot(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("run the unit tests as root: this test checks that the agent refuses root")
	}
	err := Run(context.Background(), Options{Job: "1", Node: "n1", Spec: "arc", UID: 0})
	if err == nil || !strings.Contains(err.Error(), "refuses to run as root") {
		t.Fatalf("Run as root: %v", err)
	}
}

// agentFixture builds reft-agent and a world-readable sandbox with a config
// whose directories are all inside it.
type agentFixture struct {
	bin, dir, cfg, runDir string
}

func newAgentFixture(t *testing.T, extra string) agentFixture {
	t.Helper()
	if os.Getuid() != 0 {
		t.Fatal("run the unit tests as root: the agent is started as uid 65534 here")
	}
	dir, err := os.MkdirTemp("", "reft-agent-run-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	f := agentFixture{bin: filepath.Join(dir, "reft-agent"), dir: dir, cfg: filepath.Join(dir, "reft.toml"), runDir: filepath.Join(dir, "run")}
	out, err := exec.Command("go", "build", "-o", f.bin, "../cmd/reft-agent").CombinedOutput()
	if err != nil {
		t.Fatalf("building reft-agent: %v\n%s", err, out)
	}
	for _, d := range []string{"run", "shm", "log"} {
		os.Mkdir(filepath.Join(dir, d), 0o755)
	}
	os.Chmod(filepath.Join(dir, "log"), 0o1777)
	// What the plugin does as root before starting the agent.
	for _, d := range []string{filepath.Join(dir, "run", "7"), filepath.Join(dir, "shm", strconv.Itoa(nobody))} {
		os.Mkdir(d, 0o700)
		os.Chown(d, nobody, nobody)
	}
	conf := fmt.Sprintf("[store]\ntmpfs_root = %q\n%s\n[agent]\nrun_dir = %q\n[log]\ndir = %q\nlevel = \"debug\"\n",
		filepath.Join(dir, "shm"), extra, f.runDir, filepath.Join(dir, "log"))
	if err := os.WriteFile(f.cfg, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f agentFixture) start(t *testing.T, spec string) *exec.Cmd {
	cmd := exec.Command(f.bin, "--config", f.cfg, "--job", "7", "--node", "n9", "--spec", spec,
		"--uid", strconv.Itoa(nobody), "--restart", "3", "--started-by", "test")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

func TestAgentProcessLifecycle(t *testing.T) {
	f := newAgentFixture(t, "")
	cmd := f.start(t, "aec+arc,dp=2")
	sock := SocketPath(f.runDir, "7")
	var c net.Conn
	var err error
	for deadline := time.Now().Add(20 * time.Second); ; {
		if c, err = net.Dial("unix", sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent socket %s never answered: %v", sock, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	defer c.Close()
	st, err := os.Stat(sock)
	if err != nil || st.Mode().Perm() != 0o600 || st.Sys().(*syscall.Stat_t).Uid != nobody {
		t.Fatalf("socket %v, %v: want 0600 owned by %d", st.Mode(), err, nobody)
	}
	// root is not the job's user: refused.
	var h proto.HelloReply
	var pe *proto.Error
	if err := proto.Call(c, proto.THello, 1, nil, &h); !errors.As(err, &pe) || pe.Code != proto.CodeForbidden {
		t.Fatalf("root's hello: %v, want forbidden", err)
	}
	// A second agent for the same job exits at once and leaves the first alone.
	second := exec.Command(f.bin, "--config", f.cfg, "--job", "7", "--node", "n9", "--spec", "arc", "--uid", strconv.Itoa(nobody))
	second.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out, err := second.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "already serves this job") {
		t.Fatalf("second agent: %v\n%s", err, out)
	}
	// The log carries job, node, restart.
	logData, err := os.ReadFile(filepath.Join(f.dir, "log", "7", "n9.jsonl"))
	if err != nil || !strings.Contains(string(logData), `"job":"7"`) || !strings.Contains(string(logData), `"restart":3`) ||
		!strings.Contains(string(logData), `"spec":"arc+aec,dp=2"`) {
		t.Fatalf("agent log: %v\n%s", err, logData)
	}
	for _, err := range logtest.CheckLines(string(logData)) {
		t.Error(err)
	}
	// SIGTERM: clean exit, socket gone.
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("agent exit after SIGTERM: %v", err)
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket left after SIGTERM: %v", err)
	}
}

func TestAgentExitsWhenRunDirRemoved(t *testing.T) {
	f := newAgentFixture(t, "")
	cmd := f.start(t, "arc")
	sock := SocketPath(f.runDir, "7")
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("agent socket never appeared")
		}
	}
	os.RemoveAll(filepath.Join(f.runDir, "7"))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("agent exit: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("agent still running 30 s after its run directory was removed")
	}
}

func TestAgentStartErrorsAreRecorded(t *testing.T) {
	tests := []struct{ name, extra, spec, want string }{
		{"no memory budget", "memory_budget = 1024", "arc", "no memory budget: store.memory_budget = 1024 gives 1024 bytes"},
		{"bad persist dir", "", "arc,persist_dir=/nonexistent/reft", "persistent checkpoint directory /nonexistent/reft (persist_dir= in --reft)"},
		{"bad spec", "", "arc+bogus", `unknown mode "bogus"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newAgentFixture(t, tt.extra)
			cmd := f.start(t, tt.spec)
			err := cmd.Wait()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Fatalf("agent exit: %v, want status 1", err)
			}
			msg, err := os.ReadFile(filepath.Join(f.runDir, "7", ErrorName))
			if err != nil || !strings.Contains(string(msg), tt.want) {
				t.Fatalf("%s: %q, %v; want %q", ErrorName, msg, err, tt.want)
			}
		})
	}
}

// TestTakeLockWait: a lock whose holder serves the socket is refused at
// once; one whose holder serves none (an agent stopping) is waited for,
// up to the limit.
func TestTakeLockWait(t *testing.T) {
	cases := []struct {
		name    string
		held    bool
		serving bool
		release time.Duration // the holder lets go after this; 0: never
		want    error
	}{
		{"free", false, false, 0, nil},
		{"held by a serving agent", true, true, 0, ErrAlreadyRunning},
		{"held by a stopping agent that exits", true, false, 150 * time.Millisecond, nil},
		{"held by a stopping agent that never exits", true, false, 0, ErrAlreadyRunning},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			lock, sock := filepath.Join(dir, LockName), filepath.Join(dir, SocketName)
			if tc.held {
				h, err := takeLock(lock)
				if err != nil {
					t.Fatal(err)
				}
				defer h.Close()
				if tc.release > 0 {
					time.AfterFunc(tc.release, func() { h.Close() })
				}
			}
			if tc.serving {
				ln, err := net.Listen("unix", sock)
				if err != nil {
					t.Fatal(err)
				}
				defer ln.Close()
			}
			f, err := takeLockWait(lock, sock, time.Second)
			if !errors.Is(err, tc.want) || (err == nil) != (f != nil) {
				t.Fatalf("takeLockWait = %v, %v; want %v", f, err, tc.want)
			}
			if f != nil {
				f.Close()
			}
		})
	}
}
