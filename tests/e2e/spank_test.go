//go:build e2e

package e2e

// End-to-end tests of the SPANK plugin (issue 3): the --reft option, the
// per-node agent, its socket, and that Slurm behaves as without the plugin.
// Each test enables the plugin by writing a plugstack.conf.d line (srun and
// slurmstepd read plugstack at every launch) and removes it when it ends.

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

// enableReft installs the plugin for the duration of the test.
func enableReft(t *testing.T) {
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
	os.Chmod(logDir, 0o1777)
	conf := filepath.Join(clusterDir, "etc", "reft-e2e.toml")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(reftConf, bin("reft-agent"), filepath.Join(clusterDir, "etc", "slurm.conf"), logDir)), 0o644); err != nil {
		t.Fatal(err)
	}
	line := filepath.Join(clusterDir, "etc", "plugstack.conf.d", "reft.conf")
	if err := os.WriteFile(line, []byte(fmt.Sprintf("optional %s config=%s\n", bin("spank_reft.so"), conf)), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(line) })
}

// disableReft removes the plugstack line (for the runs "without the plugin").
func disableReft(t *testing.T) {
	t.Helper()
	if err := os.Remove(filepath.Join(clusterDir, "etc", "plugstack.conf.d", "reft.conf")); err != nil && !os.IsNotExist(err) {
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
func sbatchIn(t *testing.T, dir, script string, args ...string) string {
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
func agentPIDs(t *testing.T, job string) map[string][]int {
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
// seconds the loop took, as measured inside the job.
func stepLoop(t *testing.T, n int, jobArgs, stepArgs []string) float64 {
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
	return s
}

// TestReft200Steps: 200 reft steps back to back in one job never hang
// (each srun must return; the job has a deadline), and the agent is still
// the only one on the node.
func TestReft200Steps(t *testing.T) {
	enableReft(t)
	secs := stepLoop(t, 200, []string{"--reft=arc"}, nil)
	t.Logf("200 steps with --reft=arc: %.1f s (%.3f s/step)", secs, secs/200)
}

// TestReftLaunchTimeRatio reports (does not assert: wall-clock) the step
// launch time of jobs without --reft with the plugin loaded against the
// same jobs without the plugin, and of --reft=arc steps.
func TestReftLaunchTimeRatio(t *testing.T) {
	const n = 40
	var without, withPlugin, withReft []float64
	for round := 0; round < 2; round++ {
		disableReft(t)
		without = append(without, stepLoop(t, n, nil, nil))
		enableReft(t)
		withPlugin = append(withPlugin, stepLoop(t, n, nil, nil))
		withReft = append(withReft, stepLoop(t, n, []string{"--reft=arc"}, nil))
	}
	med := func(v []float64) float64 { sort.Float64s(v); return v[len(v)/2] }
	a, b, c := med(without), med(withPlugin), med(withReft)
	t.Logf("step launch, %d steps: without plugin %.2f s, plugin loaded (no --reft) %.2f s, --reft=arc %.2f s", n, a, b, c)
	t.Logf("ratio plugin-loaded/without = %.3f; --reft=arc/without = %.3f", b/a, c/a)
	if a <= 0 || b <= 0 || c <= 0 {
		t.Fatalf("bad timings %v %v %v", without, withPlugin, withReft)
	}
}
