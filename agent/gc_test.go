package agent

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/logging/logtest"
	"github.com/reft-hpc/reft/tmpfs"
)

// leaveStore commits a generation of job into root, as an agent killed
// with its job would leave it.
func leaveStore(t *testing.T, root, job string) string {
	t.Helper()
	st, err := tmpfs.Open(tmpfs.Options{Root: root, JobID: job})
	if err != nil {
		t.Fatal(err)
	}
	saveSteps(t, st, 1)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	return st.Dir()
}

// age sets the modification time of everything under dir to d ago.
func age(t *testing.T, dir string, d time.Duration) {
	t.Helper()
	old := time.Now().Add(-d)
	if err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Chtimes(p, old, old)
	}); err != nil {
		t.Fatal(err)
	}
}

// TestCollectOnStart: the agent's collection at start removes its user's
// stores unchanged beyond store.max_age, never its own job's nor one whose
// agent holds its lock, keeps younger ones without asking anybody, and
// says what it did in one line.
func TestCollectOnStart(t *testing.T) {
	const maxAge = time.Hour
	tests := []struct {
		name    string
		maxAge  time.Duration
		gone    []string
		summary string // in the one gc_done line; "" for none
	}{
		{"age limit", maxAge, []string{"13"}, `"removed":1`},
		{"disabled", 0, nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			dirs := map[string]string{}
			for _, job := range []string{"10", "11", "13"} {
				dirs[job] = leaveStore(t, root, job)
			}
			age(t, dirs["13"], 2*maxAge)
			own, err := tmpfs.Open(tmpfs.Options{Root: root, JobID: "7"}) // this agent's store, open
			if err != nil {
				t.Fatal(err)
			}
			defer own.Close()
			dirs["7"] = own.Dir()
			age(t, dirs["7"], 2*maxAge)
			running, err := tmpfs.Open(tmpfs.Options{Root: root, JobID: "10"}) // another job's live agent
			if err != nil {
				t.Fatal(err)
			}
			defer running.Close()
			age(t, dirs["10"], 2*maxAge)

			var buf logtest.Buffer
			collectOnStart(context.Background(), root, "", os.Getuid(), "7", tc.maxAge, zerolog.New(&buf))
			for job, dir := range dirs {
				_, err := os.Stat(dir)
				wantGone := slices.Contains(tc.gone, job)
				if gone := errors.Is(err, os.ErrNotExist); gone != wantGone {
					t.Errorf("job %s: removed = %v, want %v", job, gone, wantGone)
				}
			}
			var summaries []string
			for _, l := range strings.Split(buf.String(), "\n") {
				if strings.Contains(l, `"event":"gc_done"`) || strings.Contains(l, `"event":"gc_skipped"`) {
					summaries = append(summaries, l)
				}
			}
			if tc.summary == "" {
				if len(summaries) != 0 {
					t.Fatalf("summary lines %q, want none", summaries)
				}
				return
			}
			if len(summaries) != 1 || !strings.Contains(summaries[0], `"event":"gc_done"`) || !strings.Contains(summaries[0], tc.summary) {
				t.Fatalf("summary lines %q, want one gc_done naming %q; log:\n%s", summaries, tc.summary, buf.String())
			}
		})
	}
}

// TestAgentStartCollectsGarbage: reft-agent, started as the job's user,
// removes the user's store that sat unchanged beyond store.max_age and
// keeps a younger one and its own, without running squeue or asking
// scontrol about other jobs (finding 6 of issue 14: every agent of every
// job asking slurmctld at once).
func TestAgentStartCollectsGarbage(t *testing.T) {
	f := newAgentFixture(t, "")
	bin := filepath.Join(f.dir, "bin")
	os.Mkdir(bin, 0o755)
	asked := filepath.Join(f.dir, "asked")
	os.WriteFile(asked, nil, 0o666)
	os.Chmod(asked, 0o666)
	for name, body := range map[string]string{
		"squeue": "echo squeue \"$@\" >>" + asked + "\nprintf '6 PENDING\\n8 NODE_FAIL\\n'\n",
		// -o show job ID about another job is the herd; the job watch
		// (show job 7) fails like an unreachable slurmctld, which the
		// agent survives.
		"scontrol": `[ "$4" = "7" ] || echo scontrol "$@" >>` + asked + `
echo "Unable to contact slurm controller" >&2; exit 1
`,
	} {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"+body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	user := filepath.Join(f.dir, "shm", strconv.Itoa(nobody))
	dirs := map[string]string{}
	for _, job := range []string{"5", "6"} {
		dirs[job] = filepath.Join(user, job)
		os.MkdirAll(filepath.Join(dirs[job], "r0", "state"), 0o700)
		os.WriteFile(filepath.Join(dirs[job], "r0", "state", "arena-0"), make([]byte, 4096), 0o600)
		filepath.Walk(dirs[job], func(p string, _ os.FileInfo, _ error) error { return os.Chown(p, nobody, nobody) })
	}
	age(t, dirs["5"], 100*time.Hour) // beyond the default max_age of 72h
	cmd := exec.Command(f.bin, "--config", f.cfg, "--job", "7", "--node", "n9", "--spec", "arc", "--uid", strconv.Itoa(nobody))
	cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })

	logFile := filepath.Join(f.dir, "log", "7", "n9.jsonl")
	var logData []byte
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(string(logData), `"event":"gc_done"`); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no gc_done in the agent's log within 30 s:\n%s", logData)
		}
		logData, _ = os.ReadFile(logFile)
	}
	for job, wantGone := range map[string]bool{"5": true, "6": false} {
		if _, err := os.Stat(dirs[job]); errors.Is(err, os.ErrNotExist) != wantGone {
			t.Errorf("job %s: removed = %v, want %v (err %v)", job, !wantGone, wantGone, err)
		}
	}
	if _, err := os.Stat(filepath.Join(user, "7")); err != nil {
		t.Errorf("the agent's own store: %v", err)
	}
	if !strings.Contains(string(logData), `"removed":1`) || !strings.Contains(string(logData), "beyond store.max_age") {
		t.Errorf("agent log:\n%s", logData)
	}
	if b, _ := os.ReadFile(asked); len(b) > 0 {
		t.Errorf("the agent asked slurmctld about other jobs at start:\n%s", b)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("agent exit after SIGTERM: %v", err)
	}
}
