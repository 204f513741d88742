//go:build e2e

package e2e

// End-to-end tests of the SPANK plugin (issue 3): the --reft option, the
// per-node agent, its socket, and that Slurm behaves as without the plugin.
// Each test enables the plugin by writing a plugstack.conf.d line (srun and
// slurmstepd read plugstack at every launch) and removes it when it ends.
// slurmd reads it only at its start, so TestReftExternStepStartsAgent
// restarts a node with the line present, and again without it.

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// reftConf is the e2e reft.toml: node-private run and store directories
// (each node has its own /dev/shm), the checkout's agent, and the cluster's
// slurm.conf for the agents' scontrol (slurmd gets it with -f, so the
// agents cannot inherit it).
const reftConf = `[store]
tmpfs_root = "/dev/shm/reft"
[agent]
binary = %q
run_dir = "/dev/shm/reft-run"
start_timeout = "20s"
slurm_conf = %q
[log]
dir = %q
level = "debug"
`

const reftRunDir = "/dev/shm/reft-run"

// plugstackLine is the file the tests' plugin line goes in; the cluster's
// plugstack.conf includes plugstack.conf.d/*.conf.
func plugstackLine() string { return filepath.Join(clusterDir, "etc", "plugstack.conf.d", "reft.conf") }

// writeReftConf writes the e2e reft.toml and returns its path.
func writeReftConf(t testing.TB) string {
	t.Helper()
	for _, b := range []string{"spank_reft.so", "libreft_spank.so", "reft-agent"} {
		if _, err := os.Stat(bin(b)); err != nil {
			t.Fatalf("build/%s is missing: run 'make': %v", b, err)
		}
	}
	logDir := filepath.Join(clusterDir, "log", "reft")
	if err := os.MkdirAll(logDir, 0o1777); err != nil {
		t.Fatal(err)
	}
	// 1777 like /tmp: the sticky bit is os.ModeSticky (Go drops a numeric
	// 0o1000); without it another user could rename a job's log directory,
	// and the plugin refuses such a directory.
	os.Chmod(logDir, 0o777|os.ModeSticky)
	conf := filepath.Join(clusterDir, "etc", "reft-e2e.toml")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(reftConf, bin("reft-agent"), filepath.Join(clusterDir, "etc", "slurm.conf"), logDir)), 0o644); err != nil {
		t.Fatal(err)
	}
	return conf
}

// enableReftArgs installs the plugin with these plugstack arguments for
// the duration of the test (srun, sbatch, salloc and slurmstepd read the
// line at each launch; slurmd only at its start).
func enableReftArgs(t testing.TB, args string) {
	t.Helper()
	if err := os.WriteFile(plugstackLine(), []byte(fmt.Sprintf("optional %s %s\n", bin("spank_reft.so"), args)), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.Remove(plugstackLine())
		restartWithoutPlugin(t)
	})
}

// enableReft installs the plugin, with the e2e reft.toml, for the duration
// of the test.
func enableReft(t testing.TB) {
	t.Helper()
	enableReftArgs(t, "config="+writeReftConf(t))
}

// disableReft removes the plugstack line (for the runs "without the plugin").
func disableReft(t testing.TB) {
	t.Helper()
	if err := os.Remove(plugstackLine()); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
}

// helloPy runs in every task: it prints the REFT_* environment and the
// agent's hello reply as one JSON line, or {"reft":false} without reft.
const helloPy = `import json, os, socket, struct, sys
env = {k: v for k, v in os.environ.items() if k.startswith("REFT_") and not k.startswith("REFT_CLUSTER_")}
out = {"node": os.uname().nodename, "rank": os.environ.get("SLURM_PROCID"), "env": env}
p = env.get("REFT_AGENT_SOCKET")
if p:
    st = os.stat(p)
    out["sock_mode"] = oct(st.st_mode & 0o777)
    out["sock_uid"] = st.st_uid
    s = socket.socket(socket.AF_UNIX)
    s.connect(p)
    s.sendall(struct.pack(">IBBHI", 8, 1, 1, 0, 7))
    def readn(n):
        b = b""
        while len(b) < n:
            d = s.recv(n - len(b))
            if not d:
                raise SystemExit("agent closed the connection")
            b += d
        return b
    h = readn(12)
    out["reply_type"] = h[5]
    out["reply_id"] = struct.unpack(">I", h[8:12])[0]
    out["hello"] = json.loads(readn(struct.unpack(">I", h[:4])[0] - 8) or b"{}")
print(json.dumps(out), flush=True)
`

type helloLine struct {
	Node      string            `json:"node"`
	Rank      string            `json:"rank"`
	Env       map[string]string `json:"env"`
	SockMode  string            `json:"sock_mode"`
	SockUID   int               `json:"sock_uid"`
	ReplyType int               `json:"reply_type"`
	ReplyID   int               `json:"reply_id"`
	Hello     map[string]any    `json:"hello"`
}

// sbatchIn submits like sbatch, with the job's output in dir (the later
// --output wins over the helper's).
func sbatchIn(t testing.TB, dir, script string, args ...string) string {
	t.Helper()
	id := sbatch(t, alice, script, append([]string{"--output=" + filepath.Join(dir, "slurm-%j.out")}, args...)...)
	// The helper's own cleanup runs scancel without the cluster's SLURM_CONF.
	t.Cleanup(func() { run(t, time.Minute, root, "scancel", id) })
	return id
}

func writeHelloPy(t *testing.T, dir string) string {
	p := filepath.Join(dir, "hello.py")
	if err := os.WriteFile(p, []byte(helloPy), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func parseHellos(t *testing.T, out string) []helloLine {
	t.Helper()
	var hs []helloLine
	for _, l := range lines(out) {
		if !strings.HasPrefix(l, "{") {
			continue
		}
		var h helloLine
		if err := json.Unmarshal([]byte(l), &h); err != nil {
			t.Fatalf("bad task line %q: %v", l, err)
		}
		hs = append(hs, h)
	}
	return hs
}

func uidOf(t *testing.T, user string) int {
	out, err := exec.Command("id", "-u", user).Output()
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	return n
}

// checkHellos: every task of the step saw the REFT_* environment and got a
// hello answer from its own node's agent.
func checkHellos(t *testing.T, hs []helloLine, ntasks int, spec, job, step string) {
	t.Helper()
	if len(hs) != ntasks {
		t.Fatalf("%d task lines, want %d: %+v", len(hs), ntasks, hs)
	}
	uid := uidOf(t, alice)
	ranks := map[string]bool{}
	for _, h := range hs {
		ranks[h.Rank] = true
		want := map[string]string{
			"REFT_AGENT_SOCKET": reftRunDir + "/" + job + "/agent.sock", "REFT_SPEC": spec,
			"REFT_JOB_ID": job, "REFT_STEP_ID": step, "REFT_RESTART_COUNT": "0", "REFT_NODE": h.Node,
		}
		for k, v := range want {
			if h.Env[k] != v {
				t.Errorf("rank %s on %s: %s=%q, want %q", h.Rank, h.Node, k, h.Env[k], v)
			}
		}
		if h.SockMode != "0o600" || h.SockUID != uid {
			t.Errorf("rank %s: socket mode %s uid %d, want 0o600 owned by %d", h.Rank, h.SockMode, h.SockUID, uid)
		}
		if h.ReplyType != 0x81 || h.ReplyID != 7 {
			t.Errorf("rank %s: reply type 0x%x id %d, want a hello reply (0x81) with id 7", h.Rank, h.ReplyType, h.ReplyID)
		}
		if h.Hello["job"] != job || h.Hello["node"] != h.Node || h.Hello["spec"] != spec || h.Hello["agent_version"] == "" {
			t.Errorf("rank %s on %s: hello reply %v, want job %s, node %s, spec %s", h.Rank, h.Node, h.Hello, job, h.Node, spec)
		}
	}
	if len(ranks) != ntasks {
		t.Errorf("ranks %v, want %d distinct", ranks, ntasks)
	}
}

// TestReftSrunEnvAndHello: srun --reft=arc+aec,dp=4 -N2 -n4: every task sees
// REFT_* and gets a hello answer from its node's agent.
func TestReftSrunEnvAndHello(t *testing.T) {
	enableReft(t)
	dir := sharedDir(t, alice)
	py := writeHelloPy(t, dir)
	r := mustRun(t, 2*time.Minute, alice, "srun", "-N2", "-n4", "--reft=arc+aec,dp=4", "sh", "-c",
		"echo job=$SLURM_JOB_ID; exec /usr/bin/python3 "+py)
	job := regexp.MustCompile(`job=(\d+)`).FindStringSubmatch(r.Stdout)
	if job == nil {
		t.Fatalf("no job id:\n%s", r)
	}
	hs := parseHellos(t, r.Stdout)
	checkHellos(t, hs, 4, "arc+aec,dp=4", job[1], "0")
	nodes := map[string]bool{}
	for _, h := range hs {
		nodes[h.Node] = true
	}
	if len(nodes) != 2 {
		t.Errorf("tasks ran on %v, want 2 nodes", nodes)
	}
}

// TestReftBatchDirective: #SBATCH --reft=arc, then srun inside: every task
// sees REFT_* and gets a hello answer; the batch script itself sees it too.
func TestReftBatchDirective(t *testing.T) {
	enableReft(t)
	dir := sharedDir(t, alice)
	py := writeHelloPy(t, dir)
	id := sbatchIn(t, dir, "#!/bin/sh\n#SBATCH --reft=arc\n#SBATCH -N2\n#SBATCH -n4\n"+
		"echo batch-spec=$REFT_SPEC batch-step=$REFT_STEP_ID\nsrun /usr/bin/python3 "+py+"\n")
	if st := waitJob(t, id, 3*time.Minute); st != "COMPLETED" {
		t.Fatalf("job %s ended %s:\n%s", id, st, jobOutput(t, dir, id))
	}
	out := jobOutput(t, dir, id)
	if !strings.Contains(out, "batch-spec=arc batch-step=batch") {
		t.Errorf("batch script environment lacks REFT_SPEC=arc, REFT_STEP_ID=batch:\n%s", out)
	}
	checkHellos(t, parseHellos(t, out), 4, "arc", id, "0")
}

// agentPIDs lists the reft-agent processes of a job, by node (all nodes of
// the test cluster share the host's pid namespace).
func agentPIDs(t testing.TB, job string) map[string][]int {
	t.Helper()
	out, _ := exec.Command("pgrep", "-a", "-f", "reft-agent .*--job "+job+" ").Output()
	re := regexp.MustCompile(`^(\d+) .*--node (\S+)`)
	m := map[string][]int{}
	for _, l := range lines(string(out)) {
		if f := re.FindStringSubmatch(l); f != nil {
			pid, _ := strconv.Atoi(f[1])
			if st, err := os.ReadFile("/proc/" + f[1] + "/stat"); err == nil && strings.Contains(string(st), ") Z ") {
				continue // exited, not yet reaped by init
			}
			m[f[2]] = append(m[f[2]], pid)
		}
	}
	return m
}

// TestReftOneAgentPerNodeAcrossSteps: three steps of one job (one of them
// --overlap) share exactly one agent per node, running as the user; none
// remains, and no socket, after the job ends.
func TestReftOneAgentPerNodeAcrossSteps(t *testing.T) {
	enableReft(t)
	dir := sharedDir(t, alice)
	py := writeHelloPy(t, dir)
	marker := filepath.Join(dir, "steps-done")
	id := sbatchIn(t, dir, "#!/bin/sh\n#SBATCH --reft=arc\n#SBATCH -N2\n#SBATCH --ntasks-per-node=1\n"+
		"for i in 1 2; do srun /usr/bin/python3 "+py+"; done\n"+
		"srun --overlap /usr/bin/python3 "+py+"\n"+
		"touch "+marker+"\nsleep 300\n")
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if _, err := os.Stat(marker); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the three steps did not finish in time:\n%s", jobOutput(t, dir, id))
		}
		time.Sleep(500 * time.Millisecond)
	}
	agents := agentPIDs(t, id)
	out := jobOutput(t, dir, id)
	hs := parseHellos(t, out)
	if len(hs) != 6 {
		t.Fatalf("%d task lines from 3 steps x 2 nodes, want 6:\n%s", len(hs), out)
	}
	if len(agents) != 2 {
		t.Fatalf("agents by node %v, want 2 nodes", agents)
	}
	uid := uidOf(t, alice)
	for node, pids := range agents {
		if len(pids) != 1 {
			t.Errorf("node %s runs %d agents for job %s (%v), want 1", node, len(pids), id, pids)
			continue
		}
		var st syscall.Stat_t
		if err := syscall.Stat(fmt.Sprintf("/proc/%d", pids[0]), &st); err != nil || int(st.Uid) != uid {
			t.Errorf("agent %d on %s runs as uid %d, want %s (%d)", pids[0], node, st.Uid, alice, uid)
		}
	}
	// Every step's hello on a node was answered by the same (only) agent:
	// the agent logs one hello per task and started once per node.
	logs, _ := filepath.Glob(filepath.Join(clusterDir, "log", "reft", id, "*.jsonl"))
	if len(logs) != 2 {
		t.Fatalf("agent logs of job %s: %v, want one per node (2)", id, logs)
	}
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		if n := strings.Count(string(b), `"event":"agent_started"`); n != 1 {
			t.Errorf("%s: %d agent starts, want 1", l, n)
		}
	}
	mustRun(t, time.Minute, root, "scancel", id)
	waitJob(t, id, 2*time.Minute)
	for deadline := time.Now().Add(30 * time.Second); len(agentPIDs(t, id)) > 0; time.Sleep(500 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("agents of job %s still running after the job ended: %v", id, agentPIDs(t, id))
		}
	}
	for node := range agents {
		r := run(t, time.Minute, alice, "srun", "-N1", "-w", node, "sh", "-c", "ls -A "+reftRunDir+"/"+id+" 2>&1; echo end")
		if !strings.Contains(r.Stdout, "No such file") {
			t.Errorf("run directory of job %s left on %s: %s", id, node, r)
		}
	}
}

// badInputs: each bad --reft value and (part of) the line that rejects it.
var badInputs = []struct{ spec, want string }{
	{"bogus", `unknown mode "bogus"; valid modes: off, or arc, aec, aec:K (K>=1), aor joined by '+'`},
	{"arc+off", `"off" cannot be combined with other modes`},
	{"aec:0", "aec:K: 0 is out of range; valid: 1..255"},
	{"arc,foo=1", `unknown key "foo"; valid keys: dp, pp, tp, every, persist, spares, persist_dir`},
	{"arc,dp", `"dp" is not key=value`},
	{"arc,dp=0", "dp=0: 0 is out of range; valid: 1..1048576"},
	{"arc,every=x", `every=x: "x" is not a whole number`},
	{"arc,persist=soon", "persist=soon: valid: auto, off, a step count (500) or a duration (30m, 1h30m)"},
	{"arc,spares=-1", `spares=-1: "-1" is not a whole number`},
	{"arc,persist_dir=rel", "persist_dir=rel: must be an absolute path"},
}

// TestReftBadInputRejected: srun, sbatch (option and #SBATCH line) and
// salloc all refuse each bad value with its one-line message, before
// anything is submitted.
func TestReftBadInputRejected(t *testing.T) {
	enableReft(t)
	dir := sharedDir(t, alice)
	for i, bad := range badInputs {
		script := filepath.Join(dir, fmt.Sprintf("bad%d.sh", i))
		if err := os.WriteFile(script, []byte("#!/bin/sh\n#SBATCH --reft="+bad.spec+"\ntrue\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, cmd := range [][]string{
			{"srun", "--reft=" + bad.spec, "true"},
			{"sbatch", "--reft=" + bad.spec, "--wrap", "true"},
			{"sbatch", script},
			{"salloc", "--reft=" + bad.spec, "true"},
		} {
			t.Run(bad.spec+"/"+strings.Join(cmd[:len(cmd)-1], " "), func(t *testing.T) {
				r := run(t, time.Minute, alice, cmd...)
				if r.Code == 0 {
					t.Fatalf("%v accepted a bad --reft:\n%s", cmd, r)
				}
				if !strings.Contains(r.Stderr, "error: --reft="+bad.spec+": "+bad.want) {
					t.Errorf("%v: stderr lacks %q:\n%s", cmd, bad.want, r.Stderr)
				}
				if strings.Contains(r.Stdout+r.Stderr, "Submitted batch job") || strings.Contains(r.Stderr, "Granted job allocation") ||
					strings.Contains(r.Stderr, "job allocation") {
					t.Errorf("%v submitted something:\n%s", cmd, r)
				}
			})
		}
	}
	// Valid and repeated values pass: the same value from #SBATCH and the
	// environment, and a different value on an inner srun wins for its step.
	py := writeHelloPy(t, dir)
	id := sbatchIn(t, dir, "#!/bin/sh\n#SBATCH --reft=arc\n#SBATCH -N1\n"+
		"srun --reft=arc /usr/bin/python3 "+py+"\nsrun --reft=aor,every=2 /usr/bin/python3 "+py+"\nsrun --reft=off /usr/bin/python3 "+py+"\n", "--reft=arc")
	if st := waitJob(t, id, 3*time.Minute); st != "COMPLETED" {
		t.Fatalf("job %s: %s\n%s", id, st, jobOutput(t, dir, id))
	}
	hs := parseHellos(t, jobOutput(t, dir, id))
	if len(hs) != 3 || hs[0].Env["REFT_SPEC"] != "arc" || hs[1].Env["REFT_SPEC"] != "aor,every=2" || len(hs[2].Env) != 0 {
		t.Fatalf("steps with --reft=arc, aor,every=2, off saw %+v", hs)
	}
}

// TestReftNoFlagUnchanged: with the plugin loaded, a job without --reft gets
// no REFT_* variable and no agent.
func TestReftNoFlagUnchanged(t *testing.T) {
	enableReft(t)
	dir := sharedDir(t, alice)
	py := writeHelloPy(t, dir)
	r := mustRun(t, 2*time.Minute, alice, "srun", "-N2", "-n2", "sh", "-c",
		"echo job=$SLURM_JOB_ID; exec /usr/bin/python3 "+py)
	job := regexp.MustCompile(`job=(\d+)`).FindStringSubmatch(r.Stdout)
	if job == nil {
		t.Fatalf("no job id:\n%s", r)
	}
	for _, h := range parseHellos(t, r.Stdout) {
		if len(h.Env) != 0 {
			t.Errorf("rank %s of a job without --reft has %v", h.Rank, h.Env)
		}
	}
	if a := agentPIDs(t, job[1]); len(a) != 0 {
		t.Errorf("job without --reft has agents %v", a)
	}
	if logs, _ := filepath.Glob(filepath.Join(clusterDir, "log", "reft", job[1])); len(logs) != 0 {
		t.Errorf("job without --reft left agent logs %v", logs)
	}
}

// TestReftOtherUIDRefused: while alice's reft job runs, bob (on the same
// node) cannot reach her agent's socket, and root, which can, is refused by
// the agent's SO_PEERCRED check.
func TestReftOtherUIDRefused(t *testing.T) {
	enableReft(t)
	dir := sharedDir(t, alice)
	ready := filepath.Join(dir, "ready")
	id := sbatchIn(t, dir, "#!/bin/sh\n#SBATCH --reft=arc\n#SBATCH -N1\n"+
		"hostname > "+ready+".tmp; mv "+ready+".tmp "+ready+"\nsleep 300\n")
	var node string
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
		if b, err := os.ReadFile(ready); err == nil {
			node = strings.TrimSpace(string(b))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s did not start", id)
		}
	}
	sock := reftRunDir + "/" + id + "/agent.sock"
	client := `import socket,struct,sys
s=socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print("connect-refused", e.strerror); sys.exit(0)
try:
    s.sendall(struct.pack(">IBBHI",8,1,1,0,1))
except OSError:
    pass
h=s.recv(12)
print("reply", h[5], s.recv(4096).decode())`
	r := mustRun(t, time.Minute, bob, "srun", "-N1", "-w", node, "/usr/bin/python3", "-c", client, sock)
	if !strings.Contains(r.Stdout, "connect-refused Permission denied") {
		t.Errorf("bob connecting to alice's agent: %s", r)
	}
	r = mustRun(t, time.Minute, root, "srun", "-N1", "-w", node, "--overlap", "/usr/bin/python3", "-c", client, sock)
	if !strings.Contains(r.Stdout, "reply 255") || !strings.Contains(r.Stdout, `"code":"forbidden"`) {
		t.Errorf("root connecting to alice's agent: %s", r)
	}
	b, _ := os.ReadFile(filepath.Join(clusterDir, "log", "reft", id, node+".jsonl"))
	if !strings.Contains(string(b), "refused a connection from another uid") {
		t.Errorf("agent log has no refusal line:\n%s", b)
	}
}

// TestReftAgentStartFailureReachesUser: when the agent cannot start (here:
// the job's persist_dir does not exist), the step's tasks fail at start
// with the node and the cause on the user's stderr.
func TestReftAgentStartFailureReachesUser(t *testing.T) {
	enableReft(t)
	r := run(t, 2*time.Minute, alice, "srun", "-N1", "--reft=arc,persist_dir=/nonexistent/reft-e2e", "true")
	if r.Code == 0 {
		t.Fatalf("step ran although its agent could not start:\n%s", r)
	}
	re := regexp.MustCompile(`reft: node n\d: the reft agent failed to start: persistent checkpoint directory /nonexistent/reft-e2e \(persist_dir= in --reft\): stat /nonexistent/reft-e2e: no such file or directory`)
	if !re.MatchString(r.Stderr) {
		t.Errorf("stderr lacks the node and cause:\n%s", r.Stderr)
	}
}

// signalCase runs one Slurm control scenario and returns what the user
// observes: exit codes, final states, and what the job printed.
type signalCase struct {
	name string
	run  func(t *testing.T, reft []string) string
}

// waitFile waits for a file the job creates.
func waitFile(t *testing.T, p string) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if _, err := os.Stat(p); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never appeared", p)
		}
	}
}

var signalCases = []signalCase{
	{"SIGINT to srun", func(t *testing.T, reft []string) string {
		dir := sharedDir(t, alice)
		started := filepath.Join(dir, "started")
		args := append([]string{"srun", "-N2", "-n2"}, reft...)
		args = append(args, "sh", "-c", "touch "+started+"; exec sleep 300")
		ctx := command(t.Context(), alice, args...)
		var out strings.Builder
		ctx.Stdout, ctx.Stderr = &out, &out
		if err := ctx.Start(); err != nil {
			t.Fatal(err)
		}
		waitFile(t, started)
		time.Sleep(time.Second)
		// Signal srun itself (runuser would turn SIGINT into SIGTERM); two
		// within a second abort the step, as Ctrl-C Ctrl-C does.
		srun := srunPID(t, ctx.Process.Pid)
		syscall.Kill(srun, syscall.SIGINT)
		time.Sleep(200 * time.Millisecond)
		syscall.Kill(srun, syscall.SIGINT)
		done := make(chan error, 1)
		go func() { done <- ctx.Wait() }()
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			ctx.Process.Kill()
			t.Fatalf("srun did not end after SIGINT:\n%s", out.String())
		}
		return fmt.Sprintf("srun exit %d", ctx.ProcessState.ExitCode())
	}},
	{"scancel of a step", func(t *testing.T, reft []string) string {
		dir := sharedDir(t, alice)
		started := filepath.Join(dir, "started")
		id := sbatchIn(t, dir, "#!/bin/sh\n#SBATCH -N2\nsrun "+strings.Join(reft, " ")+" sh -c 'touch "+started+"; sleep 300'\necho srun-exit=$?\n", reft...)
		waitFile(t, started)
		mustRun(t, time.Minute, root, "scancel", id+".0")
		st := waitJob(t, id, 2*time.Minute)
		out := jobOutput(t, dir, id)
		return "job " + st + " " + regexp.MustCompile(`srun-exit=\d+`).FindString(out)
	}},
	{"scancel of a batch job", func(t *testing.T, reft []string) string {
		dir := sharedDir(t, alice)
		started := filepath.Join(dir, "started")
		id := sbatchIn(t, dir, "#!/bin/sh\n#SBATCH -N2\nsrun sh -c 'touch "+started+"; sleep 300'\n", reft...)
		waitFile(t, started)
		mustRun(t, time.Minute, root, "scancel", id)
		return "job " + waitJob(t, id, 2*time.Minute)
	}},
	{"SIGTERM at time limit", func(t *testing.T, reft []string) string {
		dir := sharedDir(t, alice)
		id := sbatchIn(t, dir, "#!/bin/sh\n#SBATCH -N1\n#SBATCH --time=1\n#SBATCH --signal=B:TERM@30\n"+
			"trap 'echo script-got-TERM' TERM\nsrun sleep 600 & wait; wait\n", reft...)
		st := waitJob(t, id, 4*time.Minute)
		out := jobOutput(t, dir, id)
		return "job " + st + " " + fmt.Sprint(strings.Contains(out, "script-got-TERM"))
	}},
}

// srunPID finds the srun below the runuser process pid.
func srunPID(t *testing.T, pid int) int {
	t.Helper()
	for i := 0; i < 3; i++ {
		out, _ := exec.Command("pgrep", "-P", strconv.Itoa(pid)).Output()
		f := strings.Fields(string(out))
		if len(f) == 0 {
			break
		}
		pid, _ = strconv.Atoi(f[0])
		if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) == "srun" {
			return pid
		}
	}
	if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) == "srun" {
		return pid
	}
	t.Fatalf("no srun process below pid %d", pid)
	return 0
}

// TestReftSignalsUnchanged: Ctrl-C to srun, scancel of a step and of a
// batch job, and SIGTERM at the time limit give the same result with the
// plugin and --reft as without the plugin, and leave no agent behind.
func TestReftSignalsUnchanged(t *testing.T) {
	for _, c := range signalCases {
		t.Run(c.name, func(t *testing.T) {
			disableReft(t)
			without := c.run(t, nil)
			enableReft(t)
			with := c.run(t, []string{"--reft=arc"})
			t.Logf("%s: without plugin: %s; with --reft=arc: %s", c.name, without, with)
			if with != without {
				t.Errorf("%s: with --reft=arc %q, without the plugin %q", c.name, with, without)
			}
		})
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Second) {
		out, _ := exec.Command("pgrep", "-a", "-u", alice, "reft-agent").Output()
		var live []string
		for _, l := range lines(string(out)) {
			pid := strings.Fields(l)[0]
			if st, err := os.ReadFile("/proc/" + pid + "/stat"); err == nil && !strings.Contains(string(st), ") Z ") {
				live = append(live, l)
			}
		}
		if len(live) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agents left after the signal tests:\n%s", strings.Join(live, "\n"))
		}
	}
}

// stepLoop runs n back-to-back steps in one allocation and returns the
// seconds the loop took, as measured inside the job, and the job's id.
func stepLoop(t testing.TB, n int, jobArgs, stepArgs []string) (float64, string) {
	t.Helper()
	dir := sharedDir(t, alice)
	script := fmt.Sprintf("#!/bin/bash\n#SBATCH -N1\nstart=$(date +%%s.%%N)\nfor i in $(seq %d); do srun %s true || { echo step $i failed; exit 1; }; done\n"+
		"end=$(date +%%s.%%N)\necho loop-seconds=$(awk \"BEGIN{print $end - $start}\")\n", n, strings.Join(stepArgs, " "))
	id := sbatchIn(t, dir, script, jobArgs...)
	if st := waitJob(t, id, 9*time.Minute); st != "COMPLETED" {
		t.Fatalf("job %s with %d steps ended %s:\n%s", id, n, st, jobOutput(t, dir, id))
	}
	m := regexp.MustCompile(`loop-seconds=([0-9.]+)`).FindStringSubmatch(jobOutput(t, dir, id))
	if m == nil {
		t.Fatalf("no timing:\n%s", jobOutput(t, dir, id))
	}
	s, _ := strconv.ParseFloat(m[1], 64)
	return s, id
}

// TestReft200Steps: 200 reft steps back to back in one job never hang
// (each srun must return; the job has a deadline), all of them were served
// by one agent on the node (its log shows one start), and none is left
// after the job.
func TestReft200Steps(t *testing.T) {
	enableReft(t)
	secs, id := stepLoop(t, 200, []string{"--reft=arc"}, nil)
	t.Logf("200 steps with --reft=arc: %.1f s (%.3f s/step)", secs, secs/200)
	logs, _ := filepath.Glob(filepath.Join(clusterDir, "log", "reft", id, "*.jsonl"))
	if len(logs) != 1 {
		t.Fatalf("agent logs of one-node job %s: %v, want 1", id, logs)
	}
	b, _ := os.ReadFile(logs[0])
	if n := strings.Count(string(b), `"event":"agent_started"`); n != 1 {
		t.Errorf("%s: %d agent starts over 200 steps, want 1", logs[0], n)
	}
	for deadline := time.Now().Add(30 * time.Second); len(agentPIDs(t, id)) > 0; time.Sleep(500 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("agents of job %s still running after the job ended: %v", id, agentPIDs(t, id))
		}
	}
}

// BenchmarkReftStepLaunch (`make bench`; docs/BENCHMARKS.md) measures the
// step launch time of jobs without --reft with the plugin loaded, and of
// --reft=arc steps, against the same jobs without the plugin: loops of 100
// back-to-back steps, each round running the three in a rotated order. It
// reports the median of the per-round ratios (a round where one srun waited
// for the previous job's resources is an outlier the median drops); tests
// assert no wall-clock figure.
func BenchmarkReftStepLaunch(b *testing.B) {
	const n, rounds = 100, 5
	variants := []struct {
		name   string
		plugin bool
		job    []string
	}{
		{"without plugin", false, nil},
		{"plugin loaded, no --reft", true, nil},
		{"--reft=arc", true, []string{"--reft=arc"}},
	}
	for i := 0; i < b.N; i++ {
		var loaded, arc []float64
		var secs [3][]float64
		for r := 0; r < rounds; r++ {
			var got [3]float64
			for k := 0; k < len(variants); k++ {
				v := (r + k) % len(variants)
				if variants[v].plugin {
					enableReft(b)
				} else {
					disableReft(b)
				}
				got[v], _ = stepLoop(b, n, variants[v].job, nil)
				secs[v] = append(secs[v], got[v])
			}
			if got[0] <= 0 {
				b.Fatalf("round %d: %d steps without the plugin took %v s", r, n, got[0])
			}
			loaded = append(loaded, got[1]/got[0])
			arc = append(arc, got[2]/got[0])
			b.Logf("round %d, %d steps: without plugin %.2f s, plugin loaded (no --reft) %.2f s, --reft=arc %.2f s", r, n, got[0], got[1], got[2])
		}
		disableReft(b)
		med := func(v []float64) float64 { v = append([]float64(nil), v...); sort.Float64s(v); return v[len(v)/2] }
		b.ReportMetric(med(secs[0])/n, "s/step_without")
		b.ReportMetric(med(loaded), "x_plugin_loaded")
		b.ReportMetric(med(arc), "x_reft_arc")
		b.Logf("step launch, median of %d rounds of %d steps: ratio plugin-loaded/without = %.3f, --reft=arc/without = %.3f (per-round: %.3f, %.3f)",
			rounds, n, med(loaded), med(arc), loaded, arc)
	}
}

// slurmdLogSince returns a function that reads what node's slurmd log
// (slurmd, its slurmstepds and the prolog write there) gained since now.
func slurmdLogSince(t *testing.T, node string) func() string {
	t.Helper()
	p := filepath.Join(clusterDir, "log", "slurmd-"+node+".log")
	st, err := os.Stat(p)
	if err != nil {
		t.Fatalf("slurmd log of %s: %v", node, err)
	}
	from := st.Size()
	return func() string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("slurmd log of %s: %v", node, err)
		}
		if int64(len(b)) < from {
			return string(b)
		}
		return string(b[from:])
	}
}

// helloStep runs hello.py as one task of a new job on node, without --reft
// unless args say otherwise, and returns the job id and the task's line.
func helloStep(t *testing.T, node, py string, args ...string) (result, string, []helloLine) {
	t.Helper()
	cmd := append([]string{"srun", "-N1", "-n1", "-w", node}, args...)
	cmd = append(cmd, "sh", "-c", "echo job=$SLURM_JOB_ID; exec /usr/bin/python3 "+py)
	r := mustRun(t, 2*time.Minute, alice, cmd...)
	job := regexp.MustCompile(`job=(\d+)`).FindStringSubmatch(r.Stdout)
	if job == nil {
		t.Fatalf("no job id:\n%s", r)
	}
	return r, job[1], parseHellos(t, r.Stdout)
}

// waitNoAgents waits until no agent of job runs.
func waitNoAgents(t *testing.T, job string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); len(agentPIDs(t, job)) > 0; time.Sleep(500 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("agents of job %s still running after the job ended: %v", job, agentPIDs(t, job))
		}
	}
}

// TestReftPlugstackArguments: the plugin's arguments in plugstack.conf. A
// bad one (an unknown argument, or a default= that is no valid SPEC) is an
// error in slurmd's log naming it and what is valid, and disables reft:
// --reft is refused by srun, sbatch and salloc with the cause, and jobs
// without --reft run as without the plugin. default=arc gives reft to jobs
// that ask for nothing. A config= file that does not exist is named to the
// user whose step asks for reft.
func TestReftPlugstackArguments(t *testing.T) {
	const node = "n1"
	conf := writeReftConf(t)
	dir := sharedDir(t, alice)
	py := writeHelloPy(t, dir)

	disabled := []struct{ name, args, cause string }{
		{"unknown argument", "config=" + conf + " bogus=1",
			`plugstack.conf argument "bogus=1" is unknown or malformed (valid: config=/ABSOLUTE/PATH, default=SPEC)`},
		{"invalid default", "config=" + conf + " default=bogus",
			`plugstack.conf argument "default=bogus" is invalid: unknown mode "bogus"; valid modes: off, or arc, aec, aec:K (K>=1), aor joined by '+'`},
		{"unknown argument beside a valid default", "config=" + conf + " default=arc bogus=1",
			`plugstack.conf argument "bogus=1" is unknown or malformed (valid: config=/ABSOLUTE/PATH, default=SPEC)`},
	}
	for _, c := range disabled {
		t.Run(c.name, func(t *testing.T) {
			enableReftArgs(t, c.args)
			for _, cmd := range [][]string{
				{"srun", "-N1", "-w", node, "--reft=arc", "true"},
				{"sbatch", "--reft=arc", "--wrap", "true"},
				{"salloc", "--reft=arc", "true"},
			} {
				r := run(t, time.Minute, alice, cmd...)
				if r.Code == 0 || !strings.Contains(r.Stderr, "error: --reft=arc: reft is disabled on this cluster: "+c.cause) {
					t.Errorf("%v with plugin arguments %q: want a failure naming the cause %q:\n%s", cmd, c.args, c.cause, r)
				}
				if strings.Contains(r.Stdout+r.Stderr, "Submitted batch job") || strings.Contains(r.Stderr, "Granted job allocation") {
					t.Errorf("%v submitted something:\n%s", cmd, r)
				}
			}

			// A job without --reft runs as without the plugin, and the
			// node's slurmd log has the cause.
			since := slurmdLogSince(t, node)
			r, job, hs := helloStep(t, node, py)
			if len(hs) != 1 || len(hs[0].Env) != 0 {
				t.Errorf("a step without --reft saw %+v, want one task without REFT_*", hs)
			}
			if strings.Contains(r.Stderr, "reft") {
				t.Errorf("a step without --reft printed about reft:\n%s", r.Stderr)
			}
			if a := agentPIDs(t, job); len(a) != 0 {
				t.Errorf("job %s without --reft has agents %v", job, a)
			}
			want := "error: reft: " + c.cause + "; reft is disabled until it is fixed"
			for deadline := time.Now().Add(10 * time.Second); !strings.Contains(since(), want); time.Sleep(200 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("slurmd log of %s lacks %q; it gained:\n%s", node, want, since())
				}
			}
		})
	}

	t.Run("default=arc", func(t *testing.T) {
		enableReftArgs(t, "config="+conf+" default=arc")
		_, job, hs := helloStep(t, node, py)
		checkHellos(t, hs, 1, "arc", job, "0")
		waitNoAgents(t, job)
		// --reft=off still turns it off.
		_, job, hs = helloStep(t, node, py, "--reft=off")
		if len(hs) != 1 || len(hs[0].Env) != 0 {
			t.Errorf("a --reft=off step under default=arc saw %+v, want no REFT_*", hs)
		}
		if a := agentPIDs(t, job); len(a) != 0 {
			t.Errorf("--reft=off job %s has agents %v", job, a)
		}
	})

	t.Run("missing config file", func(t *testing.T) {
		const missing = "/nonexistent/reft-e2e.toml"
		enableReftArgs(t, "config="+missing)
		r := run(t, 2*time.Minute, alice, "srun", "-N1", "-w", node, "--reft=arc", "true")
		want := "reft: node " + node + ": reft cannot start: reft config " + missing + ": open " + missing + ": no such file or directory"
		if r.Code == 0 || !strings.Contains(r.Stderr, want) {
			t.Errorf("--reft=arc with config=%s: want a failure with %q:\n%s", missing, want, r)
		}
		_, _, hs := helloStep(t, node, py)
		if len(hs) != 1 || len(hs[0].Env) != 0 {
			t.Errorf("a step without --reft saw %+v, want one task without REFT_*", hs)
		}
	})
}

// TestReftHelpListsModes: with the plugin line present, the help of srun,
// sbatch and salloc shows --reft and its modes.
func TestReftHelpListsModes(t *testing.T) {
	enableReft(t)
	for _, cmd := range []string{"srun", "sbatch", "salloc"} {
		r := mustRun(t, time.Minute, alice, cmd, "--help")
		// Slurm wraps a plugin's help text: read it as one line.
		flat := strings.Join(strings.Fields(r.Stdout+r.Stderr), " ")
		for _, want := range []string{"--reft=SPEC", "SPEC is off, or modes arc, aec, aec:K (K>=1), aor joined by '+'", "dp= pp= tp="} {
			if !strings.Contains(flat, want) {
				t.Errorf("%s --help lacks %q:\n%s", cmd, want, r.Stdout+r.Stderr)
			}
		}
	}
}

// slurmdUp reports whether the cluster tool runs node's slurmd.
func slurmdUp(t testing.TB, node string) bool {
	for _, l := range lines(run(t, time.Minute, root, repo+"/tests/cluster/cluster", "status").Stdout) {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "slurmd-"+node {
			return f[1] == "up"
		}
	}
	return false
}

// TestReftExternStepStartsAgent: the preferred path. A slurmd that loaded
// the plugin at its start (slurmd reads plugstack.conf only then) runs the
// plugin's job prolog, which marks the reft job, and the job's extern step
// (PrologFlags=Contain) starts the node's agent before any step runs. The
// job's steps use that agent, exactly one runs, and it is gone after the
// job. The other tests toggle the plugin line under running slurmds, so
// there the first step starts the agent instead.
func TestReftExternStepStartsAgent(t *testing.T) {
	const node = "n4"
	enableReftRestarting(t, node)

	since := slurmdLogSince(t, node)
	job := allocate(t, "--reft=arc", "-N1", "-w", node)
	// No step has run: only the extern step can start an agent now.
	var pids []int
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		if pids = agentPIDs(t, job)[node]; len(pids) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no agent of job %s on %s before any step ran; slurmd log:\n%s", job, node, since())
		}
	}
	logFile := filepath.Join(clusterDir, "log", "reft", job, node+".jsonl")
	starts := func() []map[string]any {
		b, _ := os.ReadFile(logFile)
		var out []map[string]any
		for _, l := range lines(string(b)) {
			var e map[string]any
			if json.Unmarshal([]byte(l), &e) == nil && e["event"] == "agent_started" {
				out = append(out, e)
			}
		}
		return out
	}
	for deadline := time.Now().Add(30 * time.Second); len(starts()) == 0; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s has no agent_started event", logFile)
		}
	}
	if s := starts(); len(s) != 1 || s[0]["started_by"] != "extern" {
		t.Fatalf("agent starts of job %s on %s: %v, want one, started_by extern", job, node, s)
	}

	// Two steps use that agent; no step starts another.
	dir := sharedDir(t, alice)
	py := writeHelloPy(t, dir)
	for step := 0; step < 2; step++ {
		r := mustRun(t, 2*time.Minute, alice, "srun", "--jobid="+job, "-N1", "-n1", "--reft=arc", "/usr/bin/python3", py)
		checkHellos(t, parseHellos(t, r.Stdout), 1, "arc", job, strconv.Itoa(step))
	}
	if a := agentPIDs(t, job); len(a) != 1 || len(a[node]) != 1 || a[node][0] != pids[0] {
		t.Errorf("agents of job %s after two steps: %v, want only the extern step's %d on %s", job, a, pids[0], node)
	}
	if s := starts(); len(s) != 1 {
		t.Errorf("agent starts of job %s on %s after two steps: %v, want the extern step's only", job, node, s)
	}

	// The job's end stops it and removes its run directory.
	mustRun(t, time.Minute, root, "scancel", job)
	waitJob(t, job, 2*time.Minute)
	waitNoAgents(t, job)
	r := run(t, time.Minute, alice, "srun", "-N1", "-w", node, "sh", "-c", "ls -A "+reftRunDir+"/"+job+" 2>&1; echo end")
	if !strings.Contains(r.Stdout, "No such file") {
		t.Errorf("run directory of job %s left on %s: %s", job, node, r)
	}
	if l := since(); strings.Contains(l, "error: reft") {
		t.Errorf("slurmd log of %s has reft errors:\n%s", node, l)
	}
}

// enableReftRestarting installs the plugin (enableReft) and restarts node's
// slurmd so that it loads it: slurmd reads plugstack.conf only at its start,
// and only such a slurmd runs the plugin's slurmd-context callbacks (the
// extern step, the job epilog). enableReft's cleanup restarts the node
// again without the plugin (pluginLoaded), as the other tests expect.
func enableReftRestarting(t *testing.T, node string) {
	t.Helper()
	enableReft(t)
	cluster(t, "kill-node", node)
	cluster(t, "revive", node)
}
