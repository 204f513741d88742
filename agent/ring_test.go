package agent

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/agent/sg"
	"github.com/reft-hpc/reft/agent/shard"
	"github.com/reft-hpc/reft/tmpfs"
)

// Multi-agent tests of sharding-group rings (ring.go): the ring spread
// across failure domains, recorded with every generation, kept across a
// relaunch that changes the rank-to-node map, agreed by every member, the
// shared-node warning, and watermarks views of O(group).

// savedRings returns the ring recorded in each rank's newest generation.
func savedRings(t *testing.T, j *shJobRun) [][]int {
	t.Helper()
	out := make([][]int, len(j.nodes))
	for r, n := range j.nodes {
		gens := n.st.Generations(tmpfs.Key{Rank: r, Shard: tmpfs.DefaultShard})
		if len(gens) == 0 {
			t.Fatalf("rank %d has no generation on %s", r, n.name)
		}
		out[r] = gens[0].Manifest.Ring
	}
	return out
}

// wantRing is the ring sg.FormGroups gives group (pp, tp) for the job's
// rank-to-node map and domains: what `reft explain` prints.
func wantRing(t *testing.T, l sg.Layout, names []string, topo config.Topology, pp, tp int) []int {
	t.Helper()
	dom, err := topo.DomainsOf(names)
	if err != nil {
		t.Fatal(err)
	}
	groups, _, err := sg.FormGroups(l, sg.Topology{RankNode: names, Domain: dom})
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range groups {
		if g.PP == pp && g.TP == tp {
			return g.Ranks()
		}
	}
	t.Fatalf("no group (pp=%d,tp=%d)", pp, tp)
	return nil
}

func allEvents(j *shJobRun, ev string) []map[string]any {
	var out []map[string]any
	seen := map[*shNode]bool{}
	for _, n := range j.nodes {
		if !seen[n] {
			seen[n] = true
			out = append(out, n.log.Events(ev)...)
		}
	}
	return out
}

func ints(v any) []int {
	var out []int
	for _, x := range v.([]any) {
		out = append(out, int(x.(float64)))
	}
	return out
}

// TestRingSpreadAcrossDomains: with racks labelled, the ring every agent
// saves with is the one sg.FormGroups computes (not dp order where the
// racks say otherwise), and losing nodes whose members the ring spread
// apart (a whole rack under arc, where dp order would put two ring
// neighbours in it) restores bit for bit from peers.
func TestRingSpreadAcrossDomains(t *testing.T) {
	racks := config.Topology{Domains: map[string]string{"rackA": "n[1-2]", "rackB": "n[3-4]"}}
	names := []string{"n1", "n2", "n3", "n4"}
	cases := []struct {
		name   string
		spec   string
		topo   config.Topology
		lost   []int
		dpRing bool // the ring must be dp order
	}{
		{"arc, no domains: dp order", "arc", config.Topology{}, []int{1}, true},
		{"arc, racks: rack A lost", "arc", racks, []int{0, 1}, false},
		{"arc, racks: rack B lost", "arc", racks, []int{2, 3}, false},
		{"aec, racks: one node lost", "aec", racks, []int{2}, false},
		{"arc+aec, racks: rack A lost", "arc+aec", racks, []int{0, 1}, false},
		{"arc, rack pattern: rack B lost", "arc", config.Topology{DomainPattern: "^n[12]$", Domains: map[string]string{"b": "n[3-4]"}}, []int{2, 3}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			roots := map[string]string{}
			j := startJob(t, tc.spec, names, roots, "", shOpts{topo: tc.topo})
			j.saveSteps(3, false)
			want := wantRing(t, sg.Layout{DP: 4, PP: 1, TP: 1}, names, tc.topo, 0, 0)
			if dp := []int{0, 1, 2, 3}; slices.Equal(want, dp) != tc.dpRing {
				t.Fatalf("sg.FormGroups gives ring %v; the case expects dp order: %v", want, tc.dpRing)
			}
			for r, ring := range savedRings(t, j) {
				if !slices.Equal(ring, want) {
					t.Fatalf("rank %d saved step 3 on ring %v, want %v (sg.FormGroups); fallbacks %v", r, ring, want, allEvents(j, "sg_ring_fallback"))
				}
			}
			evs := allEvents(j, "sg_ring")
			if len(evs) != 4 {
				t.Fatalf("%d sg_ring events, want one per agent", len(evs))
			}
			t.Logf("ring %v (%s)", want, evs[0]["how"])
			j = j.relaunch(roots, tc.lost)
			step, errs, bufs := j.restoreAll(false)
			if step != 3 {
				t.Fatalf("agreed on step %d after losing ranks %v, want 3 (errors %v)", step, tc.lost, errs)
			}
			checkRestored(t, step, errs, bufs, false)
			for _, r := range tc.lost {
				if len(j.nodes[r].log.Events("restore_persistent")) > 0 {
					t.Errorf("replacement of rank %d restored from the persistent tier", r)
				}
			}
		})
	}
}

// TestRingKeptAcrossRelaunch: after a relaunch that moves a lost rank to
// a spare in another rack, the map would give another ring; the restore
// reads the generation with the ring it was saved with, every agent
// fixes that ring, and the next saves keep it.
func TestRingKeptAcrossRelaunch(t *testing.T) {
	topo := config.Topology{Domains: map[string]string{"rackA": "n[1-2]", "rackB": "n[3-4],s1"}}
	for _, spc := range []string{"arc", "aec"} {
		t.Run(spc, func(t *testing.T) {
			roots := map[string]string{}
			names := []string{"n1", "n2", "n3", "n4"}
			j := startJob(t, spc, names, roots, "", shOpts{topo: topo})
			j.saveSteps(3, false)
			saved := savedRings(t, j)[0]
			moved := []string{"s1", "n2", "n3", "n4"}
			now := wantRing(t, sg.Layout{DP: 4, PP: 1, TP: 1}, moved, topo, 0, 0)
			if slices.Equal(now, saved) {
				t.Fatalf("the changed map gives the saved ring %v: the test proves nothing", saved)
			}
			j = j.relaunch(roots, []int{0})
			step, errs, bufs := j.restoreAll(false)
			if step != 3 {
				t.Fatalf("agreed on step %d, want 3 (errors %v)", step, errs)
			}
			checkRestored(t, step, errs, bufs, false)
			for _, ev := range allEvents(j, "sg_ring") {
				if got := ints(ev["ring"]); !slices.Equal(got, saved) {
					t.Fatalf("an agent fixed ring %v after the restore, want the saved %v", got, saved)
				}
			}
			j.saveSteps(5, false)
			for r, ring := range savedRings(t, j) {
				if !slices.Equal(ring, saved) {
					t.Fatalf("rank %d saved after the restore on ring %v, want the restored %v (the map alone gives %v)", r, ring, saved, now)
				}
			}
			j = j.relaunch(roots, []int{2})
			step, errs, bufs = j.restoreAll(false)
			if step != 5 {
				t.Fatalf("second restore agreed on step %d, want 5 (errors %v)", step, errs)
			}
			checkRestored(t, step, errs, bufs, false)
		})
	}
}

// TestRingAgreement: the races of the ring decision. Members whose ranks
// register late (within the wait, or after it, when the early ones fell
// back to dp order) and an agent whose reft.toml labels differ all end up
// saving on one ring, and the job restores.
func TestRingAgreement(t *testing.T) {
	racks := config.Topology{Domains: map[string]string{"rackA": "n[1-2]", "rackB": "n[3-4]"}}
	spread := []int{0, 2, 1, 3}
	cases := []struct {
		name     string
		wait     time.Duration
		late     time.Duration // rank 3 opens and saves this much later
		want     []int
		fallback bool // the early agents logged sg_ring_fallback naming rank 3
	}{
		{"all at once", 5 * time.Second, 0, spread, false},
		{"late within the wait", 5 * time.Second, 700 * time.Millisecond, spread, false},
		{"late after the wait", 300 * time.Millisecond, 1500 * time.Millisecond, []int{0, 1, 2, 3}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			roots := map[string]string{}
			j := startJob(t, "arc", []string{"n1", "n2", "n3", "n4"}, roots, "", shOpts{topo: racks, ringWait: tc.wait})
			var wg sync.WaitGroup
			for r := range j.nodes {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if r == 3 {
						time.Sleep(tc.late)
					}
					bufs := shBuffers(1, r, false)
					c := j.open(r, bufs)
					defer c.Close()
					if err := c.Save(1).Wait(context.Background()); err != nil {
						t.Errorf("rank %d: %v", r, err)
					}
				}()
			}
			wg.Wait()
			for r, ring := range savedRings(t, j) {
				if !slices.Equal(ring, tc.want) {
					t.Fatalf("rank %d saved on ring %v, want %v", r, ring, tc.want)
				}
			}
			fb := allEvents(j, "sg_ring_fallback")
			if tc.fallback != (len(fb) > 0) {
				t.Fatalf("sg_ring_fallback events %v, want some: %v", fb, tc.fallback)
			}
			for _, ev := range fb {
				if r, _ := ev["reason"].(string); !strings.Contains(r, "ranks 3 are not registered") {
					t.Errorf("fallback reason %q does not name rank 3", r)
				}
			}
			if tc.fallback {
				how, _ := j.nodes[3].log.Events("sg_ring")[0]["how"].(string)
				if !strings.Contains(how, "adopted") {
					t.Errorf("the late agent fixed its ring by %q, want adopted from a member's agent", how)
				}
			}
			j = j.relaunch(roots, []int{1})
			step, errs, bufs := j.restoreAll(false)
			if step != 1 {
				t.Fatalf("agreed on step %d, want 1 (errors %v)", step, errs)
			}
			checkRestored(t, step, errs, bufs, false)
		})
	}
}

// TestRingSharedNodeWarning: two members of the SG on one node are named
// once per job, by that node's agent, with the exact ranks and node, in
// the log and the status reply; the ring puts them apart, so arc survives
// losing that node.
func TestRingSharedNodeWarning(t *testing.T) {
	roots := map[string]string{}
	names := []string{"n1", "n2", "n1", "n3"} // ranks 0 and 2 share n1
	j := startJob(t, "arc", names, roots, "")
	j.saveSteps(2, false)
	evs := allEvents(j, "sg_shared_node")
	if len(evs) != 1 {
		t.Fatalf("%d sg_shared_node events, want exactly one for the job: %v", len(evs), evs)
	}
	ev := evs[0]
	if ev["node"] != "n1" || ev["shared_node"] != "n1" || !slices.Equal(ints(ev["ranks"]), []int{0, 2}) || ev["level"] != "warn" {
		t.Fatalf("warning %v: want level warn, node n1 and ranks [0 2]", ev)
	}
	if msg, _ := ev["message"].(string); !strings.Contains(msg, "ranks 0 and 2 share node n1") {
		t.Errorf("message %q does not name the ranks and the node", msg)
	}
	st := j.nodes[0].srv.Status()
	if len(st.PlacementWarnings) != 1 || !strings.Contains(st.PlacementWarnings[0], "ranks 0 and 2 share node n1") {
		t.Errorf("status placement_warnings %v", st.PlacementWarnings)
	}
	b, _ := json.Marshal(j.nodes[1].srv.Status())
	if strings.Contains(string(b), "placement_warnings") {
		t.Errorf("n2's status names a warning about n1: %s", b)
	}
	ring := savedRings(t, j)[0]
	if want := wantRing(t, sg.Layout{DP: 4, PP: 1, TP: 1}, names, config.Topology{}, 0, 0); !slices.Equal(ring, want) {
		t.Fatalf("ring %v, want %v", ring, want)
	}
	if i, k := slices.Index(ring, 0), slices.Index(ring, 2); (i-k+4)%4 == 1 || (k-i+4)%4 == 1 {
		t.Fatalf("ring %v keeps ranks 0 and 2 (on one node) as neighbours", ring)
	}
	j = j.relaunch(roots, []int{0, 2}) // n1 lost: both its ranks
	step, errs, bufs := j.restoreAll(false)
	if step != 2 {
		t.Fatalf("agreed on step %d after losing n1, want 2 (errors %v)", step, errs)
	}
	checkRestored(t, step, errs, bufs, false)
}

// TestRingWatermarksOGroup: with dp=2, pp=2 (two SGs on four nodes), a
// rank's watermarks view asks only the node of its SG's other member,
// for its group's ranks only; restores still come back whole.
func TestRingWatermarksOGroup(t *testing.T) {
	l := sg.Layout{DP: 2, PP: 2, TP: 1}
	names := []string{"n1", "n2", "n3", "n4"}
	roots := map[string]string{}
	j := startJob(t, "arc", names, roots, "", shOpts{layout: "dp=2,pp=2"})
	j.saveSteps(3, false)
	check := func(j *shJobRun) {
		for r, n := range j.nodes {
			si, err := shard.NewGeometry(n.srv.spec(), proto.Register{Rank: r, World: 4, Layout: "dp=2,pp=2",
				Buffers: []proto.BufferSpec{{Name: "x", Size: 100, Replicated: true}}})
			if err != nil {
				t.Fatal(err)
			}
			n.srv.views.invalidate()
			v := n.srv.views.view(context.Background(), si)
			c := l.Coord(r)
			var want []string
			for dp := range 2 {
				if m := l.Rank(sg.Coord{DP: dp, PP: c.PP}); m != r {
					want = append(want, j.nodes[m].name)
				}
			}
			if !slices.Equal(v.Asked, want) {
				t.Errorf("rank %d's view asked nodes %v, want only its SG's %v", r, v.Asked, want)
			}
			for node, k := range v.ReplyRanks {
				if k > 2 {
					t.Errorf("rank %d's view: %s's reply carried %d ranks, more than the group's 2", r, node, k)
				}
			}
			for rk := range v.Gens {
				if l.Coord(rk).PP != c.PP {
					t.Errorf("rank %d's view holds rank %d of another group", r, rk)
				}
			}
			t.Logf("rank %d: asked %v, ranks per reply %v", r, v.Asked, v.ReplyRanks)
		}
	}
	check(j)
	j = j.relaunch(roots, []int{3})
	step, errs, bufs := j.restoreAll(false)
	if step != 3 {
		t.Fatalf("agreed on step %d, want 3 (errors %v)", step, errs)
	}
	checkRestored(t, step, errs, bufs, false)
	check(j)
}
