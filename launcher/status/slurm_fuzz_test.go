package status

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeCommands writes scontrol, squeue and sacct stand-ins into dir that
// print the files job, hosts, node, squeue and sacct there.
func fakeCommands(t testing.TB, dir string) Slurm {
	t.Helper()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\nd=$(dirname \"$0\")\n"+body), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return Slurm{
		Scontrol: write("scontrol", `case "$*" in
*"show job"*) cat "$d/out.job" ;;
*"show hostnames"*) cat "$d/out.hosts" ;;
*"show node"*) cat "$d/out.node" ;;
*) exit 1 ;;
esac
`),
		Squeue: write("squeue", `cat "$d/out.squeue"`+"\n"),
		Sacct:  write("sacct", `cat "$d/out.sacct"`+"\n"),
	}
}

// FuzzSlurmJob: `reft status` reads scontrol, squeue and sacct output,
// in which job names, comments and node features are users' text. Job
// never panics on it, and a job it returns has an owner, and nodes that
// each have a name and an address, indexed in order.
func FuzzSlurmJob(f *testing.F) {
	job := "JobId=42 JobName=t UserId=alice(1000) GroupId=a(1000) QOS=normal JobState=RUNNING Reason=None ExcNodeList=(null) NodeList=n[1-2] BatchHost=n1\n"
	node := "NodeName=n1 Arch=x NodeAddr=10.0.0.1 Port=6818 State=ALLOCATED\nNodeName=n2 NodeAddr=10.0.0.2 State=DOWN+NOT_RESPONDING\nNodeName=n3 NodeAddr=10.0.0.3 State=IDLE\n"
	f.Add(job, "n1\nn2\n", node, "n[1-3]\nn[1-2]\n", "42.0|n[1-2]\n42.batch|n1\n42.extern|n[1-2]\n")
	f.Add("JobId=42 JobName=x UserId=evil(1) UserId=bob(99999999999999999999) QOS=a JobState=COMPLETED\n", "", "", "", "")
	f.Add(strings.Replace(job, "n[1-2]", "n[1-2,9]", 1), "n1 n2 n9", node, "n[0-1048575,0-1048575]\n", "42.0|n[\n")
	f.Add("JobId=43 UserId=a(1)\n", "n1", "NodeName=n1", "", "")
	dir := f.TempDir()
	s := fakeCommands(f, dir)
	f.Fuzz(func(t *testing.T, job, hosts, node, sacct, squeue string) {
		for name, out := range map[string]string{"job": job, "hosts": hosts, "node": node, "sacct": sacct, "squeue": squeue} {
			if err := os.WriteFile(filepath.Join(dir, "out."+name), []byte(out), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		j, err := s.Job(context.Background(), "42")
		if err != nil {
			return
		}
		if j.ID != "42" || j.UID < 0 || strings.ContainsAny(j.User, " \t\n(") {
			t.Fatalf("job %q of user %q (%d)", j.ID, j.User, j.UID)
		}
		for i, n := range j.Nodes {
			if n.Index != i || n.Name == "" || n.Addr == "" {
				t.Fatalf("node %d: %+v", i, n)
			}
		}
		for n := range j.Released {
			found := false
			for _, m := range j.Nodes {
				found = found || m.Name == n
			}
			if !found {
				t.Fatalf("released node %q is not among the nodes", n)
			}
		}
	})
}
