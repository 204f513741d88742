//go:build e2e

package e2e

import (
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

// TestForeignJobAgentGetsNothing: alice's and bob's --reft jobs share nodes
// n1 and n2, and bob's agent really dials alice's agent. The port range is
// chosen, from the two job ids, so that bob's n2 agent's first candidate
// port is the one alice's agent already listens on: bob's n2 agent moves
// to its next candidate, and bob's n1 agent, searching n2's candidates in
// order, reaches alice's agent first. Alice's agent must refuse it at the
// handshake (bob's MUNGE credential names bob's job), log the refusal, and
// go on serving its own job; bob's agents must still find each other.
func TestForeignJobAgentGetsNothing(t *testing.T) {
	enableReft(t)
	ja := allocateAs(t, alice, "--reft=arc", "-N2", "-n2", "-w", "n1,n2")
	const lo = 47000
	var jb string
	var hi, collide int
	// For about one pair of job ids in 25 no span collides as wanted
	// (a CI run: jobs 2969 and 2970); bob then takes another allocation,
	// whose new id gives another chance, at most three in all.
	for try := 1; hi == 0; try++ {
		jb = allocateAs(t, bob, "--reft=arc", "-N2", "-n2", "-w", "n1,n2")
		hi, collide = collidingRange(ja, jb, lo, 600)
		if hi == 0 {
			if try == 3 {
				t.Fatalf("no port range in [%d, %d] makes bob's n2 agent collide with job %s's (bob's last job %s)", lo, lo+600, ja, jb)
			}
			t.Logf("no port range in [%d, %d] makes job %s's n2 agent collide with job %s's; bob allocates again", lo, lo+600, jb, ja)
			run(t, time.Minute, root, "scancel", jb)
		}
	}
	conf := filepath.Join(clusterDir, "etc", "reft-e2e.toml")
	b, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	ranged := strings.Replace(string(b), "[agent]\n", fmt.Sprintf("[agent]\nport_range = [%d, %d]\n", lo, hi), 1)
	if err := os.WriteFile(conf, []byte(ranged), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("jobs %s (alice) and %s (bob), port_range [%d, %d]: bob's n2 agent's first candidate %d is alice's", ja, jb, lo, hi, collide)

	// Alice's agents first, connected to each other; then bob's.
	mustRun(t, 2*time.Minute, alice, "srun", "--jobid="+ja, "--reft=arc", "-N2", "-n2", "true")
	waitConnected(t, ja, "n1", "n2")
	mustRun(t, 2*time.Minute, bob, "srun", "--jobid="+jb, "--reft=arc", "-N2", "-n2", "true")
	waitConnected(t, jb, "n1", "n2")

	// Which of alice's agents listens on the port bob's agent was sent to.
	var owner string
	for _, n := range []string{"n1", "n2"} {
		for _, e := range agentEvents(t, ja, n)["peer_listening"] {
			if a, _ := e["addr"].(string); strings.HasSuffix(a, ":"+strconv.Itoa(collide)) {
				owner = n
			}
		}
	}
	if owner == "" {
		t.Fatalf("no agent of job %s listens on port %d (its first candidate); cannot tell whose port bob's agent tried", ja, collide)
	}
	// The credential is bob's (munged vouches for his uid) and names his
	// job; the listener refuses on the first that differs, the job.
	refusal := fmt.Sprintf("dialer is job %q; this agent serves job %q", jb, ja)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var got []string
		for _, e := range agentEvents(t, ja, owner)["peer_refused"] {
			msg, _ := e["error"].(string)
			got = append(got, msg)
			if strings.Contains(msg, refusal) {
				t.Logf("%s's agent of job %s: peer_refused %q from %v", owner, ja, msg, e["remote"])
				goto refused
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's agent of job %s logged no refusal naming %q; its refusals: %q", owner, ja, refusal, got)
		}
		time.Sleep(200 * time.Millisecond)
	}
refused:
	// Bob's n2 agent sits on its second candidate, and bob's n1 agent
	// connected to it there, never to alice's port.
	for _, e := range agentEvents(t, jb, "n1")["peer_connected"] {
		if a, _ := e["addr"].(string); strings.HasSuffix(a, ":"+strconv.Itoa(collide)) {
			t.Errorf("bob's n1 agent connected to alice's port %d: %v", collide, e)
		}
	}
	// Alice's agent served bob nothing: no authenticated connection of bob's
	// job reached it, and alice's own agents are still connected.
	for _, n := range []string{"n1", "n2"} {
		for _, e := range agentEvents(t, ja, n)["peer_connected"] {
			if pn, _ := e["peer_node"].(string); pn != "n1" && pn != "n2" {
				t.Errorf("job %s's agent on %s connected to %v", ja, n, e)
			}
		}
	}
	waitConnected(t, ja, "n1", "n2")
}

// allocateAs is allocate for any user.
// collidingRange finds a port range [lo, hi] (span under max) in which
// job jb's n2 agent (index 1 of 2) has for its first candidate port one
// of job ja's agents' first candidates, and nothing else collides: bob's
// n2 agent's second candidate and his n1 agent's first are free. hi is 0
// when there is none.
func collidingRange(ja, jb string, lo, max int) (hi, collide int) {
	for span := 2 * mesh.NumCandidates; span < max; span++ {
		h := lo + span - 1
		aPorts := []int{mesh.Candidates(ja, lo, h, 0, 2)[0], mesh.Candidates(ja, lo, h, 1, 2)[0]}
		b0, b1 := mesh.Candidates(jb, lo, h, 0, 2), mesh.Candidates(jb, lo, h, 1, 2)
		if slices.Contains(aPorts, b1[0]) && !slices.Contains(aPorts, b1[1]) && !slices.Contains(aPorts, b0[0]) {
			return h, b1[0]
		}
	}
	return 0, 0
}

func allocateAs(t *testing.T, who string, args ...string) string {
	t.Helper()
	r := mustRun(t, 3*time.Minute, who, append([]string{"salloc", "--no-shell", "--time=15"}, args...)...)
	m := grantedRe.FindStringSubmatch(r.Stderr)
	if m == nil {
		t.Fatalf("salloc as %s granted no allocation:\n%s", who, r)
	}
	id := m[1]
	t.Cleanup(func() { run(t, time.Minute, root, "scancel", id) })
	return id
}

// waitConnected waits until the agents of job on nodes report each other
// connected in their logs.
func waitConnected(t *testing.T, job string, nodes ...string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for _, n := range nodes {
		for {
			got := map[string]bool{}
			for _, e := range agentEvents(t, job, n)["peer_connected"] {
				got[e["peer_node"].(string)] = true
			}
			if len(got) >= len(nodes)-1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("job %s: %s's agent connected to %v, want the other nodes of %v", job, n, got, nodes)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}
