//go:build e2e

package e2e

// End-to-end test of `reft status` (issue 7): during a running job, its
// user sees every node's agent over the agents' peer ports, from the
// batch host and from outside the job; another user gets nothing.

import (
	"encoding/json"
	"os/user"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// statusReport is the part of `reft status --json` the test reads.
type statusReport struct {
	Job   string `json:"job"`
	State string `json:"state"`
	User  string `json:"user"`
	Spec  string `json:"spec"`
	Nodes []struct {
		Node     string   `json:"node"`
		Agent    string   `json:"agent"`
		Error    string   `json:"error"`
		Warnings []string `json:"warnings"`
		Status   *struct {
			Node  string `json:"node"`
			Ranks []struct {
				Rank       int   `json:"rank"`
				Newest     int64 `json:"newest"`
				Protection *struct {
					Connected bool   `json:"connected"`
					Mode      string `json:"mode"`
					Group     string `json:"group"`
					Position  int    `json:"position"`
					Members   []int  `json:"members"`
					ARC       bool   `json:"arc"`
				} `json:"protection"`
			} `json:"ranks"`
			Peering *struct {
				State string       `json:"state"`
				Peers []statusPeer `json:"peers"`
			} `json:"peering"`
			Memory *struct {
				Held   int64  `json:"held"`
				Budget uint64 `json:"budget"`
				InUse  int64  `json:"in_use"`
			} `json:"memory"`
		} `json:"status"`
	} `json:"nodes"`
}

type statusPeer struct {
	Node      string `json:"node"`
	Connected bool   `json:"connected"`
}

// TestReftStatus: a reft run job (4 ranks and a spare, --reft=arc) trains;
// alice asks `reft status` from outside the job, and from inside its batch
// script's allocation, as a table and as JSON: every training node's agent
// is up with its rank's newest committed step, sharded under arc in one
// group of four, its peers connected, bytes held within its budget. bob
// asking about alice's job is refused and learns nothing.
func TestReftStatus(t *testing.T) {
	enableReft(t)
	conf := filepath.Join(clusterDir, "etc", "reft-e2e.toml")
	flags := append(append([]string{}, trainFlags...), reftTrainFlags...)
	job, _ := untilNoInitCrash(t, func() (string, string) {
		job, dir := reftRunJobWith(t, "-N5 --no-kill --reft=arc,spares=1 --requeue", append(flags, "--dp", "4", "--steps", "100000")...)
		waitOutput(t, dir, job, "\nstep 5 loss")
		return job, dir
	})
	// The agents answer once their meshes connected: poll the JSON.
	var rep statusReport
	var raw string
	trained := []string{"n1", "n2", "n3", "n4"}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		r := run(t, time.Minute, alice, bin("reft"), "status", "--json", "--config", conf, job)
		raw = r.Stdout
		if r.Code != 0 {
			t.Fatalf("reft status --json as alice:\n%s", r)
		}
		if err := json.Unmarshal([]byte(r.Stdout), &rep); err != nil {
			t.Fatalf("reft status --json: %v\n%s", err, r.Stdout)
		}
		ready := len(rep.Nodes) == 5
		for _, n := range rep.Nodes {
			if slices.Contains(trained, n.Node) {
				ready = ready && n.Agent == "up" && n.Status != nil && len(n.Status.Ranks) == 1 && n.Status.Ranks[0].Newest >= 5 &&
					n.Status.Peering != nil && !slices.ContainsFunc(n.Status.Peering.Peers, func(p statusPeer) bool {
					return slices.Contains(trained, p.Node) && !p.Connected
				})
			}
		}
		if ready {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reft status never showed four agents up with their ranks and peers:\n%s", raw)
		}
	}
	if rep.Job != job || rep.State != "RUNNING" || rep.User != alice || rep.Spec == "" || !strings.HasPrefix(rep.Spec, "arc") {
		t.Errorf("report job %s state %s user %s spec %q", rep.Job, rep.State, rep.User, rep.Spec)
	}
	for i, n := range rep.Nodes[:4] {
		st := n.Status
		rk := st.Ranks[0]
		p := rk.Protection
		if n.Node != trained[i] || st.Node != n.Node || rk.Rank != i || p == nil || !p.Connected || p.Mode != "sharded" || !p.ARC ||
			p.Group != "(pp=0,tp=0)" || p.Position != i || !slices.Equal(p.Members, []int{0, 1, 2, 3}) {
			t.Errorf("%s: ranks %+v protection %+v", n.Node, st.Ranks, p)
		}
		if m := st.Memory; m == nil || m.Held <= 0 || m.InUse < m.Held || m.Budget < uint64(m.InUse) {
			t.Errorf("%s: memory %+v", n.Node, m)
		}
		if len(n.Warnings) > 0 {
			t.Errorf("%s: warnings on a healthy job: %v", n.Node, n.Warnings)
		}
	}
	// reft run keeps the spare out of the step, and the first reft step on
	// a node starts its agent: none there yet, which is no fault.
	spare := rep.Nodes[4]
	if spare.Node != "n5" || spare.Agent != "none" || len(spare.Warnings) > 0 {
		t.Errorf("the spare: %+v", spare)
	}

	// The table, from the batch host inside the job (SLURM_JOB_ID is the
	// default) and from outside it.
	inside := run(t, time.Minute, alice, "srun", "--jobid="+job, "--overlap", "--reft=off", "-w", "n1", "-N1", "-n1",
		bin("reft"), "status", "--config", conf)
	outside := run(t, time.Minute, alice, bin("reft"), "status", "--config", conf, job)
	for _, r := range []result{inside, outside} {
		if r.Code != 0 || !strings.Contains(r.Stdout, "job "+job+" ("+alice+") RUNNING, --reft=arc") ||
			!strings.Contains(r.Stdout, "arc SG(pp=0,tp=0) 1/4") || !strings.Contains(r.Stdout, "n2    up") {
			t.Errorf("reft status:\n%s", r)
		}
	}
	t.Logf("reft status:\n%s", outside.Stdout)

	// bob, about alice's job: refused, and nothing of the job printed.
	r := run(t, time.Minute, bob, bin("reft"), "status", "--config", conf, job)
	if r.Code != 1 || !strings.Contains(r.Stderr, "belongs to "+alice) || strings.Contains(r.Stdout, "n1") {
		t.Errorf("reft status as bob about alice's job:\n%s", r)
	}
	t.Logf("as bob: %s", strings.TrimSpace(r.Stderr))

	mustRun(t, time.Minute, alice, "scancel", job)
	waitJobEnd(t, job, 2*time.Minute)
	u, _ := user.Lookup(alice)
	run(t, time.Minute, alice, "srun", "-N5", "--ntasks-per-node=1", "-w", "n[1-5]", "rm", "-rf", filepath.Join(reftStoreRoot, u.Uid, job))
}
