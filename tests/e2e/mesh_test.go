//go:build e2e

package e2e

// End-to-end test of the agents' mesh (issue 6): the agents of a job find
// each other with no rendezvous, although every node of the test cluster
// sits on one host at 127.0.0.1, and authenticate with MUNGE.

import (
	"bufio"
	"encoding/json"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// statusPy asks the task's agent for its status and prints the node name
// and the reply's peering section as one JSON line.
const statusPy = `import json, os, socket, struct
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["REFT_AGENT_SOCKET"])
s.sendall(struct.pack(">IBBHI", 8, 1, 2, 0, 9))
def readn(n):
    b = b""
    while len(b) < n:
        d = s.recv(n - len(b))
        if not d:
            raise SystemExit("agent closed the connection")
        b += d
    return b
h = readn(12)
st = json.loads(readn(struct.unpack(">I", h[:4])[0] - 8))
print(json.dumps({"node": os.uname().nodename, "type": h[5], "peering": st.get("peering")}), flush=True)
`

type peeringStatus struct {
	State  string `json:"state"`
	Reason string `json:"reason"`
	Listen string `json:"listen"`
	Peers  []struct {
		Node      string `json:"node"`
		Index     int    `json:"index"`
		Addr      string `json:"addr"`
		Connected bool   `json:"connected"`
		Error     string `json:"error"`
	} `json:"peers"`
}

// agentEvents reads a node's agent log for job: lines by event.
func agentEvents(t testing.TB, job, node string) map[string][]map[string]any {
	t.Helper()
	out := map[string][]map[string]any{}
	f, err := os.Open(filepath.Join(clusterDir, "log", "reft", job, node+".jsonl"))
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			if e, ok := m["event"].(string); ok {
				out[e] = append(out[e], m)
			}
		}
	}
	return out
}

// TestMeshAgentsConnect: a 3-node --reft=arc allocation; each node's agent
// (started by the first reft step) listens on one of its candidate ports and
// logs that it connected to the two others, once each; a step's tasks ask
// their agents and see every peer connected at the address where that
// peer listens.
func TestMeshAgentsConnect(t *testing.T) {
	enableReft(t)
	job := allocate(t, "--reft=arc", "-N3")
	u, err := user.Lookup(alice)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		run(t, time.Minute, alice, "srun", "--jobid="+job, "--reft=arc", "-N3", "--ntasks-per-node=1", "rm", "-rf",
			filepath.Join(reftStoreRoot, u.Uid, job))
	})
	r := mustRun(t, time.Minute, root, "scontrol", "show", "hostnames",
		strings.TrimSpace(mustRun(t, time.Minute, root, "squeue", "-h", "-j", job, "-o", "%N").Stdout))
	nodes := strings.Fields(r.Stdout)
	if len(nodes) != 3 {
		t.Fatalf("allocation %s has nodes %v, want 3", job, nodes)
	}

	// 1. The first reft step starts the agents (the extern step does when
	// slurmd loaded the plugin at its start, which the tests' plugstack
	// toggling does not give; TestReftExternStepStartsAgent covers that
	// path); every agent logs peer_connected for each other node.
	mustRun(t, 2*time.Minute, alice, "srun", "--jobid="+job, "--reft=arc", "-N3", "--ntasks-per-node=1", "true")
	start := time.Now()
	deadline := start.Add(90 * time.Second)
	for _, n := range nodes {
		for {
			ev := agentEvents(t, job, n)
			got := map[string]bool{}
			for _, e := range ev["peer_connected"] {
				got[e["peer_node"].(string)] = true
			}
			if len(got) == len(nodes)-1 {
				break
			}
			if off := ev["peering_off"]; len(off) > 0 {
				t.Fatalf("%s: peering off: %v", n, off[0]["error"])
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s's agent connected to %v, want the other nodes of %v; its peer events: listening %v, unreachable %v",
					n, got, nodes, ev["peer_listening"], ev["peer_unreachable"])
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	t.Logf("job %s: the agents of %v connected to each other (%.1f s after the first step ended)", job, nodes, time.Since(start).Seconds())
	listen := map[string]string{}
	for _, n := range nodes {
		ev := agentEvents(t, job, n)
		if l := ev["peer_listening"]; len(l) != 1 {
			t.Errorf("%s: peer_listening logged %d times, want once", n, len(l))
		} else {
			listen[n], _ = l[0]["addr"].(string)
			t.Logf("%s: agent listens on %s (candidate %v)", n, listen[n], l[0]["candidate"])
		}
		count := map[string]int{}
		for _, e := range ev["peer_connected"] {
			count[e["peer_node"].(string)]++
		}
		for p, c := range count {
			if c != 1 {
				t.Errorf("%s logged peer_connected for %s %d times, want once", n, p, c)
			}
		}
	}

	// 2. The status reply: every peer connected where it listens.
	dir := sharedDir(t, alice)
	py := filepath.Join(dir, "status.py")
	if err := os.WriteFile(py, []byte(statusPy), 0o755); err != nil {
		t.Fatal(err)
	}
	r = mustRun(t, 2*time.Minute, alice, "srun", "--jobid="+job, "--reft=arc", "-N3", "--ntasks-per-node=1", "/usr/bin/python3", py)
	seen := 0
	for _, l := range lines(r.Stdout) {
		var line struct {
			Node    string         `json:"node"`
			Type    int            `json:"type"`
			Peering *peeringStatus `json:"peering"`
		}
		if !strings.HasPrefix(l, "{") || json.Unmarshal([]byte(l), &line) != nil {
			continue
		}
		seen++
		p := line.Peering
		if line.Type != 0x82 || p == nil || p.State != "on" || p.Listen != listen[line.Node] || len(p.Peers) != len(nodes)-1 {
			t.Errorf("%s: status reply type 0x%x peering %+v; want on, listening on %s, %d peers", line.Node, line.Type, p, listen[line.Node], len(nodes)-1)
			continue
		}
		for _, pe := range p.Peers {
			if !pe.Connected || pe.Addr != listen[pe.Node] || pe.Error != "" {
				t.Errorf("%s sees peer %+v; want connected at %s", line.Node, pe, listen[pe.Node])
			}
		}
	}
	if seen != len(nodes) {
		t.Fatalf("%d status lines, want %d:\n%s", seen, len(nodes), r)
	}
}
