package agent

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/logging/logtest"
	"github.com/reft-hpc/reft/tmpfs"
	"github.com/reft-hpc/reft/tmpfs/gc"
)

// gcJobs is a job lister with fixed answers: squeue's list and what
// scontrol knows (unknown ids are "Invalid job id").
type gcJobs struct {
	list    map[string]gc.Job
	show    map[string]gc.Job
	listErr error
}

func (f gcJobs) List(context.Context) (map[string]gc.Job, error) { return f.list, f.listErr }
func (f gcJobs) Show(_ context.Context, id string) (gc.Job, bool, error) {
	j, ok := f.show[id]
	return j, ok, nil
}

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

// TestCollectOnStart: the agent's collection at start removes the data of
// dead jobs only: never its own job's, a running job's (whose agent holds
// its store's lock), a pending or requeued job's, nor anything when Slurm
// cannot be asked, which it says once.
func TestCollectOnStart(t *testing.T) {
	alive := gcJobs{
		list: map[string]gc.Job{
			"10": {State: "RUNNING"},
			"11": {State: "PENDING"},   // requeued after a node failure: its restart needs the data
			"12": {State: "NODE_FAIL"}, // about to be requeued
			"13": {State: "COMPLETED"},
		},
		show: map[string]gc.Job{"12": {State: "NODE_FAIL", Requeue: true}, "13": {State: "COMPLETED"}},
	}
	tests := []struct {
		name    string
		jobs    gcJobs
		gone    []string
		log     string // in the one summary line
		summary string // its event
	}{
		{"slurm answers", alive, []string{"13", "14"}, `"removed":2`, "gc_done"},
		{"squeue unavailable", gcJobs{listErr: errors.New(`exec: "squeue": executable file not found in $PATH`)}, nil,
			"nothing was removed", "gc_skipped"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			dirs := map[string]string{}
			for _, job := range []string{"10", "11", "12", "13", "14"} { // 14: Slurm no longer knows it
				dirs[job] = leaveStore(t, root, job)
			}
			own, err := tmpfs.Open(tmpfs.Options{Root: root, JobID: "7"}) // this agent's store, open
			if err != nil {
				t.Fatal(err)
			}
			defer own.Close()
			dirs["7"] = own.Dir()
			running, err := tmpfs.Open(tmpfs.Options{Root: root, JobID: "10"}) // another job's live agent
			if err != nil {
				t.Fatal(err)
			}
			defer running.Close()

			var buf logtest.Buffer
			collectOnStart(context.Background(), root, os.Getuid(), "7", tc.jobs, zerolog.New(&buf))
			for job, dir := range dirs {
				_, err := os.Stat(dir)
				wantGone := strings.Contains(" "+strings.Join(tc.gone, " ")+" ", " "+job+" ")
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
			if len(summaries) != 1 || !strings.Contains(summaries[0], `"event":"`+tc.summary+`"`) || !strings.Contains(summaries[0], tc.log) {
				t.Fatalf("summary lines %q, want one %s naming %q; log:\n%s", summaries, tc.summary, tc.log, buf.String())
			}
		})
	}
}

// TestAgentStartCollectsGarbage: reft-agent, started as the job's user,
// asks Slurm (squeue and scontrol stand-ins on its PATH) and removes the
// user's data of a job Slurm no longer knows, keeping a pending one, a
// requeueable one and its own.
func TestAgentStartCollectsGarbage(t *testing.T) {
	f := newAgentFixture(t, "")
	bin := filepath.Join(f.dir, "bin")
	os.Mkdir(bin, 0o755)
	for name, body := range map[string]string{
		"squeue": "printf '6 PENDING\\n8 NODE_FAIL\\n'\n",
		// -o show job ID; anything else (the job watch) fails like an
		// unreachable slurmctld, which the agent survives.
		"scontrol": `[ "$2 $3" = "show job" ] || { echo "Unable to contact slurm controller" >&2; exit 1; }
case "$4" in
8) echo "JobId=8 JobState=NODE_FAIL Requeue=1" ;;
*) echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1 ;;
esac
`,
	} {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"+body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	user := filepath.Join(f.dir, "shm", strconv.Itoa(nobody))
	dirs := map[string]string{}
	for _, job := range []string{"5", "6", "8"} {
		dirs[job] = filepath.Join(user, job)
		os.MkdirAll(filepath.Join(dirs[job], "r0", "state"), 0o700)
		os.WriteFile(filepath.Join(dirs[job], "r0", "state", "arena-0"), make([]byte, 4096), 0o600)
		filepath.Walk(dirs[job], func(p string, _ os.FileInfo, _ error) error { return os.Chown(p, nobody, nobody) })
	}
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
	for job, wantGone := range map[string]bool{"5": true, "6": false, "8": false} {
		if _, err := os.Stat(dirs[job]); errors.Is(err, os.ErrNotExist) != wantGone {
			t.Errorf("job %s: removed = %v, want %v (err %v)", job, !wantGone, wantGone, err)
		}
	}
	if _, err := os.Stat(filepath.Join(user, "7")); err != nil {
		t.Errorf("the agent's own store: %v", err)
	}
	if !strings.Contains(string(logData), `"removed":1`) || !strings.Contains(string(logData), "Slurm no longer knows the job") {
		t.Errorf("agent log:\n%s", logData)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("agent exit after SIGTERM: %v", err)
	}
}
