package agent

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/agent/peer"
	"github.com/reft-hpc/reft/agent/sg"
	reftclient "github.com/reft-hpc/reft/client"
	"github.com/reft-hpc/reft/spank/spec"
	"github.com/reft-hpc/reft/tmpfs"
)

// Background replication (replicate.go) over the sharded harness: every
// rank registers "rng", a Sharded buffer that only its own generation
// holds, so after a node loss only a placement peer's replica gives it back.

// replicaHolders are the nodes (by name) that keep copies of node's
// ranks' unreplicated buffers: reft explain's placement (sg.Model) of the
// job's ranks, allocation and failure domains.
func (j *shJobRun) replicaHolders(node string, copies int) []string {
	j.t.Helper()
	rankNode := make([]string, len(j.nodes))
	for r, n := range j.nodes {
		rankNode[r] = n.name
	}
	return modelHolders(j.t, j.spec, rankNode, j.alloc(), j.opt.topo)[node]
}

// modelHolders is the placement `reft explain` computes for spc: every
// node's holders.
func modelHolders(t testing.TB, spc string, rankNode, alloc []string, topo config.Topology) map[string][]string {
	t.Helper()
	sp, err := spec.Parse(spc)
	if err != nil {
		t.Fatal(err)
	}
	dom, err := topo.DomainsOf(alloc)
	if err != nil {
		t.Fatal(err)
	}
	md, err := sg.NewModel(sg.Job{Spec: sp, Layout: sg.Layout{DP: len(rankNode), PP: 1, TP: 1},
		Topology: sg.Topology{RankNode: rankNode, Nodes: alloc, Domain: dom}})
	if err != nil {
		t.Fatal(err)
	}
	return md.Placement.Holders
}

func (j *shJobRun) node(name string) *shNode {
	for _, n := range j.nodes {
		if n.name == name {
			return n
		}
	}
	j.t.Fatalf("no node %s", name)
	return nil
}

// replicaStep is the newest replica step of rank on n; -1: none.
func replicaStep(n *shNode, rank int) int64 {
	g, ok := n.st.Latest(tmpfs.Key{Rank: rank, Shard: replicaShard})
	if !ok {
		return -1
	}
	return g.Step
}

// waitFor polls cond until it holds; the deadline only bounds a hung test.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

// waitReplicas waits until every holder of every rank has its replica of
// step.
func (j *shJobRun) waitReplicas(t *testing.T, step int64, copies int) {
	t.Helper()
	for r, n := range j.nodes {
		for _, h := range j.replicaHolders(n.name, copies) {
			waitFor(t, fmt.Sprintf("%s's replica of rank %d step %d", h, r, step), func() bool { return replicaStep(j.node(h), r) == step })
		}
	}
}

// TestReplicaRestoresLostNode: the lost nodes' Sharded buffers come back
// bit for bit from their placement peers' replicas, and the replacement's
// restore event names the peer source.
func TestReplicaRestoresLostNode(t *testing.T) {
	cases := []struct {
		spec   string
		copies int
		lost   []int
	}{
		{"arc", 1, []int{0}},
		{"arc", 1, []int{3}},
		{"aec", 1, []int{2}},
		{"arc+aec", 2, []int{1, 2}},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%s/lost=%v", tc.spec, tc.lost), func(t *testing.T) {
			roots := map[string]string{}
			j := startJob(t, tc.spec, []string{"n1", "n2", "n3", "n4"}, roots, "")
			j.saveSteps(3, true)
			j.waitReplicas(t, 3, tc.copies)
			j = j.relaunch(roots, tc.lost)
			step, errs, bufs := j.restoreAll(true)
			if step != 3 {
				t.Fatalf("agreed on step %d, want 3 (errors %v)", step, errs)
			}
			checkRestored(t, step, errs, bufs, true)
			for _, r := range tc.lost {
				var sources []string
				for _, ev := range []string{"restore_peer", "decode"} {
					for _, e := range j.nodes[r].log.Events(ev) {
						sources = append(sources, fmt.Sprint(e["sources"]))
					}
				}
				if len(sources) != 1 || !strings.Contains(sources[0], "unreplicated:peer@") {
					t.Errorf("rank %d's replacement logged restore sources %q, want one restore naming unreplicated:peer@<holder>", r, sources)
				}
			}
		})
	}
}

// TestReplicaMissingOrLagging: a lost rank whose replica is missing, or
// older than the step asked for, gets a reason that says so; with a
// lagging replica the job restores the older step that every rank, the
// replica included, still has.
func TestReplicaMissingOrLagging(t *testing.T) {
	t.Run("missing", func(t *testing.T) {
		roots := map[string]string{}
		j := startJob(t, "arc", []string{"n1", "n2", "n3", "n4"}, roots, "")
		j.saveSteps(2, true)
		j.waitReplicas(t, 2, 1)
		for _, h := range j.replicaHolders("n4", 1) {
			// No commit follows, so nothing copies it again.
			if err := j.node(h).st.Drop(tmpfs.Key{Rank: 3, Shard: replicaShard}); err != nil {
				t.Fatal(err)
			}
		}
		j = j.relaunch(roots, []int{3})
		c := j.open(3, shBuffers(0, 3, true))
		defer c.Close()
		err := c.RestoreStep(context.Background(), 2)
		if err == nil || !strings.Contains(err.Error(), "rank 3's unreplicated buffers (rng) of step 2") ||
			!strings.Contains(err.Error(), "no placement peer holds a replica") {
			t.Fatalf("restore error %v: want rank 3's unreplicated buffers named and no replica", err)
		}
		t.Logf("error: %v", err)
	})
	t.Run("lagging", func(t *testing.T) {
		roots := map[string]string{}
		j := startJob(t, "arc", []string{"n1", "n2", "n3", "n4"}, roots, "")
		j.saveSteps(2, true)
		j.waitReplicas(t, 2, 1)
		// The holder of n4's ranks enters a communication phase: it takes
		// step 3's request but copies nothing.
		h := j.node(j.replicaHolders("n4", 1)[0])
		side := sideClient(t, h)
		side.CommPhase(true)
		waitFor(t, h.name+"'s limiter paused", h.srv.repl.lim.Paused)
		req := h.srv.repl.requested.Load()
		j.saveRange(3, 3, true)
		waitFor(t, h.name+" taking step 3's request", func() bool { return h.srv.repl.requested.Load() > req })
		if got := replicaStep(h, 3); got != 2 {
			t.Fatalf("%s holds rank 3's replica of step %d while paused, want 2", h.name, got)
		}
		// The holder's replication ends with the pause on: stopping the
		// agents closes the side client, which ends its phase, and under
		// load the holder copied step 3 before it stopped (a clean-clone
		// run at load 16: the restore of step 3 succeeded).
		h.srv.repl.cancel()
		j = j.relaunch(roots, []int{3})
		c := j.open(3, shBuffers(0, 3, true))
		err := c.RestoreStep(context.Background(), 3)
		c.Close()
		if err == nil || !strings.Contains(err.Error(), "newest replica on its placement peers is of step 2, older than step 3") {
			t.Fatalf("restore error %v: want the replica's step 2 named as older than step 3", err)
		}
		t.Logf("error: %v", err)
		step, errs, bufs := j.restoreAll(true)
		if step != 2 {
			t.Fatalf("agreed on step %d, want 2, the newest the replica has (errors %v)", step, errs)
		}
		checkRestored(t, step, errs, bufs, true)
	})
}

// sideClient opens a connection to n's agent that registers nothing: a
// rank's second client, used only for comm notices.
func sideClient(t *testing.T, n *shNode) *reftclient.Client {
	t.Helper()
	c, err := reftclient.Open(context.Background(), reftclient.Options{Socket: n.sock, Rank: 0, World: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestReplicaPausedDuringCommPhase: while a rank on the holder's or on the
// owner's node is in a communication phase, the holder takes the request
// but commits no replica; it commits only after the phase ends, or after
// the connection that began it closes.
func TestReplicaPausedDuringCommPhase(t *testing.T) {
	cases := []struct {
		name  string
		phase func(j *shJobRun, holder *shNode) *shNode // the node whose rank enters the phase
		end   func(c *reftclient.Client)
	}{
		{"holder, phase ends", func(j *shJobRun, h *shNode) *shNode { return h }, func(c *reftclient.Client) { c.CommPhase(false) }},
		{"owner, phase ends", func(j *shJobRun, h *shNode) *shNode { return j.nodes[0] }, func(c *reftclient.Client) { c.CommPhase(false) }},
		{"holder, rank exits in the phase", func(j *shJobRun, h *shNode) *shNode { return h }, func(c *reftclient.Client) { c.Close() }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			roots := map[string]string{}
			j := startJob(t, "arc", []string{"n1", "n2", "n3", "n4"}, roots, "")
			h := j.node(j.replicaHolders("n1", 1)[0])
			paused := tc.phase(j, h)
			side := sideClient(t, paused)
			side.CommPhase(true)
			side.CommPhase(true) // unchanged: no second pause to undo
			waitFor(t, paused.name+"'s limiter paused", paused.srv.repl.lim.Paused)
			j.saveSteps(1, true)
			waitFor(t, h.name+" taking rank 0's request", func() bool { return h.srv.repl.requested.Load() > 0 })
			if paused == h {
				waitFor(t, h.name+"'s copy waiting on the pause", func() bool { return h.srv.repl.pausedWaits.Load() > 0 })
			} else {
				waitFor(t, h.name+"'s fetch to start", func() bool { return h.srv.repl.fetching.Load() > 0 })
			}
			if got := replicaStep(h, 0); got != -1 || h.srv.repl.committed.Load() != 0 {
				t.Fatalf("%s committed rank 0's replica of step %d during the communication phase", h.name, got)
			}
			tc.end(side)
			waitFor(t, h.name+"'s replica of rank 0 after the phase", func() bool { return replicaStep(h, 0) == 1 })
			if paused.srv.repl.lim.Paused() {
				t.Errorf("%s's limiter still paused after the phase ended", paused.name)
			}
		})
	}
}

// TestReplicaSchedules: [protect] background_schedule on both nodes.
// "unscheduled" copies during a holder's communication phase; "idle",
// before it has learned a timeline, holds the copy in its gate (not the
// limiter's pause) until the phase ends. The schedule itself is
// agent/netsched's tests.
func TestReplicaSchedules(t *testing.T) {
	cases := []struct {
		policy string
		held   bool // no replica commits during the phase
	}{
		{config.ScheduleUnscheduled, false},
		{config.ScheduleIdle, true},
	}
	for _, tc := range cases {
		t.Run(tc.policy, func(t *testing.T) {
			j := startJob(t, "arc", []string{"n1", "n2", "n3", "n4"}, map[string]string{}, "")
			for _, n := range j.nodes {
				if err := n.srv.SetBackground(config.Protect{BackgroundBurst: 8 << 20, BackgroundSchedule: tc.policy}); err != nil {
					t.Fatal(err)
				}
			}
			h := j.node(j.replicaHolders("n1", 1)[0])
			side := sideClient(t, h)
			side.CommPhase(true)
			waitFor(t, h.name+"'s phase", func() bool { h.srv.repl.mu.Lock(); defer h.srv.repl.mu.Unlock(); return h.srv.repl.comm == 1 })
			j.saveSteps(1, true)
			if !tc.held {
				waitFor(t, h.name+"'s replica of rank 0 during the phase", func() bool { return replicaStep(h, 0) == 1 })
				if h.srv.repl.lim.Paused() {
					t.Errorf("%s's limiter paused under %q", h.name, tc.policy)
				}
				side.CommPhase(false)
				return
			}
			waitFor(t, h.name+"'s fetch to start", func() bool { return h.srv.repl.fetching.Load() > 0 })
			if got := replicaStep(h, 0); got != -1 {
				t.Fatalf("%s committed rank 0's replica of step %d during the communication phase", h.name, got)
			}
			if h.srv.repl.lim.Paused() {
				t.Errorf("%s's limiter paused under %q: the gate holds the copy, not the pause", h.name, tc.policy)
			}
			side.CommPhase(false)
			waitFor(t, h.name+"'s replica of rank 0 after the phase", func() bool { return replicaStep(h, 0) == 1 })
			if st := h.srv.repl.sched.Stats(); st.Profiled || st.Unplanned == 0 {
				t.Errorf("%s's schedule %+v: want no profile from one phase, and the copy's chunks admitted unplanned", h.name, st)
			}
		})
	}
}

// TestHolders: the agent's placement peers are those of reft explain's
// model (sg.Model.Placement) over the nodes that host ranks: spares keep
// no copies wherever they sit in the allocation, placement groups span
// failure domains, and nodes with several ranks count once.
func TestHolders(t *testing.T) {
	racks := config.Topology{Domains: map[string]string{"rackA": "n[1-2]", "rackB": "n[3-4],s1"}}
	pattern := config.Topology{DomainPattern: `^n(\d)`} // one domain per digit: n1a, n1b share one
	cases := []struct {
		name     string
		spec     string
		rankNode []string // by rank
		alloc    []string // allocation order; nil: the ranks' nodes
		topo     config.Topology
		self     string
		want     []string // nil: only compared with the model
	}{
		{"arc, 4 nodes", "arc", []string{"n1", "n2", "n3", "n4"}, nil, config.Topology{}, "n1", []string{"n2"}},
		{"arc, 4 nodes, last", "arc", []string{"n1", "n2", "n3", "n4"}, nil, config.Topology{}, "n4", []string{"n3"}},
		{"arc, 5 nodes: mixed", "arc", []string{"n1", "n2", "n3", "n4", "n5"}, nil, config.Topology{}, "n5", []string{"n3"}},
		{"arc+aec: ring of four", "arc+aec", []string{"n1", "n2", "n3", "n4"}, nil, config.Topology{}, "n3", []string{"n4", "n1"}},
		{"arc, spare last", "arc", []string{"n1", "n2", "n3", "n4"}, []string{"n1", "n2", "n3", "n4", "s1"}, config.Topology{}, "n4", []string{"n3"}},
		{"arc, spare first", "arc", []string{"n1", "n2", "n3", "n4"}, []string{"s1", "n1", "n2", "n3", "n4"}, config.Topology{}, "n1", []string{"n2"}},
		{"arc, spare between", "arc", []string{"n1", "n2", "n3", "n4"}, []string{"n1", "s1", "n2", "n3", "n4"}, config.Topology{}, "n2", []string{"n1"}},
		{"arc, racks: groups span them", "arc", []string{"n1", "n2", "n3", "n4"}, nil, racks, "n1", []string{"n3"}},
		{"arc, racks and a spare", "arc", []string{"n1", "n2", "n3", "n4"}, []string{"n1", "s1", "n2", "n3", "n4"}, racks, "n2", []string{"n4"}},
		{"aec:2, racks, spare", "aec:2", []string{"n1", "n2", "n3", "n4", "n5"}, []string{"n1", "n2", "s1", "n3", "n4", "n5"}, racks, "n3", nil},
		{"arc, two ranks a node", "arc", []string{"n1a", "n1a", "n2a", "n2a", "n3a", "n3a"}, []string{"n1a", "n2a", "s1", "n3a"}, config.Topology{}, "n3a", nil},
		{"arc, domain pattern", "arc", []string{"n1a", "n1b", "n2a", "n2b"}, []string{"n1a", "n1b", "n2a", "n2b", "n3a"}, pattern, "n1a", []string{"n2a"}},
		{"arc+aec, two nodes: copies cut", "arc+aec", []string{"n1", "n2", "n2"}, []string{"n1", "s1", "n2"}, config.Topology{}, "n1", []string{"n2"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			alloc := tc.alloc
			if alloc == nil {
				alloc = slices.Compact(slices.Clone(tc.rankNode))
			}
			want := modelHolders(t, tc.spec, tc.rankNode, alloc, tc.topo)
			hosting := map[string]bool{}
			for _, n := range tc.rankNode {
				hosting[n] = true
			}
			var names []string
			for _, n := range alloc {
				if hosting[n] {
					names = append(names, n)
				}
			}
			dom, err := tc.topo.DomainsOf(names)
			if err != nil {
				t.Fatal(err)
			}
			sp, _ := spec.Parse(tc.spec)
			copies := max(sp.AECParity, boolInt(sp.AEC)) + boolInt(sp.ARC)
			for _, n := range alloc {
				got, _, err := holders(alloc, hosting, dom, n, copies)
				if !hosting[n] {
					if err == nil {
						t.Errorf("spare %s got holders %v, want an error (it hosts no rank)", n, got)
					}
					if len(want[n]) > 0 {
						t.Errorf("the model gives spare %s holders %v", n, want[n])
					}
					continue
				}
				if err != nil || !slices.Equal(got, want[n]) {
					t.Errorf("holders of %s = %v, %v; the model (reft explain) says %v", n, got, err, want[n])
				}
				for _, h := range got {
					if !hosting[h] {
						t.Errorf("holders of %s include %s, which hosts no rank", n, h)
					}
				}
			}
			if tc.want != nil {
				if got, _, _ := holders(alloc, hosting, dom, tc.self, copies); !slices.Equal(got, tc.want) {
					t.Errorf("holders of %s = %v, want %v", tc.self, got, tc.want)
				}
			}
		})
	}
	t.Run("one node", func(t *testing.T) {
		if _, _, err := holders([]string{"n1", "s1"}, map[string]bool{"n1": true}, nil, "n1", 1); err == nil || !strings.Contains(err.Error(), "no other node") {
			t.Errorf("one node with ranks: error %v, want no other node", err)
		}
	})
}

// TestReplicaPlacementLikeExplain: four ranks on n1-n4 of an allocation
// with a spare between them (n1 s1 n2 n3 n4) in two racks, in one
// sharding group (dp=4) or two (dp=2,pp=2: an agent's group search finds
// only half the ranks, the placement's search the rest). The copies of
// every rank's unreplicated buffers land exactly where reft explain's
// placement puts them (across the racks, none on the spare), the agents
// log that placement, and after n2 is lost and its rank relaunched on the
// spare, every rank restores bit for bit, rank 1's unreplicated buffers
// from a placement peer.
func TestReplicaPlacementLikeExplain(t *testing.T) {
	racks := config.Topology{Domains: map[string]string{"rackA": "n[1-2]", "rackB": "n[3-4],s1"}}
	for _, layout := range []string{"dp=4", "dp=2,pp=2"} {
		t.Run(layout, func(t *testing.T) {
			roots := map[string]string{}
			j := startJob(t, "arc", []string{"n1", "n2", "n3", "n4"}, roots, "", shOpts{topo: racks, alloc: []string{"n1", "s1", "n2", "n3", "n4"}, layout: layout})
			j.saveSteps(3, true)
			j.waitReplicas(t, 3, 1)
			want := map[string][]string{}
			for r, n := range j.nodes {
				want[n.name] = j.replicaHolders(n.name, 1)
				for _, h := range want[n.name] {
					if slices.Contains([]string{"n1", "n2"}, h) == slices.Contains([]string{"n1", "n2"}, n.name) {
						t.Errorf("%s's copies are on %s, in the same rack", n.name, h)
					}
				}
				for _, o := range append(slices.Clone(j.nodes), j.spares...) {
					if o != n && !slices.Contains(want[n.name], o.name) && replicaStep(o, r) >= 0 {
						t.Errorf("%s holds a replica of rank %d, but reft explain's placement puts it on %v", o.name, r, want[n.name])
					}
				}
				evs := n.log.Events("replica_placement")
				if len(evs) == 0 || fmt.Sprint(evs[len(evs)-1]["holders"]) != fmt.Sprint(want[n.name]) {
					t.Errorf("%s logged replica_placement %v, want holders %v", n.name, evs, want[n.name])
				}
				if evs := n.log.Events("replica_placement_partial"); len(evs) > 0 {
					t.Errorf("%s placed without the full rank map: %v", n.name, evs)
				}
			}
			if len(j.spares) != 1 || j.spares[0].name != "s1" || len(j.spares[0].st.Keys()) != 0 {
				t.Fatalf("spare s1 holds %v, want nothing", j.spares[0].st.Keys())
			}
			t.Logf("holders: %v", want)
			j = j.relaunch(roots, []int{1})
			step, errs, bufs := j.restoreAll(true)
			if step != 3 {
				t.Fatalf("agreed on step %d, want 3 (errors %v)", step, errs)
			}
			checkRestored(t, step, errs, bufs, true)
			if ev, fields := restoreEvent(t, j.nodes[1]); !strings.Contains(fmt.Sprint(fields["sources"]), "unreplicated:peer@"+want["n2"][0]) {
				t.Errorf("rank 1 on the spare logged %s with sources %v, want its unreplicated buffers from %s", ev, fields["sources"], want["n2"][0])
			}
		})
	}
}

// TestReplicateRequestChecks: the handler refuses requests that do not
// name a rank's generation and its unreplicated sections.
func TestReplicateRequestChecks(t *testing.T) {
	roots := map[string]string{}
	j := startJob(t, "arc", []string{"n1", "n2"}, roots, "")
	r := j.nodes[1].srv.repl
	good := peer.ReplicateRequest{GenKey: peer.GenKey{Rank: 0, Shard: tmpfs.DefaultShard, Step: 1}, Sections: []string{"rng"}}
	cases := []struct {
		name string
		from string
		edit func(*peer.ReplicateRequest)
		want string
	}{
		{"no node", "", func(*peer.ReplicateRequest) {}, "did not name its node"},
		{"other shard", "n1", func(q *peer.ReplicateRequest) { q.Shard = replicaShard }, "not a rank's generation"},
		{"no sections", "n1", func(q *peer.ReplicateRequest) { q.Sections = nil }, "no sections"},
		{"agent section", "n1", func(q *peer.ReplicateRequest) { q.Sections = []string{secShard} }, "not an unreplicated buffer"},
	}
	for _, tc := range cases {
		q := good
		tc.edit(&q)
		if err := r.receive(tc.from, q); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.want)
		}
	}
	if n := r.requested.Load(); n != 0 {
		t.Errorf("%d refused requests counted as taken", n)
	}
}

// BenchmarkReplication: background replication of a rank's unreplicated
// buffer between two agents of the sharded harness (arc, DP = 2, 4 MiB
// chunks, a 32 MiB Sharded buffer per rank). Every op saves one step on
// both ranks and waits until each holder has committed its replica of it.
// copy_ms is the holders' mean time from taking a request to committing
// the replica (manifest, background fetch, commit); MB/s counts both
// ranks' replicated bytes per op. The sub-benchmarks set the agents'
// background_rate: unlimited, and a cap that the copy must honour.
func BenchmarkReplication(b *testing.B) {
	const size = 32 << 20
	for _, tc := range []struct {
		name string
		rate int64
	}{{"unlimited", 0}, {"rate=128MiB/s", 128 << 20}} {
		b.Run(tc.name, func(b *testing.B) {
			bufs := func(step int64, rank int, _ bool) map[string][]byte {
				w := make([]byte, 4096)
				w[0] = byte(step)
				r := make([]byte, size)
				r[0], r[size-1] = byte(step), byte(rank)
				return map[string][]byte{"layer0.weight": w, "rng": r}
			}
			j := startJob(b, "arc", []string{"n1", "n2"}, map[string]string{}, "", shOpts{chunk: 4 << 20, bufs: bufs})
			for _, n := range j.nodes {
				if err := n.srv.SetBackground(config.Protect{BackgroundRate: config.Rate(tc.rate), BackgroundBurst: 8 << 20, BackgroundSchedule: config.SchedulePaused}); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(2 * size)
			b.ResetTimer()
			for i := range b.N {
				st := int64(i + 1)
				j.saveRange(st, st, true)
				for r, n := range j.nodes {
					h := j.nodes[1-r]
					for deadline := time.Now().Add(time.Minute); replicaStep(h, r) != st; time.Sleep(time.Millisecond) {
						if time.Now().After(deadline) {
							b.Fatalf("%s has no replica of %s's rank %d step %d", h.name, n.name, r, st)
						}
					}
				}
			}
			b.StopTimer()
			var sum float64
			var cnt int
			for _, n := range j.nodes {
				for _, e := range n.log.Events("replica_committed") {
					if d, ok := e["duration"].(float64); ok {
						sum, cnt = sum+d, cnt+1
					}
				}
			}
			if cnt > 0 {
				b.ReportMetric(sum/float64(cnt), "copy_ms")
			}
		})
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
