package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/tmpfs"
)

func TestParseJobFields(t *testing.T) {
	tests := []struct {
		name, out, job string
		state          string // "" when an error is wanted
	}{
		{"one line", "JobId=7 JobName=x JobState=COMPLETING Reason=None Restarts=1\n", "7", "COMPLETING"},
		{"array: the line of the job", "JobId=8 ArrayJobId=7 JobState=RUNNING\nJobId=9 ArrayJobId=7 JobState=PENDING\n", "9", "PENDING"},
		{"no JobState", "JobId=7 JobName=x\n", "7", ""},
		{"another job", "JobId=70 JobState=RUNNING\n", "7", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, err := parseJobFields(tc.out, tc.job)
			if tc.state == "" {
				if err == nil {
					t.Fatalf("parseJobFields = %v, want an error", f)
				}
				return
			}
			if err != nil || f["JobState"] != tc.state {
				t.Fatalf("parseJobFields = %v, %v; want JobState %s", f, err, tc.state)
			}
		})
	}
}

// TestRunsAgain: the epilog keeps a store only for a job Slurm runs again.
// The scontrol lines are what Slurm 22.05 showed during the epilog of a
// completed job and of a requeued one (tests/e2e/hostile_cleanup_test.go).
func TestRunsAgain(t *testing.T) {
	noAcct := func(context.Context) (int, error) { return 0, errors.New("accounting storage is disabled") }
	runs := func(n int) func(context.Context) (int, error) {
		return func(context.Context) (int, error) { return n, nil }
	}
	tests := []struct {
		name    string
		fields  jobFields
		runs    func(context.Context) (int, error)
		keep    bool
		wantErr bool
	}{
		{"gone from slurmctld", nil, noAcct, false, false},
		{"completed, never requeued", jobFields{"JobState": "COMPLETING", "Restarts": "0"}, noAcct, false, false},
		{"requeued now (first time)", jobFields{"JobState": "COMPLETING", "Restarts": "1"}, runs(1), true, false},
		{"requeued now (third time)", jobFields{"JobState": "COMPLETING", "Restarts": "3"}, runs(3), true, false},
		{"ended after an earlier requeue", jobFields{"JobState": "COMPLETING", "Restarts": "1"}, runs(2), false, false},
		{"requeued before, no accounting", jobFields{"JobState": "COMPLETING", "Restarts": "1"}, noAcct, false, true},
		{"already pending again", jobFields{"JobState": "PENDING", "Restarts": "1"}, noAcct, true, false},
		{"final state shown", jobFields{"JobState": "CANCELLED", "Restarts": "0"}, noAcct, false, false},
		{"garbled restarts", jobFields{"JobState": "COMPLETING", "Restarts": "x"}, noAcct, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			keep, why, err := runsAgain(context.Background(), tc.fields, tc.runs)
			if (err != nil) != tc.wantErr || keep != tc.keep {
				t.Fatalf("runsAgain = %v (%s), %v; want keep %v, error %v", keep, why, err, tc.keep, tc.wantErr)
			}
			if err == nil && why == "" {
				t.Error("no reason given")
			}
		})
	}
}

// makeStore leaves a store of job for the test's user under root.
func makeStore(t *testing.T, root, job string) string {
	t.Helper()
	s, err := tmpfs.Open(tmpfs.Options{Root: root, JobID: job})
	if err != nil {
		t.Fatal(err)
	}
	dir := s.Dir()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestJobEpilog: the epilog removes the ended job's store (and nothing
// outside it that the user linked from it), keeps a requeued job's, says
// so, and applies the age limit to every other store on the node without
// asking Slurm about them.
func TestJobEpilog(t *testing.T) {
	ended := jobFields{"JobState": "COMPLETING", "Restarts": "0"}
	requeued := jobFields{"JobState": "COMPLETING", "Restarts": "1"}
	epilogLockWait = time.Second
	tests := []struct {
		name    string
		fields  jobFields
		showErr error
		lock    time.Duration // an agent holds the store's lock this long; <0: throughout
		gone    bool
		msg     string
		errMsg  string
	}{
		{"ended", ended, nil, 0, true, "store removed", ""},
		{"ended, its agent on its way out", ended, nil, 300 * time.Millisecond, true, "store removed", ""},
		{"ended, its agent stays", ended, nil, -1, false, "an agent of the job still holds it", "-"},
		{"requeued", requeued, nil, 0, false, "store kept", ""},
		{"slurmctld unreachable", nil, errors.New("Unable to contact slurm controller"), 0, false, "", "kept"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			root := filepath.Join(base, "reft")
			dir := makeStore(t, root, "5")
			canary := filepath.Join(base, "canary")
			os.WriteFile(canary, []byte("root's"), 0o644)
			os.MkdirAll(filepath.Join(dir, "r0", "state"), 0o700)
			os.Symlink(canary, filepath.Join(dir, "r0", "state", "arena-0"))
			old := makeStore(t, root, "4")
			young := makeStore(t, root, "6")
			past := time.Now().Add(-100 * time.Hour)
			filepath.Walk(old, func(p string, _ os.FileInfo, _ error) error { return os.Chtimes(p, past, past) })

			if tc.lock != 0 {
				f, err := os.OpenFile(filepath.Join(dir, tmpfs.LockName), os.O_RDWR|os.O_CREATE, 0o600)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
					t.Fatal(err)
				}
				if tc.lock > 0 {
					time.AfterFunc(tc.lock, func() { unix.Flock(int(f.Fd()), unix.LOCK_UN) })
				}
			}
			cfg := config.Default()
			cfg.Store.TmpfsRoot = root
			var asked []string
			show := func(_ context.Context, job string) (jobFields, error) {
				asked = append(asked, job)
				return tc.fields, tc.showErr
			}
			msg, err := jobEpilog(context.Background(), cfg, "5", os.Getuid(), show,
				func(context.Context, string) (int, error) { return 1, nil })
			if _, serr := os.Stat(dir); os.IsNotExist(serr) != tc.gone {
				t.Errorf("store of the job removed = %v, want %v (%q, %v)", !tc.gone, tc.gone, msg, err)
			}
			if !strings.Contains(msg, tc.msg) {
				t.Errorf("message %q, want %q", msg, tc.msg)
			}
			if tc.errMsg == "-" {
				// nothing to say about errors
			} else if tc.errMsg == "" && tc.gone {
				// the canary link is refused and reported
				if err == nil || !strings.Contains(err.Error(), "left alone") {
					t.Errorf("error %v, want the refused link named", err)
				}
			} else if tc.errMsg != "" && (err == nil || !strings.Contains(err.Error(), tc.errMsg)) {
				t.Errorf("error %v, want %q", err, tc.errMsg)
			}
			if b, err := os.ReadFile(canary); err != nil || string(b) != "root's" {
				t.Errorf("canary: %q, %v", b, err)
			}
			if _, err := os.Stat(old); !os.IsNotExist(err) {
				t.Errorf("the store past max_age is still there (%v)", err)
			}
			if _, err := os.Stat(young); err != nil {
				t.Errorf("the young store of another job: %v", err)
			}
			if len(asked) != 1 || asked[0] != "5" {
				t.Errorf("asked Slurm about %v, want only job 5", asked)
			}
		})
	}
}
