//go:build e2e

package e2e

import (
	"fmt"
	"math/rand"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestMPIAllReduce: srun -N4 -n8 --mpi=pmix runs the empi program and
// AllReduce gives n(n+1)/2 on every rank, across four separate nodes.
func TestMPIAllReduce(t *testing.T) {
	args := []string{"srun", "-N4", "-n8", "--mpi=pmix", bin("reft-mpi-smoke")}
	r := run(t, 3*time.Minute, alice, args...)
	for i := 1; r.Code != 0 && mpiStartCrash(r) && i < 3; i++ {
		t.Logf("a rank died of SIGSEGV in Open MPI's start-up before any rank reported (an Open MPI flake under load, not the MPI result under test; docs/BENCHMARKS.md, test lanes); launching again:\n%s", r)
		r = run(t, 3*time.Minute, alice, args...)
	}
	if r.Code != 0 {
		t.Fatalf("%s failed:\n%s", strings.Join(args, " "), r)
	}
	re := regexp.MustCompile(`^rank (\d+)/8 host (n\d+) allreduce-sum 36 ok$`)
	ranks, hosts := map[string]bool{}, map[string]bool{}
	for _, l := range lines(r.Stdout) {
		m := re.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("unexpected line %q\n%s", l, r)
		}
		ranks[m[1]] = true
		hosts[m[2]] = true
	}
	if len(ranks) != 8 {
		t.Errorf("%d ranks reported the right sum, want 8\n%s", len(ranks), r)
	}
	if len(hosts) != 4 {
		t.Errorf("ranks ran on hosts %v, want 4 distinct nodes", hosts)
	}
}

// mpiStartCrash reports whether a failed reft-mpi-smoke launch is Open MPI's
// start-up crash rather than a wrong result: no rank printed its line, and
// a rank died as mpiCrashed knows. On the trixie lane (Open MPI 5, PMIx 5):
// address 0xe0 in ob1's match callback inside MPI_Init (Go's handler
// forwarded the signal to UCX's, from runtime.sigfwd); its cause is in
// docs/BENCHMARKS.md, test lanes.
func mpiStartCrash(r result) bool {
	return !strings.Contains(r.Stdout, "allreduce-sum") && mpiCrashed(r.Stderr)
}

// TestShmPrivatePerNode: a file a task writes to /dev/shm on n1 is invisible
// on n2 and still there for the next step on n1.
func TestShmPrivatePerNode(t *testing.T) {
	name := fmt.Sprintf("/dev/shm/reft-e2e-%d", rand.Int63())
	mustRun(t, time.Minute, alice, "srun", "-N1", "-w", "n1", "sh", "-c", "echo payload > "+name)
	t.Cleanup(func() { run(t, time.Minute, alice, "srun", "-N1", "-w", "n1", "rm", "-f", name) })

	// The task prints test -e's status (1: no such file) and the step
	// succeeds: a failing srun must not pass for an invisible file (srun
	// itself says "srun: error: ... Exited with exit code 1" for a task
	// that fails, so the status travels on stdout instead).
	r := mustRun(t, time.Minute, alice, "srun", "-N1", "-w", "n2", "sh", "-c", "test -e "+name+"; echo test-e=$?")
	if got := strings.TrimSpace(r.Stdout); got != "test-e=1" || strings.Contains(r.Stderr, "srun: error") {
		if got == "test-e=0" {
			t.Fatalf("%s written on n1 is visible on n2", name)
		}
		t.Fatalf("test -e %s on n2: want test-e=1 and no srun error:\n%s", name, r)
	}
	r = mustRun(t, time.Minute, alice, "srun", "-N1", "-w", "n1", "cat", name)
	if strings.TrimSpace(r.Stdout) != "payload" {
		t.Fatalf("n1 lost its own /dev/shm file: %s", r)
	}
	if r := mustRun(t, time.Minute, alice, "srun", "-N1", "-w", "n2", "hostname"); strings.TrimSpace(r.Stdout) != "n2" {
		t.Errorf("task on n2 sees hostname %q", r.Stdout)
	}
}

// TestKillNodeWipesShm: after kill-node and revive, a job on that node sees an
// empty /dev/shm.
func TestKillNodeWipesShm(t *testing.T) {
	const node = "n2"
	t.Cleanup(func() { reviveIfDead(t, node) })
	name := fmt.Sprintf("/dev/shm/reft-e2e-%d", rand.Int63())
	mustRun(t, time.Minute, alice, "srun", "-N1", "-w", node, "sh", "-c", "echo payload > "+name)
	mustRun(t, time.Minute, alice, "srun", "-N1", "-w", node, "test", "-e", name)

	cluster(t, "kill-node", node)
	cluster(t, "revive", node)

	r := mustRun(t, 2*time.Minute, alice, "srun", "-N1", "-w", node, "sh", "-c", "ls -A /dev/shm | wc -l")
	if n := strings.TrimSpace(r.Stdout); n != "0" {
		t.Fatalf("/dev/shm on %s holds %s entries after kill-node and revive, want 0", node, n)
	}
}

// reviveIfDead brings a node back when a failed test left it killed.
func reviveIfDead(t *testing.T, node string) {
	out := run(t, time.Minute, root, repo+"/tests/cluster/cluster", "status").Stdout
	for _, l := range lines(out) {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "slurmd-"+node && f[1] == "down" {
			cluster(t, "revive", node)
		}
	}
}

// TestSacctListsJob: accounting through slurmdbd and MariaDB records a
// finished job.
func TestSacctListsJob(t *testing.T) {
	r := mustRun(t, time.Minute, alice, "srun", "-N2", "sh", "-c", "echo $SLURM_JOB_ID")
	ids := lines(r.Stdout)
	if len(ids) == 0 {
		t.Fatalf("no job id printed: %s", r)
	}
	id := ids[0]
	deadline := time.Now().Add(60 * time.Second)
	for {
		r := run(t, 30*time.Second, root, "sacct", "-n", "-P", "-j", id, "-o", "JobID,User,State,NodeList")
		if strings.Contains(r.Stdout, id+"|"+alice+"|COMPLETED|") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sacct -j %s does not list the finished job:\n%s", id, r)
		}
		time.Sleep(time.Second)
	}
}
