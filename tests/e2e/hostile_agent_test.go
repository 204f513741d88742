//go:build e2e

package e2e

// Hostile-user tests of the agent (issue 14, findings 5 and 7): reft-bob
// attacks the agents of reft-alice's job over the network and alice's own
// stale process registers a live rank again. Each attack must be refused
// or harmless, with one clear log line; alice's training must end with the
// bits of an undisturbed run, her canary untouched, and no node drained.
//
// Log-directory squatting (finding 4) needs the plugin, as root, to create
// <log dir>/<job> as the job's user: the agent-side refusal and reft run's
// watcher are covered by unit tests (agent/logging, launcher/run).

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/reft-hpc/reft/agent/mesh"
)

// hostileAgentPy is bob's attack kit: a peer-protocol frame header with
// valid checksums (CRC-32C, computed here), and two attacks. "flood HOST
// PORT N": N connections each announce a huge payload before
// authenticating (chunk frames of 64 MiB, hellos of 1 MiB; all connected
// before any speaks) and never send it; after 3 s it prints how many the
// listener has closed. "squat PORT...":
// listen on the ports and answer every connection with a challenge header
// announcing 1 MiB that never comes; it prints "squatting" when listening
// and the number of connections it took when stdin closes.
const hostileAgentPy = `import select, socket, struct, sys, time
T = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    T.append(c)
def crc32c(b):
    c = 0xFFFFFFFF
    for x in b:
        c = T[(c ^ x) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF
def header(t, length):
    h = struct.pack(">IBBHIIQI", 0x52465450, 1, t, 0, 0, length, 0, 0)
    return h + struct.pack(">I", crc32c(h))
def closed(s):
    s.setblocking(False)
    try:
        while True:
            if not s.recv(65536):
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True
if sys.argv[1] == "flood":
    host, port, n = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    # Every connection first, silent (each holds a slot until it speaks or
    # times out), then the headers.
    socks = [socket.create_connection((host, port), timeout=5) for _ in range(n)]
    for i, s in enumerate(socks):
        t, ln = (0x86, 64 << 20) if i % 2 == 0 else (0x01, 1 << 20)
        try:
            s.sendall(header(t, ln))
        except OSError:
            pass
    time.sleep(3)
    print("closed %d of %d" % (sum(closed(s) for s in socks), n), flush=True)
else:
    lns = []
    for p in sys.argv[2:]:
        l = socket.socket()
        l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        l.bind(("0.0.0.0", int(p)))
        l.listen(64)
        lns.append(l)
    print("squatting", flush=True)
    taken, held = 0, []
    while True:
        r, _, _ = select.select(lns + [sys.stdin], [], [])
        if sys.stdin in r:
            break
        for l in r:
            c, _ = l.accept()
            taken += 1
            c.sendall(header(0x81, 1 << 20))
            held.append(c)
    print("took %d" % taken, flush=True)
`

// hostileAgentKit writes bob's attack kit where bob can run it.
func hostileAgentKit(t *testing.T) string {
	t.Helper()
	path := filepath.Join(sharedDir(t, bob), "attack.py")
	if err := os.WriteFile(path, []byte(hostileAgentPy), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// hostileAgentCanary is a file of alice's that no attack may touch; the
// returned check fails the test if it changed.
func hostileAgentCanary(t *testing.T) func() {
	t.Helper()
	path := filepath.Join(sharedDir(t, alice), "canary")
	want := []byte(fmt.Sprintf("alice's canary %d\n", time.Now().UnixNano()))
	if err := os.WriteFile(path, want, 0o600); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(path)
	return func() {
		t.Helper()
		got, err := os.ReadFile(path)
		st2, _ := os.Stat(path)
		if err != nil || string(got) != string(want) || st2 == nil || !st2.ModTime().Equal(st.ModTime()) {
			t.Errorf("alice's canary %s changed: %q, %v", path, got, err)
		}
	}
}

// hostileAgentNotDrained fails the test if a node is draining or down.
func hostileAgentNotDrained(t *testing.T, nodes ...string) {
	t.Helper()
	r := mustRun(t, 30*time.Second, root, "sinfo", "-h", "-N", "-n", strings.Join(nodes, ","), "-o", "%N %t")
	for _, l := range lines(r.Stdout) {
		if f := strings.Fields(l); len(f) == 2 && (strings.HasPrefix(f[1], "drain") || strings.HasPrefix(f[1], "down") || strings.HasPrefix(f[1], "fail")) {
			t.Errorf("node %s is %s after the attack", f[0], f[1])
		}
	}
}

// hostileAgentTrain runs reft-train on n1 and n2 (in alice's allocation
// job with --reft=arc; "" runs it without reft, in a job of its own) and
// returns its final-params-sha256, which must be an undisturbed run's.
func hostileAgentTrain(t *testing.T, job string) string {
	t.Helper()
	args := []string{"srun", "--mpi=pmix", "-N2", "-n2", "-w", "n1,n2"}
	if job != "" {
		args = append(args, "--jobid="+job, "--reft=arc")
	}
	args = append(append(append(args, bin("reft-train")), trainFlags...), reftTrainFlags...)
	r := mustRun(t, 3*time.Minute, alice, args...)
	m := hashRe.FindAllStringSubmatch(r.Stdout, -1)
	if len(m) != 1 {
		t.Fatalf("%d final-params-sha256 lines, want 1:\n%s", len(m), r)
	}
	return m[0][1]
}

// hostileAgentReference is the hash of the same training without reft.
func hostileAgentReference(t *testing.T) string {
	t.Helper()
	return hostileAgentTrain(t, "")
}

// hostileAgentWaitEvent waits until node's agent of job logged event with
// a field containing substr, and returns that line.
func hostileAgentWaitEvent(t *testing.T, job, node, event, field, substr string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var seen []any
		for _, e := range agentEvents(t, job, node)[event] {
			seen = append(seen, e[field])
			if s, _ := e[field].(string); strings.Contains(s, substr) {
				return e
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: %s's agent logged no %s with %s containing %q; its %s lines: %v", job, node, event, field, substr, event, seen)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestHostileAgentPreAuthFlood: bob opens 64 connections to the peer port
// of alice's agent on n1, each announcing a 64 MiB chunk or a 1 MiB hello
// before authenticating, while alice trains. The agent closes every one
// at once (the frame type and size are refused on the header; beyond 8 per
// address, unread), logs it, and alice's training ends bit-identical.
func TestHostileAgentPreAuthFlood(t *testing.T) {
	enableReft(t)
	kit := hostileAgentKit(t)
	canary := hostileAgentCanary(t)
	want := hostileAgentReference(t)
	ja := allocateAs(t, alice, "--reft=arc", "-N2", "-n2", "-w", "n1,n2")
	mustRun(t, 2*time.Minute, alice, "srun", "--jobid="+ja, "--reft=arc", "-N2", "-n2", "true")
	waitConnected(t, ja, "n1", "n2")
	ev := agentEvents(t, ja, "n1")["peer_listening"]
	if len(ev) == 0 {
		t.Fatalf("job %s: n1's agent logged no peer_listening", ja)
	}
	addr, _ := ev[0]["addr"].(string)
	port := addr[strings.LastIndex(addr, ":")+1:]

	flood := make(chan result, 1)
	go func() { flood <- run(t, 2*time.Minute, bob, "python3", kit, "flood", "127.0.0.1", port, "64") }()
	got := hostileAgentTrain(t, ja)
	r := <-flood
	if r.Code != 0 || !strings.Contains(r.Stdout, "closed 64 of 64") {
		t.Errorf("bob's flood of %s: want every connection closed by the agent within 3 s:\n%s", addr, r)
	}
	if got != want {
		t.Errorf("alice's training under the flood ended with %s, an undisturbed run with %s", got, want)
	}
	e := hostileAgentWaitEvent(t, ja, "n1", "peer_refused", "error", "before authentication")
	t.Logf("n1's agent: %v", e["error"])
	hostileAgentWaitEvent(t, ja, "n1", "peer_conn_shed", "message", "unauthenticated connections already")
	waitConnected(t, ja, "n1", "n2")
	canary()
	hostileAgentNotDrained(t, "n1", "n2")
}

// TestHostileAgentSquattedPorts: before alice's agents start, bob listens
// on the first candidate port of each of her nodes and answers every
// connection with a challenge announcing 1 MiB. Her agents listen on their
// next candidates, their dialers refuse bob's listener on its first header
// (one log line naming it) and find each other; her training ends
// bit-identical.
func TestHostileAgentSquattedPorts(t *testing.T) {
	// Alice's agents must start at her first step, after the port range
	// below is set, not at allocation: restart n1's and n2's slurmd while
	// no plugin line is installed (a node an earlier test revived while
	// its line was in place loaded the plugin, and its extern step would
	// start the agent with the default range).
	for _, n := range []string{"n1", "n2"} {
		cluster(t, "kill-node", n)
		cluster(t, "revive", n)
	}
	enableReft(t)
	kit := hostileAgentKit(t)
	canary := hostileAgentCanary(t)
	want := hostileAgentReference(t)
	ja := allocateAs(t, alice, "--reft=arc", "-N2", "-n2", "-w", "n1,n2")
	// Outside the default port_range [47000, 47999], where the agents of
	// earlier tests' jobs may still be stopping and hold a candidate bob
	// must bind.
	const lo, hi = 48100, 48199
	conf := filepath.Join(clusterDir, "etc", "reft-e2e.toml")
	b, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(conf, []byte(strings.Replace(string(b), "[agent]\n", fmt.Sprintf("[agent]\nport_range = [%d, %d]\n", lo, hi), 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	squatted := []string{strconv.Itoa(mesh.Candidates(ja, lo, hi, 0, 2)[0]), strconv.Itoa(mesh.Candidates(ja, lo, hi, 1, 2)[0])}
	sq := command(t.Context(), bob, append([]string{"python3", kit, "squat"}, squatted...)...)
	stdin, _ := sq.StdinPipe()
	var out strings.Builder
	pr, pw, _ := os.Pipe()
	sq.Stdout, sq.Stderr = pw, &out
	if err := sq.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	line := make([]byte, 64)
	if n, _ := pr.Read(line); !strings.Contains(string(line[:n]), "squatting") {
		sq.Wait()
		t.Fatalf("bob's squatter did not start: %q %s", line[:n], out.String())
	}
	t.Logf("job %s: bob squats alice's first candidate ports %v", ja, squatted)

	got := hostileAgentTrain(t, ja)
	stdin.Close()
	rest := make([]byte, 256)
	n, _ := pr.Read(rest)
	sq.Wait()
	t.Logf("bob's squatter: %s", strings.TrimSpace(string(rest[:n])))
	if got != want {
		t.Errorf("alice's training with squatted ports ended with %s, an undisturbed run with %s", got, want)
	}
	for _, node := range []string{"n1", "n2"} {
		for _, e := range agentEvents(t, ja, node)["peer_listening"] {
			if a, _ := e["addr"].(string); strings.HasSuffix(a, ":"+squatted[0]) || strings.HasSuffix(a, ":"+squatted[1]) {
				t.Errorf("%s's agent listens on bob's port: %v", node, e)
			}
		}
	}
	// At least one dialer reached bob's listener and refused it on its
	// header, without waiting for the megabyte.
	// The mesh logs a search that found no agent on some candidates as
	// peer_unreachable, and one that found it after other candidates
	// answered as something else as peer_candidates_skipped, each naming
	// what each candidate did.
	var refused []any
	for _, node := range []string{"n1", "n2"} {
		evs := agentEvents(t, ja, node)
		for _, e := range slices.Concat(evs["peer_unreachable"], evs["peer_handshake_failed"], evs["peer_candidates_skipped"]) {
			if s, _ := e["error"].(string); strings.Contains(s, "before authentication") {
				refused = append(refused, e["error"])
			}
		}
	}
	if len(refused) == 0 {
		t.Errorf("no agent of job %s refused bob's listener on its header (peer_unreachable or peer_handshake_failed naming a frame before authentication)", ja)
	}
	t.Logf("refusals: %v", refused)
	waitConnected(t, ja, "n1", "n2")
	canary()
	hostileAgentNotDrained(t, "n1", "n2")
}

// hostileAgentFencePy: two sessions of rank 0 in one task. The first
// saves step 1; the second (a newer incarnation) registers the rank and
// restores it; the first then tries to save and commit step 2 over it.
const hostileAgentFencePy = `import hashlib, json, sys
sys.path.insert(0, sys.argv[1])
import reft
old = reft.Session()
a = bytearray(hashlib.sha256(b"alice").digest() * 256)
old.register("w", a)
old.save(1).wait()
new = reft.Session()
b = bytearray(len(a))
new.register("w", b)
step = new.restore()
out = {"restored": step, "identical": b == a}
try:
    h = old.save(2)
    h.wait()
    out["old_save"] = "error: %s" % h.error if h.error else "committed"
except reft.Error as e:
    out["old_save"] = "refused: %s" % e
out["generations"] = [g if isinstance(g, int) else g.get("step") for g in new.generations()]
print(json.dumps(out), flush=True)
`

// TestHostileAgentSecondRegistration: a second registration of a live
// rank (alice's own stale process; bob cannot reach her agent's socket at
// all) fences the older one: its save is refused with a message naming the
// fence, the newer incarnation keeps its restored bytes and generations,
// and the agent logs rank_fenced once.
func TestHostileAgentSecondRegistration(t *testing.T) {
	enableReft(t)
	canary := hostileAgentCanary(t)
	ja := allocateAs(t, alice, "--reft=arc", "-N1", "-n1", "-w", "n1")
	script := filepath.Join(sharedDir(t, alice), "fence.py")
	if err := os.WriteFile(script, []byte(hostileAgentFencePy), 0o644); err != nil {
		t.Fatal(err)
	}
	r := mustRun(t, 2*time.Minute, alice, "srun", "--jobid="+ja, "--reft=arc", "-N1", "-n1", "-w", "n1",
		"python3", script, filepath.Join(repo, "client", "python"))
	var out struct {
		Restored    *int64  `json:"restored"`
		Identical   bool    `json:"identical"`
		OldSave     string  `json:"old_save"`
		Generations []int64 `json:"generations"`
	}
	ls := lines(r.Stdout)
	if len(ls) == 0 || json.Unmarshal([]byte(ls[len(ls)-1]), &out) != nil {
		t.Fatalf("the fence script printed no result:\n%s", r)
	}
	if out.Restored == nil || *out.Restored != 1 || !out.Identical {
		t.Errorf("the newer incarnation restored %v, identical %v; want step 1, identical", out.Restored, out.Identical)
	}
	if !strings.Contains(out.OldSave, "fenced") {
		t.Errorf("the older incarnation's save of step 2: %q, want refused as fenced", out.OldSave)
	}
	if len(out.Generations) != 1 || out.Generations[0] != 1 {
		t.Errorf("generations after the older incarnation's try: %v, want [1]", out.Generations)
	}
	if ev := agentEvents(t, ja, "n1")["rank_fenced"]; len(ev) != 1 {
		t.Errorf("n1's agent logged %d rank_fenced lines, want 1: %v", len(ev), ev)
	}
	canary()
	hostileAgentNotDrained(t, "n1")
}
