//go:build e2e

// Package e2e holds the end-to-end tests that run on the local Slurm test
// cluster (tests/cluster/cluster). `make e2e` brings the cluster up first; run
// by hand:
//
//	tests/cluster/cluster up --no-reft && go test -tags e2e ./tests/e2e/
//
// The tests fail, never skip, when the cluster is not up.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/reft-hpc/reft/tests/netbench"
)

// Test users that `cluster up` creates. Jobs that root submits run as root,
// which proves nothing about isolation, so most tests submit as alice.
const (
	alice = "reft-alice"
	bob   = "reft-bob"
	root  = "root"
)

var (
	// repo is the checkout's root; build/ below it holds the binaries.
	repo string
	// clusterEnv is the environment `cluster env` prints (SLURM_CONF, ...).
	clusterEnv []string
	// clusterDir is the cluster's state directory (REFT_CLUSTER_DIR).
	clusterDir string
)

func TestMain(m *testing.M) {
	if err := setup(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

func setup() error {
	_, file, _, _ := runtime.Caller(0)
	repo = filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
	tool := filepath.Join(repo, "tests", "cluster", "cluster")
	out, err := exec.Command(tool, "env").Output()
	if err != nil {
		return fmt.Errorf("%s env: %w", tool, err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		kv, ok := strings.CutPrefix(strings.TrimSpace(line), "export ")
		if !ok || strings.HasPrefix(kv, "PATH=") {
			continue // the tests run build/'s programs by path
		}
		clusterEnv = append(clusterEnv, kv)
		if v, ok := strings.CutPrefix(kv, "REFT_CLUSTER_DIR="); ok {
			clusterDir = v
		}
	}
	if st, err := exec.Command(tool, "status").CombinedOutput(); err != nil {
		return fmt.Errorf("the test cluster is not up (run '%s up --no-reft' or 'make e2e'):\n%s", tool, st)
	}
	// The tests install the plugin themselves, each with its own
	// configuration, and some need nodes whose slurmd has not loaded it
	// (slurmd reads plugstack.conf only at its start).
	if _, err := os.Stat(filepath.Join(clusterDir, "etc", "reft-installed")); err == nil {
		return fmt.Errorf("the test cluster came up with reft installed; the e2e tests install their own: run '%s down && %s up --no-reft'", tool, tool)
	}
	for _, b := range []string{"reft", "reft-agent", "reft-mpi-smoke"} {
		if _, err := os.Stat(filepath.Join(repo, "build", b)); err != nil {
			return fmt.Errorf("build/%s is missing: run 'make' first: %w", b, err)
		}
	}
	return nil
}

// bin returns the path of a built program.
func bin(name string) string { return filepath.Join(repo, "build", name) }

// result is what a finished command left behind.
type result struct {
	Stdout, Stderr string
	Code           int // exit code; -1 when killed by a signal or timed out
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.Code, r.Stdout, r.Stderr)
}

// command builds a command that runs as user (root runs it directly) with the
// cluster's environment, in that user's home (the nodes cannot see /tmp).
func command(ctx context.Context, user string, args ...string) *exec.Cmd {
	env := append([]string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"}, clusterEnv...)
	var cmd *exec.Cmd
	if user == root {
		cmd = exec.CommandContext(ctx, args[0], args[1:]...)
		cmd.Env = append(env, "HOME=/root")
		cmd.Dir = clusterDir
	} else {
		home := filepath.Join(clusterDir, "home", user)
		full := append([]string{"-u", user, "--", "env"}, env...)
		full = append(full, "HOME="+home, "USER="+user)
		full = append(full, args...)
		cmd = exec.CommandContext(ctx, "runuser", full...)
		cmd.Env = env
		cmd.Dir = home
	}
	// Its own process group, killed whole at the timeout: killing runuser
	// alone left its srun running (seen: a timed-out reference run's srun
	// outlived the test, the cluster and the run, holding the cluster
	// lock's inherited descriptor).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// run runs a command as user and returns its result; it fails the test only
// when the command cannot be started or outlives timeout.
func run(t testing.TB, timeout time.Duration, user string, args ...string) result {
	t.Helper()
	for attempt := 1; ; attempt++ {
		r := runOnce(t, timeout, user, args...)
		// OpenMPI 4.1 here crashes in MPI_Init (PC 0, inside cgo) in about
		// one launch in 30 when both cores are busy, with or without reft,
		// its memory patcher or Go's async preemption. That is not what
		// any test is about: run the command again, at most twice, and
		// say so.
		crashed := strings.Contains(r.Stdout+r.Stderr, "_Cfunc_MPI_Init") && strings.Contains(r.Stdout+r.Stderr, "SIGSEGV")
		if !crashed || attempt == 3 {
			return r
		}
		t.Logf("%s: a rank crashed in MPI_Init (OpenMPI flake under load, not the behaviour under test); running it again", strings.Join(args, " "))
	}
}

func runOnce(t testing.TB, timeout time.Duration, user string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := command(ctx, user, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{Stdout: stdout.String(), Stderr: stderr.String(), Code: cmd.ProcessState.ExitCode()}
	if ctx.Err() != nil {
		t.Fatalf("%s (as %s) did not finish within %v\n%s", strings.Join(args, " "), user, timeout, r)
	}
	if err != nil && r.Code == -1 {
		t.Fatalf("%s (as %s): %v\n%s", strings.Join(args, " "), user, err, r)
	}
	return r
}

// mustRun is run that also requires exit code 0.
func mustRun(t testing.TB, timeout time.Duration, user string, args ...string) result {
	t.Helper()
	r := run(t, timeout, user, args...)
	if r.Code != 0 {
		t.Fatalf("%s (as %s) failed:\n%s", strings.Join(args, " "), user, r)
	}
	return r
}

// cluster runs the cluster tool (as root).
func cluster(t testing.TB, args ...string) string {
	t.Helper()
	if len(args) == 2 && args[0] == "revive" {
		if _, err := os.Stat(plugstackLine()); err == nil {
			pluginLoaded.add(args[1])
		}
	}
	args = append([]string{filepath.Join(repo, "tests", "cluster", "cluster")}, args...)
	return mustRun(t, 3*time.Minute, root, args...).Stdout
}

// pluginLoaded lists the nodes whose slurmd was (re)started while the
// plugin's plugstack line was installed: slurmd reads plugstack.conf only
// at its start, so such a node runs the plugin's slurmd-context callbacks
// (an agent started at allocation by the extern step) until it restarts.
// enableReftArgs's cleanup restarts them once the line is gone, so that no
// later test meets a node that an earlier one revived mid-test (the
// clean-clone run: TestHostileAgentSquattedPorts met such an n2).
var pluginLoaded nodeSet

type nodeSet struct {
	mu sync.Mutex
	m  map[string]bool
}

func (s *nodeSet) add(n string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]bool{}
	}
	s.m[n] = true
}

// take empties the set and returns what it held, sorted.
func (s *nodeSet) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := slices.Sorted(maps.Keys(s.m))
	s.m = nil
	return out
}

// restartWithoutPlugin restarts the slurmd of every node in pluginLoaded;
// the plugstack line must be gone.
func restartWithoutPlugin(t testing.TB) {
	t.Helper()
	for _, n := range pluginLoaded.take() {
		if slurmdUp(t, n) {
			cluster(t, "kill-node", n)
		}
		cluster(t, "revive", n)
	}
}

// sharedDir makes a directory that every node and the given user can use
// (t.TempDir lives in the host's /tmp, which the nodes cannot see). It is
// removed when the test ends.
func sharedDir(t testing.TB, owner string) string {
	t.Helper()
	base := filepath.Join(clusterDir, "scratch")
	if err := os.MkdirAll(base, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(base, strings.ReplaceAll(t.Name(), "/", "_")+"-")
	if err != nil {
		t.Fatal(err)
	}
	if owner != root {
		u, err := user.Lookup(owner)
		if err != nil {
			t.Fatal(err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

var jobIDRe = regexp.MustCompile(`^(\d+)`)

// sbatch submits a batch script as user and returns the job id. The job is
// cancelled when the test ends, if still there.
func sbatch(t testing.TB, user, script string, args ...string) string {
	t.Helper()
	dir := sharedDir(t, user)
	path := filepath.Join(dir, "job.sh")
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	full := append([]string{"sbatch", "--parsable", "--chdir=" + dir, "--output=" + filepath.Join(dir, "slurm-%j.out")}, args...)
	full = append(full, path)
	r := mustRun(t, time.Minute, user, full...)
	m := jobIDRe.FindStringSubmatch(strings.TrimSpace(r.Stdout))
	if m == nil {
		t.Fatalf("sbatch printed no job id:\n%s", r)
	}
	id := m[1]
	t.Cleanup(func() { command(context.Background(), root, "scancel", id).Run() })
	return id
}

// jobOutput reads a batch job's output file written under sharedDir.
func jobOutput(t testing.TB, scriptDir, jobID string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(scriptDir, "slurm-"+jobID+".out"))
	if err != nil {
		t.Fatalf("job %s output: %v", jobID, err)
	}
	return string(b)
}

// jobState asks slurmctld, then accounting, for a job's state.
func jobState(t testing.TB, jobID string) string {
	t.Helper()
	r := run(t, 30*time.Second, root, "squeue", "-h", "-j", jobID, "-o", "%T")
	if s := strings.TrimSpace(r.Stdout); r.Code == 0 && s != "" {
		return s
	}
	// A resized or requeued job has several records (RESIZING, ...): the
	// last is the job's state now.
	r = run(t, 30*time.Second, root, "sacct", "-n", "-X", "-P", "-j", jobID, "-o", "State")
	if ls := lines(r.Stdout); len(ls) > 0 {
		return ls[len(ls)-1]
	}
	return ""
}

// finalStates are job states a job never leaves.
var finalStates = map[string]bool{
	"COMPLETED": true, "FAILED": true, "CANCELLED": true, "TIMEOUT": true,
	"NODE_FAIL": true, "OUT_OF_MEMORY": true, "PREEMPTED": true, "BOOT_FAIL": true, "DEADLINE": true,
}

// waitJob waits until the job reaches a final state and returns it.
func waitJob(t testing.TB, jobID string, timeout time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		st := jobState(t, jobID)
		if finalStates[strings.TrimSuffix(strings.Fields(st + " x")[0], "+")] {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s still %q after %v", jobID, st, timeout)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// lines returns the non-empty lines of s.
func lines(s string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// netResult logs one network-fault run for make bench-net's table
// (tests/netbench): the verdicts expected (about which nodes) and those
// the job's agents published (from the logs of nodes), and for a loss the
// seconds from the fault to the first verdict. It only logs: each test
// asserts its outcome itself; call it before those assertions, so that a
// failed run is counted too.
func netResult(t *testing.T, scenario string, expected []string, job string, fault time.Time, passed bool, nodes ...string) {
	t.Helper()
	res := netbench.Result{Scenario: scenario, Expected: append([]string{}, expected...), Seen: []string{}, DetectS: -1, Passed: passed}
	var first time.Time
	for _, f := range agentsFailures(t, job, nodes...) {
		n, _ := f["failed_node"].(string)
		res.Seen = append(res.Seen, n)
		if ts, ok := f["time"].(string); ok {
			if at, err := time.Parse(time.RFC3339Nano, ts); err == nil && (first.IsZero() || at.Before(first)) {
				first = at
			}
		}
	}
	if len(expected) > 0 && !first.IsZero() && !fault.IsZero() {
		res.DetectS = first.Sub(fault).Seconds()
	}
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s%s", netbench.Marker, b)
}

// clusterNet says whether the test cluster runs with its own networks
// (tests/cluster/cluster up --net).
func clusterNet() bool {
	b, err := os.ReadFile(filepath.Join(clusterDir, "etc", "net"))
	return err == nil && strings.TrimSpace(string(b)) == "netns"
}
