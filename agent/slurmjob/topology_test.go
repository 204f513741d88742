package slurmjob

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// fakeScontrol answers like Slurm 22.05's scontrol for job 812 on
// n[2-3],gpu01 (a job name that contains " NodeList=" must not fool the
// parser), and fails unless SLURM_CONF is the configured path.
const fakeScontrol = `#!/bin/sh
[ "$SLURM_CONF" = /etc/site/slurm.conf ] || { echo "scontrol: error: s_p_parse_file: unable to read $SLURM_CONF" >&2; exit 1; }
case "$*" in
"show job -o 812")
	echo 'JobId=812 JobName=x NodeList=evil JobState=COMPLETED UserId=alice(1001) Account=a QOS=normal JobState=RUNNING ReqNodeList=(null) ExcNodeList=(null) NodeList=n[2-3],gpu01 BatchHost=n2 NumNodes=3' ;;
"show job -o 813")
	echo 'JobId=813 JobName=p QOS=(null) WCKey=*x JobState=PENDING ReqNodeList=(null) ExcNodeList=(null) NodeList=(null) NumNodes=2' ;;
"show hostnames n[2-3],gpu01")
	printf 'n2\nn3\ngpu01\n' ;;
"show hostnames n[2-3]")
	printf 'n2\nn3\n' ;;
"show step -o 812.0")
	echo 'StepId=812.0 UserId=1001 StartTime=2026-11-22T03:36:29 TimeLimit=UNLIMITED State=RUNNING Partition=debug NodeList=n[2-3] Nodes=2 CPUs=2 Tasks=2 Name=train' ;;
"show node -o n[2-3],gpu01")
	echo 'NodeName=gpu01 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.0.0.9 NodeHostName=gpu01 Port=6818'
	echo 'NodeName=n2 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.0.0.2 NodeHostName=n2 Port=6818'
	echo 'NodeName=n3 Arch=x86_64 CoresPerSocket=1 NodeAddr=n3-ib NodeHostName=n3 Port=6818' ;;
*) echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1 ;;
esac
`

func TestSlurmTopology(t *testing.T) {
	dir := t.TempDir()
	prog := filepath.Join(dir, "scontrol")
	if err := os.WriteFile(prog, []byte(fakeScontrol), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	ctx := context.Background()
	got, err := Slurm{Job: "812", Conf: "/etc/site/slurm.conf"}.Topology(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := Topology{Nodes: []Node{{0, "n2", "10.0.0.2", 6818}, {1, "n3", "n3-ib", 6818}, {2, "gpu01", "10.0.0.9", 6818}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("topology %+v, want %+v", got, want)
	}
	for _, tc := range []struct {
		s    Slurm
		want string
	}{
		{Slurm{Job: "812", Conf: "/etc/other.conf"}, "set agent.slurm_conf"},
		{Slurm{Job: "813", Conf: "/etc/site/slurm.conf"}, "has no NodeList"},
		{Slurm{Job: "814", Conf: "/etc/site/slurm.conf"}, "Invalid job id"},
	} {
		if _, err := tc.s.Topology(ctx); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("job %s conf %s: %v, want an error with %q", tc.s.Job, tc.s.Conf, err, tc.want)
		}
	}
	t.Setenv("PATH", t.TempDir())
	if _, err := (Slurm{Job: "812"}).Topology(ctx); err == nil || !strings.Contains(err.Error(), "scontrol is not on PATH") {
		t.Errorf("without scontrol: %v, want an error saying so", err)
	}
}

func TestTopologyCheck(t *testing.T) {
	for _, tc := range []struct {
		t    Topology
		want string
	}{
		{Topology{}, "no nodes"},
		{Topology{Nodes: []Node{{Index: 1, Name: "a", Addr: "x"}}}, "index 1 at position 0"},
		{Topology{Nodes: []Node{{Index: 0, Name: "a", Addr: "x"}, {Index: 1, Name: "a", Addr: "y"}}}, "listed twice"},
		{Topology{Nodes: []Node{{Index: 0, Name: "a", Addr: ""}}}, "no name or address"},
	} {
		if err := tc.t.Check(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.t, err, tc.want)
		}
	}
}

func TestSlurmJobState(t *testing.T) {
	dir := t.TempDir()
	prog := filepath.Join(dir, "scontrol")
	if err := os.WriteFile(prog, []byte(fakeScontrol), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	for _, tc := range []struct {
		job, conf, state string
		gone, err        bool
	}{
		{"812", "/etc/site/slurm.conf", "RUNNING", false, false},
		{"813", "/etc/site/slurm.conf", "PENDING", false, false},
		{"814", "/etc/site/slurm.conf", "", true, false}, // purged: "Invalid job id"
		{"812", "/etc/other.conf", "", false, true},      // scontrol fails: not a verdict on the job
	} {
		state, gone, err := Slurm{Job: tc.job, Conf: tc.conf}.JobState(context.Background())
		if state != tc.state || gone != tc.gone || (err != nil) != tc.err {
			t.Errorf("job %s conf %s: %q gone=%v err=%v; want %q gone=%v err=%v", tc.job, tc.conf, state, gone, err, tc.state, tc.gone, tc.err)
		}
	}
}

// TestSlurmJobAndStepNodes: what the step-end hold asks (spank/stepend):
// the job's nodes while it runs, none once it does not, and a step's.
func TestSlurmJobAndStepNodes(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "scontrol"), []byte(fakeScontrol), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	ctx := context.Background()
	for _, tc := range []struct {
		job, conf string
		want      []string
		err       string
	}{
		{"812", "/etc/site/slurm.conf", []string{"n2", "n3", "gpu01"}, ""},
		{"813", "/etc/site/slurm.conf", nil, ""}, // pending (requeued): holds nothing
		{"814", "/etc/site/slurm.conf", nil, ""}, // gone
		{"812", "/etc/other.conf", nil, "unable to read"},
	} {
		got, err := Slurm{Job: tc.job, Conf: tc.conf}.JobNodes(ctx)
		if !reflect.DeepEqual(got, tc.want) || (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("job %s conf %s: JobNodes %v, %v; want %v, %q", tc.job, tc.conf, got, err, tc.want, tc.err)
		}
	}
	sl := Slurm{Job: "812", Conf: "/etc/site/slurm.conf"}
	if got, err := sl.StepNodes(ctx, "0"); err != nil || !reflect.DeepEqual(got, []string{"n2", "n3"}) {
		t.Errorf("StepNodes 812.0: %v, %v; want [n2 n3]", got, err)
	}
	if _, err := sl.StepNodes(ctx, "7"); err == nil {
		t.Error("StepNodes of a step that does not exist: no error")
	}
}
