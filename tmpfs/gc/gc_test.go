package gc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/tmpfs"
)

type fakeJobs struct {
	list    map[string]Job // what squeue lists
	show    map[string]Job // what scontrol knows (a superset of list)
	listErr error
	showErr map[string]error
}

func (f *fakeJobs) List(context.Context) (map[string]Job, error) { return f.list, f.listErr }
func (f *fakeJobs) Show(_ context.Context, id string) (Job, bool, error) {
	if err := f.showErr[id]; err != nil {
		return Job{}, false, err
	}
	j, ok := f.show[id]
	return j, ok, nil
}

// makeJob leaves a committed snapshot of job id in root, as a dead agent
// would.
func makeJob(t *testing.T, root, id string) string {
	t.Helper()
	s, err := tmpfs.Open(tmpfs.Options{Root: root, JobID: id})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	o, err := s.Begin(tmpfs.Key{Shard: tmpfs.DefaultShard}, tmpfs.Spec{Step: 1, Buffers: []tmpfs.BufferSpec{{Name: "w", Size: 10000}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.CopyIn(map[string][]byte{"w": make([]byte, 10000)}); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Commit(); err != nil {
		t.Fatal(err)
	}
	return s.Dir()
}

func TestCollect(t *testing.T) {
	jobs := &fakeJobs{
		list: map[string]Job{
			"100": {State: "RUNNING"},
			"101": {State: "PENDING"}, // requeued after a node failure: its restart needs the data
			"102": {State: "COMPLETED"},
			"103": {State: "NODE_FAIL"},
			"105": {State: "SUSPENDED"},
			"106": {State: "COMPLETING"},
			"108": {State: "SOME_FUTURE_STATE"},
		},
		show: map[string]Job{
			"102": {State: "COMPLETED"},
			"103": {State: "NODE_FAIL", Requeue: true}, // about to be requeued
			"104": {State: "PENDING"},                  // submitted after the listing
			"107": {State: "CANCELLED", Requeue: true},
			"109": {State: "FAILED"},
		},
		showErr: map[string]error{"110": errors.New("slurmctld timed out")},
	}
	tests := []struct {
		id      string
		removed bool
		reason  string
	}{
		{"100", false, "job RUNNING"},
		{"101", false, "job PENDING"},
		{"102", true, "job COMPLETED"},
		{"103", false, "requeueable"},
		{"104", false, "job PENDING"},
		{"105", false, "job SUSPENDED"},
		{"106", false, "job COMPLETING"},
		{"107", true, "job CANCELLED"},
		{"108", false, "SOME_FUTURE_STATE"},
		{"109", true, "job FAILED"},
		{"110", false, "could not say"},
		{"111", true, "no longer knows"},
		{"999", false, "own job"},
	}
	for _, dry := range []bool{true, false} {
		t.Run(fmt.Sprintf("dry-run=%v", dry), func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "reft")
			dirs := map[string]string{}
			for _, tc := range tests {
				dirs[tc.id] = makeJob(t, root, tc.id)
			}
			decs, err := Collect(context.Background(), Options{Root: root, UID: -1, Except: "999", DryRun: dry, Jobs: jobs, Log: zerolog.Nop()})
			if err != nil {
				t.Fatal(err)
			}
			if len(decs) != len(tests) {
				t.Fatalf("%d decisions for %d job directories", len(decs), len(tests))
			}
			for _, tc := range tests {
				i := slices.IndexFunc(decs, func(d Decision) bool { return d.Dir.JobID == tc.id })
				d := decs[i]
				if d.Remove != tc.removed || !strings.Contains(d.Reason, tc.reason) {
					t.Errorf("job %s: remove=%v (%s), want %v (%s)", tc.id, d.Remove, d.Reason, tc.removed, tc.reason)
				}
				if tc.removed && d.Bytes < 10000 {
					t.Errorf("job %s: reported %d bytes", tc.id, d.Bytes)
				}
				_, err := os.Stat(dirs[tc.id])
				if gone := os.IsNotExist(err); gone != (tc.removed && !dry) {
					t.Errorf("job %s: directory gone=%v (dry run %v)", tc.id, gone, dry)
				}
			}
		})
	}
}

func TestCollectRemovesNothingWithoutSlurm(t *testing.T) {
	root := filepath.Join(t.TempDir(), "reft")
	dir := makeJob(t, root, "7")
	_, err := Collect(context.Background(), Options{Root: root, UID: -1, Jobs: &fakeJobs{listErr: errors.New("connection refused")}})
	if err == nil || !strings.Contains(err.Error(), "nothing was removed") {
		t.Fatalf("Collect = %v", err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("data removed while Slurm was unreachable: %v", err)
	}
}

// TestCollectAloneAsksNoSlurm: an agent whose own job is the only one in
// the store does not ask Slurm (it would fail here) and removes nothing.
func TestCollectAloneAsksNoSlurm(t *testing.T) {
	root := filepath.Join(t.TempDir(), "reft")
	dir := makeJob(t, root, "7")
	decs, err := Collect(context.Background(), Options{Root: root, UID: -1, Except: "7", Jobs: &fakeJobs{listErr: errors.New("squeue was asked")}})
	if err != nil || len(decs) != 1 || decs[0].Remove || decs[0].Reason != "this agent's own job" {
		t.Fatalf("decisions %+v, %v", decs, err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("own job's data: %v", err)
	}
}

func TestCollectSparesLiveAgent(t *testing.T) {
	root := filepath.Join(t.TempDir(), "reft")
	s, err := tmpfs.Open(tmpfs.Options{Root: root, JobID: "8"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	decs, err := Collect(context.Background(), Options{Root: root, UID: -1, Jobs: &fakeJobs{}, Log: zerolog.Nop()})
	if err != nil || len(decs) != 1 || decs[0].Remove || !strings.Contains(decs[0].Reason, "agent is still running") {
		t.Fatalf("decisions %+v, %v", decs, err)
	}
	if _, err := os.Stat(s.Dir()); err != nil {
		t.Fatal("a live agent's store was removed")
	}
}

func TestCollectOneUser(t *testing.T) {
	root := filepath.Join(t.TempDir(), "reft")
	makeJob(t, root, "9") // uid 0's
	decs, err := Collect(context.Background(), Options{Root: root, UID: 1234, Jobs: &fakeJobs{}})
	if err != nil || len(decs) != 0 {
		t.Fatalf("another user's collection touched uid %d's jobs: %+v %v", os.Geteuid(), decs, err)
	}
}

// fakeSlurm writes squeue and scontrol stand-ins that log their arguments.
func fakeSlurm(t *testing.T, squeueOut, scontrolScript string) (Slurm, string) {
	t.Helper()
	dir := t.TempDir()
	argLog := filepath.Join(dir, "args")
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		script := "#!/bin/sh\necho \"$0 $*\" >> " + argLog + "\n" + body
		if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return Slurm{
		Squeue:   write("squeue", "cat <<'EOF'\n"+squeueOut+"EOF\n"),
		Scontrol: write("scontrol", scontrolScript),
	}, argLog
}

const fakeScontrol = `case "$4" in
201) echo "JobId=201 JobName=train UserId=alice(1000) JobState=NODE_FAIL Reason=None Requeue=1 Restarts=0" ;;
202) echo "JobId=202 JobName=train JobState=COMPLETED Requeue=0" ;;
*) echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1 ;;
esac
`

func TestSlurmCommands(t *testing.T) {
	s, argLog := fakeSlurm(t, "200 RUNNING\n201 NODE_FAIL\n202 COMPLETED\n", fakeScontrol)
	ctx := context.Background()
	jobs, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 3 || jobs["200"].State != "RUNNING" || jobs["202"].State != "COMPLETED" {
		t.Fatalf("List = %+v", jobs)
	}
	tests := []struct {
		id      string
		found   bool
		state   string
		requeue bool
	}{
		{"201", true, "NODE_FAIL", true},
		{"202", true, "COMPLETED", false},
		{"203", false, "", false},
	}
	for _, tc := range tests {
		j, found, err := s.Show(ctx, tc.id)
		if err != nil || found != tc.found || j.State != tc.state || j.Requeue != tc.requeue {
			t.Errorf("Show(%s) = %+v %v %v", tc.id, j, found, err)
		}
	}
	args, _ := os.ReadFile(argLog)
	if !strings.Contains(string(args), "squeue -h -a -r -t all -o %A %T") || !strings.Contains(string(args), "scontrol -o show job 201") {
		t.Fatalf("commands run:\n%s", args)
	}
	// [agent] slurm_conf reaches the commands as SLURM_CONF.
	withConf, confLog := fakeSlurm(t, "", "echo \"conf=$SLURM_CONF\" >> $(dirname $0)/args; echo JobState=RUNNING\n")
	withConf.Conf = "/etc/slurm-test/slurm.conf"
	if _, _, err := withConf.Show(ctx, "5"); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(confLog); !strings.Contains(string(got), "conf=/etc/slurm-test/slurm.conf") {
		t.Fatalf("SLURM_CONF not passed:\n%s", got)
	}
	bad, _ := fakeSlurm(t, "garbage\n", "exit 3\n")
	if _, err := bad.List(ctx); err == nil {
		t.Fatal("List accepted a malformed line")
	}
	if _, _, err := bad.Show(ctx, "1"); err == nil {
		t.Fatal("Show hid an scontrol failure")
	}
}

func TestCommand(t *testing.T) {
	root := filepath.Join(t.TempDir(), "reft")
	live, dead, gone := makeJob(t, root, "201"), makeJob(t, root, "202"), makeJob(t, root, "203")
	s, _ := fakeSlurm(t, "201 NODE_FAIL\n202 COMPLETED\n", fakeScontrol)
	args := []string{"--root", root, "--squeue", s.Squeue, "--scontrol", s.Scontrol}

	var out, errb bytes.Buffer
	if code := Command(append(args, "--dry-run"), &out, &errb); code != 0 {
		t.Fatalf("dry run exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"would remove " + dead + " (job COMPLETED", "would remove " + gone + " (Slurm no longer knows the job"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("dry run output lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), live) {
		t.Fatalf("dry run would remove the requeueable job:\n%s", out.String())
	}
	for _, d := range []string{live, dead, gone} {
		if _, err := os.Stat(d); err != nil {
			t.Fatalf("dry run removed %s", d)
		}
	}
	out.Reset()
	if code := Command(args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "removed "+dead) {
		t.Fatalf("output:\n%s", out.String())
	}
	for d, want := range map[string]bool{live: true, dead: false, gone: false} {
		if _, err := os.Stat(d); (err == nil) != want {
			t.Errorf("%s exists=%v, want %v", d, err == nil, want)
		}
	}
	if code := Command([]string{"--bogus"}, &out, &errb); code != 2 {
		t.Fatalf("bad flag: exit %d", code)
	}
}

// TestCollectMaxAge: a store unchanged beyond MaxAge goes whatever Slurm
// says (a pending job's too); a younger one is decided by Slurm, or kept
// without asking when no Jobs is given (an agent's start, the epilog).
func TestCollectMaxAge(t *testing.T) {
	now := time.Now()
	jobs := &fakeJobs{list: map[string]Job{"1": {State: "PENDING"}, "2": {State: "PENDING"}}}
	tests := []struct {
		name    string
		jobs    Jobs
		removed map[string]bool
		reason  map[string]string
	}{
		{"with Slurm", jobs, map[string]bool{"1": true, "2": false},
			map[string]string{"1": "beyond store.max_age", "2": "job PENDING"}},
		{"without Slurm", nil, map[string]bool{"1": true, "2": false},
			map[string]string{"1": "beyond store.max_age", "2": "Slurm not asked"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "reft")
			old := makeJob(t, root, "1")
			makeJob(t, root, "2")
			past := now.Add(-3 * time.Hour)
			filepath.Walk(old, func(p string, _ os.FileInfo, _ error) error { return os.Chtimes(p, past, past) })
			decs, err := Collect(context.Background(), Options{Root: root, UID: -1, MaxAge: 2 * time.Hour, Jobs: tc.jobs,
				Log: zerolog.Nop(), Now: func() time.Time { return now }})
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range decs {
				if d.Remove != tc.removed[d.Dir.JobID] || !strings.Contains(d.Reason, tc.reason[d.Dir.JobID]) {
					t.Errorf("job %s: remove=%v (%s), want %v (%s)", d.Dir.JobID, d.Remove, d.Reason, tc.removed[d.Dir.JobID], tc.reason[d.Dir.JobID])
				}
			}
			if _, err := os.Stat(old); !os.IsNotExist(err) {
				t.Errorf("the old store is still there (%v)", err)
			}
		})
	}
}
