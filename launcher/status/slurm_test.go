package status

import (
	"bytes"
	"context"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/reft-hpc/reft/agent/mesh"
)

// fakeScontrol answers for job 41 (running on n[1-2], its name carrying a
// forged UserId) and job 42 (pending); any other job is unknown.
const fakeSqueue = `#!/bin/sh
case "$*" in
"-h -s -j 41 -o %i|%N") printf '41.batch|n1\n41.extern|n[1-2]\n41.0|n1\n' ;;
"-h -s -j 44 -o %i|%N") printf '44.batch|n1\n44.1|n[1,3]\n' ;;
*) echo "squeue: unexpected $*" >&2; exit 1 ;;
esac
`

// fakeSacct: job 44 lost n2 (its allocation shrank); job 41 has one record.
const fakeSacct = `#!/bin/sh
case "$*" in
"-n -X -P -j 44 -o NodeList") printf 'n[1-3]\nn[1,3]\n' ;;
"-n -X -P -j 41 -o NodeList") printf 'n[1-2]\n' ;;
*) echo "sacct: unexpected $*" >&2; exit 1 ;;
esac
`

const fakeScontrol = `#!/bin/sh
case "$*" in
"show job -o 41") echo 'JobId=41 JobName=x UserId=root(0) UserId=alice(1001) GroupId=alice(1001) MCS_label=N/A Priority=1 Nice=0 Account=(null) QOS=normal JobState=RUNNING Reason=None ReqNodeList=(null) ExcNodeList=(null) NodeList=n[1-2] NumNodes=2' ;;
"show job -o 44") echo 'JobId=44 JobName=z UserId=alice(1001) GroupId=alice(1001) QOS=normal JobState=RUNNING Reason=None ReqNodeList=(null) ExcNodeList=(null) NodeList=n[1,3] NumNodes=2' ;;
"show hostnames n[1,3]") printf 'n1\nn3\n' ;;
"show node -o n[1,3]") printf 'NodeName=n1 Arch=x NodeAddr=10.0.0.1 State=ALLOCATED\nNodeName=n3 Arch=x NodeAddr=10.0.0.3 State=ALLOCATED\n' ;;
"show node -o n1,n2,n3") printf 'NodeName=n1 Arch=x NodeAddr=10.0.0.1 State=ALLOCATED\nNodeName=n2 Arch=x NodeAddr=10.0.0.2 State=DOWN*\nNodeName=n3 Arch=x NodeAddr=10.0.0.3 State=ALLOCATED\n' ;;
"show job -o 42") echo 'JobId=42 JobName=y UserId=bob(1002) GroupId=bob(1002) QOS=normal JobState=PENDING NodeList=(null)' ;;
"show hostnames n[1-2]") printf 'n1\nn2\n' ;;
"show node -o n[1-2]") printf 'NodeName=n1 Arch=x NodeAddr=10.0.0.1 State=ALLOCATED\nNodeName=n2 Arch=x NodeAddr=10.0.0.2 State=DOWN*+DRAIN\n' ;;
"show node -o n1,n2") printf 'NodeName=n1 Arch=x NodeAddr=10.0.0.1 State=ALLOCATED\nNodeName=n2 Arch=x NodeAddr=10.0.0.2 State=DOWN*+DRAIN\n' ;;
show\ job*) echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1 ;;
*) echo "scontrol: unexpected $*" >&2; exit 1 ;;
esac
`

func TestSlurmJob(t *testing.T) {
	prog := filepath.Join(t.TempDir(), "scontrol")
	if err := os.WriteFile(prog, []byte(fakeScontrol), 0o755); err != nil {
		t.Fatal(err)
	}
	sq := filepath.Join(filepath.Dir(prog), "squeue")
	if err := os.WriteFile(sq, []byte(fakeSqueue), 0o755); err != nil {
		t.Fatal(err)
	}
	sa := filepath.Join(filepath.Dir(prog), "sacct")
	if err := os.WriteFile(sa, []byte(fakeSacct), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		job     string
		want    Job
		wantErr string
	}{
		{job: "41", want: Job{ID: "41", State: "RUNNING", User: "alice", UID: 1001,
			Nodes:      []mesh.Node{{Index: 0, Name: "n1", Addr: "10.0.0.1"}, {Index: 1, Name: "n2", Addr: "10.0.0.2"}},
			NodeStates: map[string]string{"n1": "ALLOCATED", "n2": "DOWN*+DRAIN"}, StepNodes: map[string]bool{"n1": true}}},
		// Shrunk after losing n2: indexed as the agents index it.
		{job: "44", want: Job{ID: "44", State: "RUNNING", User: "alice", UID: 1001,
			Nodes:      []mesh.Node{{Index: 0, Name: "n1", Addr: "10.0.0.1"}, {Index: 1, Name: "n2", Addr: "10.0.0.2"}, {Index: 2, Name: "n3", Addr: "10.0.0.3"}},
			NodeStates: map[string]string{"n1": "ALLOCATED", "n2": "DOWN*", "n3": "ALLOCATED"}, StepNodes: map[string]bool{"n1": true, "n3": true},
			Released: map[string]bool{"n1": false, "n2": true, "n3": false}}},
		{job: "42", want: Job{ID: "42", State: "PENDING", User: "bob", UID: 1002, NodeStates: map[string]string{}}},
		{job: "43", wantErr: "job 43 is unknown to Slurm"},
	} {
		t.Run(tc.job, func(t *testing.T) {
			got, err := Slurm{Scontrol: prog, Squeue: sq, Sacct: sa}.Job(context.Background(), tc.job)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want an error naming %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.ID != tc.want.ID || got.State != tc.want.State || got.User != tc.want.User || got.UID != tc.want.UID ||
				len(got.Nodes) != len(tc.want.Nodes) || len(got.NodeStates) != len(tc.want.NodeStates) || !maps.Equal(got.StepNodes, tc.want.StepNodes) ||
				!maps.Equal(got.Released, tc.want.Released) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			for i, n := range tc.want.Nodes {
				if got.Nodes[i] != n || got.NodeStates[n.Name] != tc.want.NodeStates[n.Name] {
					t.Errorf("node %d: %+v (%s), want %+v (%s)", i, got.Nodes[i], got.NodeStates[n.Name], n, tc.want.NodeStates[n.Name])
				}
			}
		})
	}
}

// TestCommandArgs: the arguments are checked before Slurm is asked.
func TestCommandArgs(t *testing.T) {
	badConf := filepath.Join(t.TempDir(), "reft.toml")
	if err := os.WriteFile(badConf, []byte("[agent]\nno_such_key = 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		args    []string
		env     string
		code    int
		wantErr string
	}{
		{"no job", nil, "", 2, "no job: give a job id"},
		{"not a number", []string{"12a"}, "", 2, `"12a" is not a job id`},
		{"two jobs", []string{"1", "2"}, "", 2, "at most one job id"},
		{"json and prom", []string{"--json", "--prom", "1"}, "", 2, "--json or --prom, not both"},
		{"bad config", []string{"--config", badConf, "1"}, "", 1, "no_such_key"},
		{"env job, bad config", []string{"--config", badConf}, "7", 1, "no_such_key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("SLURM_JOB_ID", tc.env)
			var out, errb bytes.Buffer
			if code := Command(tc.args, &out, &errb); code != tc.code || !strings.Contains(errb.String(), tc.wantErr) {
				t.Fatalf("exit %d, stderr %q; want %d and %q", code, errb.String(), tc.code, tc.wantErr)
			}
		})
	}
}
