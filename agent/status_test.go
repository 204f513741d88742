package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/reft-hpc/reft/agent/mesh"
	"github.com/reft-hpc/reft/agent/peer"
	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/launcher/status"
	"github.com/reft-hpc/reft/tmpfs"
)

// fakeJobs is a JobSource with a fixed answer.
type fakeJobs status.Job

func (f fakeJobs) Job(context.Context, string) (status.Job, error) { return status.Job(f), nil }

// TestReftStatus: `reft status` against four in-process agents under arc,
// DP = 4, over their peer ports: every node up with its rank's newest
// step, sharded protection and peers; a node whose agent stopped is down
// and its peers say they lost it; another user's job is refused before
// any agent is asked, and an agent refuses a caller of another uid on its
// own.
func TestReftStatus(t *testing.T) {
	names := []string{"n1", "n2", "n3", "n4"}
	j := startJob(t, "arc", names, map[string]string{}, "")
	j.saveSteps(3, true)
	// Rank 0 is connected again (a live trainer), the others are gone.
	c := j.open(0, shBuffers(0, 0, true))
	defer c.Close()
	if _, err := c.Generations(context.Background()); err != nil { // registers
		t.Fatal(err)
	}

	uid := os.Getuid()
	job := status.Job{ID: shJob, State: "RUNNING", User: "me", UID: uid, NodeStates: map[string]string{"n3": "DOWN*"}}
	for i, n := range names {
		job.Nodes = append(job.Nodes, mesh.Node{Index: i, Name: n, Addr: "127.0.0.1"})
	}
	opts := func(callerUID int, jobUID int) status.Options {
		auth, err := peer.NewSecret(shKey, callerUID)
		if err != nil {
			t.Fatal(err)
		}
		jb := job
		jb.UID = jobUID
		return status.Options{Jobs: fakeJobs(jb), Timeout: 10 * time.Second,
			Peer: peer.Config{Job: shJob, UID: callerUID, Node: "reft-status@test", Auth: auth, PortRange: [2]int{j.lo, j.lo + 63}}}
	}
	// query polls until every node's report satisfies ok.
	query := func(o status.Options, ok func(status.NodeReport) bool) *status.Report {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			rep, err := status.Query(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.ContainsFunc(rep.Nodes, func(n status.NodeReport) bool { return !ok(n) }) {
				return rep
			}
			if time.Now().After(deadline) {
				var b bytes.Buffer
				status.Print(&b, rep)
				t.Fatalf("reft status did not settle:\n%s", b.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	allConnected := func(n status.NodeReport) bool {
		return n.Status != nil && n.Status.Peering != nil && !slices.ContainsFunc(n.Status.Peering.Peers, func(p proto.PeerStatus) bool { return !p.Connected })
	}

	rep := query(opts(uid, uid), allConnected)
	if rep.Spec != "arc" || rep.User != "me" || len(rep.Nodes) != 4 {
		t.Fatalf("report %+v", rep)
	}
	for i, n := range rep.Nodes {
		st := n.Status
		if n.Agent != status.AgentUp || st.Node != names[i] || len(st.Ranks) != 1 {
			t.Fatalf("%s: %+v", names[i], n)
		}
		r := st.Ranks[0]
		p := r.Protection
		if r.Rank != i || r.Newest != 3 || p == nil || p.Mode != proto.ProtectSharded || !p.ARC || p.Group != "(pp=0,tp=0)" ||
			p.Position != i || !slices.Equal(p.Members, []int{0, 1, 2, 3}) || p.Connected != (i == 0) {
			t.Errorf("%s: rank %+v, protection %+v", names[i], r, p)
		}
		if m := st.Memory; m == nil || m.Held <= 0 || m.InUse < m.Held {
			t.Errorf("%s: memory %+v", names[i], m)
		}
		if len(n.Warnings) != 0 {
			t.Errorf("%s: warnings %v on a healthy job", names[i], n.Warnings)
		}
	}
	var table bytes.Buffer
	status.Print(&table, rep)
	for _, want := range []string{"job " + shJob + " (me) RUNNING, --reft=arc, 4 nodes", "NODE", "n2    up     1      3          arc SG(pp=0,tp=0) 1/4 (rank gone)  3/3"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	t.Logf("reft status:\n%s", table.String())

	// Another user's job: refused before any agent is asked.
	if _, err := status.Query(context.Background(), opts(uid, uid+1)); !errors.Is(err, status.ErrForeign) || !strings.Contains(err.Error(), "belongs to me") {
		t.Errorf("another user's job: %v", err)
	}
	// A caller of another uid that gets past that check (a job record it
	// forged): every agent refuses it, and it learns nothing.
	rep = query(opts(uid+1, uid+1), func(n status.NodeReport) bool { return n.Agent != "" })
	for _, n := range rep.Nodes {
		if n.Agent != status.AgentRefused || n.Status != nil || !strings.Contains(n.Error, "uid") {
			t.Errorf("%s for another uid: %+v", n.Node, n)
		}
	}

	// n3's agent stops: down, with why; the others lost it.
	j.nodes[2].stop()
	rep = query(opts(uid, uid), func(n status.NodeReport) bool {
		if n.Node == "n3" {
			return n.Agent == status.AgentDown
		}
		return n.Agent == status.AgentUp && slices.Contains(n.Warnings, "not connected to n3")
	})
	n3 := rep.Nodes[2]
	if !strings.Contains(n3.Error, "connection refused") || !slices.Contains(n3.Warnings, "Slurm says the node is DOWN*") {
		t.Errorf("n3: %+v", n3)
	}
	table.Reset()
	status.Print(&table, rep)
	if !strings.Contains(table.String(), "n3: no agent of this job answers on its ports") {
		t.Errorf("table:\n%s", table.String())
	}
	t.Logf("with n3's agent stopped:\n%s", table.String())

	// A save that fails on n1 (an arena larger than any tmpfs) is counted
	// in n1's store section of `reft status --json`, with a note.
	huge := tmpfs.Spec{Step: 99, ChunkSize: 1 << 30, Buffers: []tmpfs.BufferSpec{{Name: "x", Size: 1 << 50}}}
	if _, err := j.nodes[0].st.Begin(tmpfs.Key{Rank: 0, Shard: "forced"}, huge); err == nil {
		t.Fatal("a 1 PiB save succeeded")
	}
	rep = query(opts(uid, uid), func(n status.NodeReport) bool {
		return n.Node != "n1" || (n.Status != nil && n.Status.Store != nil && n.Status.Store.SaveFailures == 1)
	})
	js, err := json.Marshal(rep) // what `reft status --json` prints
	if err != nil {
		t.Fatal(err)
	}
	var parsed struct {
		Nodes []struct {
			Node   string `json:"node"`
			Status *struct {
				Store  map[string]int64 `json:"store"`
				Memory map[string]int64 `json:"memory"`
			} `json:"status"`
			Warnings []string `json:"warnings"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal(js, &parsed); err != nil {
		t.Fatal(err)
	}
	n1 := parsed.Nodes[0]
	if n1.Node != "n1" || n1.Status == nil || n1.Status.Store["save_failures"] != 1 || n1.Status.Store["commits"] < 3 ||
		!slices.ContainsFunc(n1.Warnings, func(w string) bool { return strings.Contains(w, "1 snapshot save(s) failed") }) {
		t.Fatalf("n1 in reft status --json after a failed save: %s", js)
	}
	if _, ok := n1.Status.Memory["budget_refusals"]; !ok {
		t.Fatalf("n1's memory section lacks budget_refusals: %s", js)
	}
}
