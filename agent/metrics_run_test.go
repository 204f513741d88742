package agent

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestAgentMetricsTextfile: a reft-agent process (as nobody) with
// metrics.textfile_dir writes reft_<job>_<node>.prom, its own, mode 0644,
// and removes it at SIGTERM; with a directory it must not use it logs why
// and serves anyway.
func TestAgentMetricsTextfile(t *testing.T) {
	tests := []struct {
		name    string
		mode    os.FileMode
		written bool
		log     string // in the agent's log
	}{
		{"sticky", os.ModeSticky | 0o777, true, ""},
		{"world-writable, not sticky", 0o777, false, "writable by others without the sticky bit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newAgentFixture(t, "")
			dir := filepath.Join(f.dir, "prom")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			os.Chmod(dir, tt.mode)
			cf, err := os.OpenFile(f.cfg, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			_, err = cf.WriteString("[metrics]\ntextfile_dir = \"" + dir + "\"\n")
			cf.Close()
			if err != nil {
				t.Fatal(err)
			}
			cmd := f.start(t, "arc")
			sock := SocketPath(f.runDir, "7")
			prom := filepath.Join(dir, "reft_7_n9.prom")
			logPath := filepath.Join(f.dir, "log", "7", "n9.jsonl")
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				_, serr := os.Stat(sock)
				_, perr := os.Stat(prom)
				logData, _ := os.ReadFile(logPath)
				if serr == nil && (tt.written && perr == nil || !tt.written && strings.Contains(string(logData), tt.log)) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("agent socket (%v) or textfile (%v) never appeared; log:\n%s", serr, perr, logData)
				}
			}
			if tt.written {
				fi, err := os.Lstat(prom)
				if err != nil {
					t.Fatal(err)
				}
				if fi.Mode() != 0o644 || fi.Sys().(*syscall.Stat_t).Uid != nobody {
					t.Errorf("textfile %v uid %d, want 0644 of uid %d", fi.Mode(), fi.Sys().(*syscall.Stat_t).Uid, nobody)
				}
				b, _ := os.ReadFile(prom)
				if !strings.Contains(string(b), `reft_agent_info{job_id="7",node="n9",spec="arc"`) {
					t.Errorf("textfile lacks the agent's info:\n%s", b)
				}
			} else if _, err := os.Stat(prom); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("textfile written into a directory the agent must not use: %v", err)
			}
			cmd.Process.Signal(syscall.SIGTERM)
			if err := cmd.Wait(); err != nil {
				t.Fatalf("agent exit after SIGTERM: %v", err)
			}
			if _, err := os.Lstat(prom); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("textfile left after SIGTERM: %v", err)
			}
		})
	}
}
