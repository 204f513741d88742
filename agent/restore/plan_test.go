package restore

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/reft-hpc/reft/agent/peer"
	"github.com/reft-hpc/reft/agent/sg"
	"github.com/reft-hpc/reft/agent/shard"
	"github.com/reft-hpc/reft/spank/spec"
	"github.com/reft-hpc/reft/tmpfs"
)

// The tests' job: one sharding group of dp=4, rank r on node n<r+1>,
// every rank saved steps; a lost rank's node is gone with its generations,
// and its replacement restores on a fresh node.

const m = 4

func node(r int) string { return fmt.Sprintf("n%d", r+1) }

// testGroup is rank's group under spc; aor registers two AOR state
// buffers (unreplicated, covered by AOR), placed one unreplicated buffer
// that background replication copies.
func testGroup(t *testing.T, spc string, rank int, placed bool) Group {
	t.Helper()
	sp, err := spec.Parse(spc)
	if err != nil {
		t.Fatal(err)
	}
	g := Group{Spec: sp, Layout: sg.Layout{DP: m, PP: 1, TP: 1}, World: m, Rank: rank, Members: []int{0, 1, 2, 3},
		ARC: sp.ARC, Parity: sp.AEC, Whole: !sp.ARC && !sp.AEC}
	if sp.AOR {
		g.AOR, g.Unreplicated = []string{"exp_avg", "exp_avg_sq"}, true
	}
	if placed {
		g.Unreplicated, g.Placed = true, []string{"rng"}
	}
	return g
}

// gen is one generation of a test view.
type gen struct {
	rank int
	step int64
	ring []int
}

// testView is what self's agent sees of gens: its own node's copies with
// Node "", the others' by node name.
func testView(self string, gens ...gen) *View {
	v := NewView(testTime)
	for _, g := range gens {
		n := node(g.rank)
		if n == self {
			n = ""
		}
		v.Add(n, peer.Watermark{Rank: g.rank, Shard: tmpfs.DefaultShard, Step: g.step, Seq: 1, Ring: g.ring})
	}
	v.SortLocalFirst()
	return v
}

// saved is every rank but lost's generation of step.
func saved(step int64, lost []int) []gen {
	var out []gen
	for r := range m {
		if !slices.Contains(lost, r) {
			out = append(out, gen{rank: r, step: step})
		}
	}
	return out
}

// upTo is every set of 1 to k of the m members.
func upTo(k int) [][]int {
	var out [][]int
	for set := 1; set < 1<<m; set++ {
		var s []int
		for r := range m {
			if set&(1<<r) != 0 {
				s = append(s, r)
			}
		}
		if len(s) <= k {
			out = append(out, s)
		}
	}
	return out
}

// wantSource is where a lost-or-not member q's shard comes from, on the
// dp-order ring: its own copy, its predecessor's ARC copy, a decode, or
// (aor without arc or aec) another member's whole copy.
func wantSource(g Group, q int, lost []int) sg.Source {
	switch {
	case !slices.Contains(lost, q):
		return sg.SourceLocal
	case g.ARC && !slices.Contains(lost, (q+m-1)%m):
		return sg.SourceARC
	case g.Parity:
		return sg.SourceAEC
	}
	return sg.SourcePeer
}

// baseAt is a ReadBase that finds every AOR replica valid for step and
// counts its calls.
func baseAt(step int64, calls *int) func([]Loc) (int64, error) {
	return func(locs []Loc) (int64, error) {
		*calls++
		if len(locs) == 0 {
			return 0, errors.New("no copy")
		}
		return step, nil
	}
}

// checkPlan checks that p brings every shard back from where the analysis
// says, from the copies that hold it, nearest first.
func checkPlan(t *testing.T, g Group, p Plan, lost []int) {
	t.Helper()
	if !p.OK || len(p.Reasons) > 0 || len(p.Lost) > 0 {
		t.Fatalf("rank %d: plan not OK: %q, lost %v", g.Rank, p.Reasons, p.Lost)
	}
	if !slices.Equal(p.Ring, g.Members) || len(p.Shards) != m {
		t.Fatalf("rank %d: ring %v, %d shards; want %v, %d", g.Rank, p.Ring, len(p.Shards), g.Members, m)
	}
	self := node(g.Rank)
	for q, sh := range p.Shards {
		want := wantSource(g, q, lost)
		if sh.Pos != q || sh.Rank != q || sh.Source != want {
			t.Fatalf("rank %d: shard %d is {pos %d rank %d from %s}, want from %s", g.Rank, q, sh.Pos, sh.Rank, sh.Source, want)
		}
		if want == sg.SourceAEC {
			if len(sh.Cands) != 0 || !slices.Contains(p.Decode, q) {
				t.Fatalf("rank %d: decoded shard %d has copies %v, decode %v", g.Rank, q, sh.Cands, p.Decode)
			}
			continue
		}
		if got, want := copiesOf(sh.Cands, self), wantCopies(g, q, lost); !slices.Equal(got, want) {
			t.Fatalf("rank %d: shard %d's copies %v, want %v (this node's first)", g.Rank, q, got, want)
		}
	}
	var decode []int
	for q := range m {
		if wantSource(g, q, lost) == sg.SourceAEC {
			decode = append(decode, q)
		}
		if g.Parity && len(p.Parity[q]) != len(slices.DeleteFunc([]int{q}, func(r int) bool { return slices.Contains(lost, r) })) {
			t.Fatalf("rank %d: parity units of position %d: %v", g.Rank, q, p.Parity[q])
		}
	}
	if !slices.Equal(p.Decode, decode) {
		t.Fatalf("rank %d: decodes %v, want %v", g.Rank, p.Decode, decode)
	}
}

// secCopy is a section on a node, as a test names it.
type secCopy struct{ node, sec string }

func copiesOf(cs []Cand, self string) []secCopy {
	var out []secCopy
	for _, c := range cs {
		n := c.Loc.Node
		if n == "" {
			n = self
		}
		out = append(out, secCopy{n, c.Sec})
	}
	return out
}

// wantCopies are the surviving copies of member q's shard, this node's
// first: its own section, its predecessor's ARC copy, and with whole
// buffers every other member's generation, in ring order after q.
func wantCopies(g Group, q int, lost []int) []secCopy {
	var out []secCopy
	add := func(r int, sec string) {
		if !slices.Contains(lost, r) {
			out = append(out, secCopy{node(r), sec})
		}
	}
	add(q, shard.Own)
	if g.ARC {
		add((q+m-1)%m, shard.ARC)
	}
	if g.Whole {
		for k := 1; k < m; k++ {
			add((q+k)%m, "")
		}
	}
	slices.SortStableFunc(out, func(a, b secCopy) int { return boolInt(a.node != node(g.Rank)) - boolInt(b.node != node(g.Rank)) })
	return out
}

// TestPlanEveryFailureSet: for each mode and combination, every set of lost
// members up to its tolerance (and arc's non-adjacent pairs, which it
// also survives) plans a restore of every rank, replacements and
// survivors, from the source agent/sg names (the planner's half of
// agent's TestShardedRestoreEveryFailureSet, without agents).
func TestPlanEveryFailureSet(t *testing.T) {
	cases := []struct {
		spec string
		sets [][]int
	}{
		{"arc", upTo(1)},
		{"arc", [][]int{{0, 2}, {1, 3}}},
		{"aec", upTo(1)},
		{"aec:2", upTo(2)},
		{"aec:3", upTo(3)},
		{"arc+aec", upTo(2)},
		{"arc+aec:2", upTo(3)},
	}
	for _, tc := range cases {
		for _, lost := range tc.sets {
			t.Run(fmt.Sprintf("%s/lost=%v", tc.spec, lost), func(t *testing.T) {
				for r := range m {
					g := testGroup(t, tc.spec, r, false)
					v := testView(node(r), saved(3, lost)...)
					calls := 0
					p := Planner{Node: node(r), ReadBase: baseAt(3, &calls)}.Plan(g, v, 3)
					checkPlan(t, g, p, lost)
					if calls != 0 {
						t.Fatalf("rank %d: read %d AOR bases without aor", r, calls)
					}
				}
			})
		}
	}
}

// TestPlanAOREveryNode: under aor, arc+aor and aec+aor, losing any one
// node plans every rank's restore, the lost rank's optimizer state from
// its ring predecessor's AOR replica (read once, to see that it is of the
// step), the others' from their own generations (the planner's half of
// agent's TestAORRestoreEveryNode).
func TestPlanAOREveryNode(t *testing.T) {
	for _, spc := range []string{"aor", "arc+aor", "aec+aor"} {
		for lost := range m {
			t.Run(fmt.Sprintf("%s/lost=%d", spc, lost), func(t *testing.T) {
				for r := range m {
					g := testGroup(t, spc, r, false)
					v := testView(node(r), saved(3, []int{lost})...)
					calls := 0
					p := Planner{Node: node(r), ReadBase: baseAt(3, &calls)}.Plan(g, v, 3)
					checkPlan(t, g, p, []int{lost})
					want, sec, holder := sg.SourceLocal, "", r
					if r == lost {
						want, sec, holder = sg.SourceAOR, shard.AOR, (r+m-1)%m
					}
					if p.OptSource != want || calls != boolInt(r == lost) {
						t.Fatalf("rank %d: optimizer state from %s after %d base reads, want %s after %d", r, p.OptSource, calls, want, boolInt(r == lost))
					}
					for _, n := range g.AOR {
						cs := p.Opt[n]
						if len(cs) != 1 || cs[0].Sec != sec+n || cs[0].Loc.Key.Rank != holder {
							t.Fatalf("rank %d: state buffer %s from %v, want %s on rank %d's node", r, n, cs, sec+n, holder)
						}
					}
					if g.Whole && (len(p.Whole) == 0 || slices.ContainsFunc(p.Whole, func(c Cand) bool { return c.Loc.Key.Rank == lost })) {
						t.Fatalf("rank %d: whole copies %v", r, p.Whole)
					}
					if wantOthers := boolInt(r != lost); len(p.Others) != wantOthers || p.OthersSource != sg.SourceLocal {
						t.Fatalf("rank %d: unreplicated buffers from %s %v", r, p.OthersSource, p.Others)
					}
				}
			})
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestPlanAORReplicaNotValid: a lost rank's optimizer state is lost when
// its predecessor's replica is of another step or cannot be read, and the
// plan says which, in its reasons and its lost shards.
func TestPlanAORReplicaNotValid(t *testing.T) {
	cases := []struct {
		name string
		read func([]Loc) (int64, error)
		want string
	}{
		{"older", func([]Loc) (int64, error) { return 2, nil }, "the AOR replica rank 0 keeps is not valid for that step"},
		{"invalid", func([]Loc) (int64, error) { return -1, nil }, "is not valid for that step"},
		{"unreadable", func([]Loc) (int64, error) { return 0, errors.New("connection refused") }, "cannot be read: connection refused"},
		{"no reader", nil, "cannot be read"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := testGroup(t, "arc+aor", 1, false)
			p := Planner{Node: node(1), ReadBase: tc.read}.Plan(g, testView(node(1), saved(3, []int{1})...), 3)
			if p.OK || len(p.Reasons) != 1 || !strings.Contains(p.Reasons[0], tc.want) {
				t.Fatalf("OK %v, reasons %q; want one with %q", p.OK, p.Reasons, tc.want)
			}
			if len(p.Lost) != 1 || p.Lost[0].Kind != sg.Optimizer.String() || p.Lost[0].Rank != 1 || p.Lost[0].Position != 1 || p.Lost[0].Reason != p.Reasons[0] {
				t.Fatalf("lost shards %+v, want rank 1's optimizer shard with the reason", p.Lost)
			}
		})
	}
}

// TestPlanBeyondTolerance: failures beyond a mode's tolerance give a plan
// that is not OK, whose reasons name the group and exactly the lost ranks,
// and whose lost shards list each shard memory lost with its reason.
func TestPlanBeyondTolerance(t *testing.T) {
	cases := []struct {
		spec        string
		lost        []int
		reason      string
		lostRanks   []int
		shardReason string
	}{
		{"arc", []int{1, 2}, "SG (pp=0,tp=0) lost ranks 1 and 2", []int{2}, "its ARC copy on rank 1"},
		{"aec", []int{1, 2}, "SG (pp=0,tp=0) lost ranks 1 and 2", []int{1, 2}, "AEC stripe"},
		{"aec", []int{0, 1, 2}, "SG (pp=0,tp=0) lost ranks 0, 1 and 2", []int{0, 1, 2}, "AEC stripe"},
		{"aec:2", []int{0, 1, 3}, "SG (pp=0,tp=0) lost ranks 0, 1 and 3", []int{0, 1, 3}, "AEC stripe"},
		{"arc+aec", []int{0, 1, 2}, "SG (pp=0,tp=0) lost ranks 0, 1 and 2", nil, ""},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%s/lost=%v", tc.spec, tc.lost), func(t *testing.T) {
			g := testGroup(t, tc.spec, 3, false)
			p := Planner{Node: node(3)}.Plan(g, testView(node(3), saved(3, tc.lost)...), 3)
			if p.OK || !strings.Contains(strings.Join(p.Reasons, "; "), tc.reason) {
				t.Fatalf("OK %v, reasons %q; want one with %q", p.OK, p.Reasons, tc.reason)
			}
			if len(p.Lost) == 0 {
				t.Fatal("no lost shards")
			}
			var ranks []int
			for _, l := range p.Lost {
				if l.Kind != sg.Replicated.String() || l.Group != g.Name() || !strings.Contains(l.Reason, tc.shardReason) {
					t.Fatalf("lost shard %+v, want a replicated shard of %s with %q", l, g.Name(), tc.shardReason)
				}
				ranks = append(ranks, l.Rank)
			}
			if tc.lostRanks != nil && !slices.Equal(ranks, tc.lostRanks) {
				t.Fatalf("lost shards of ranks %v, want %v", ranks, tc.lostRanks)
			}
		})
	}
}

// TestPlanPlacedReplicas: a lost rank's unreplicated buffers come from a
// placement peer's replica of the very step; without one the plan says
// why (none, older, others).
func TestPlanPlacedReplicas(t *testing.T) {
	cases := []struct {
		name     string
		replicas []int64 // steps of rank 1's replica on n3
		want     string
	}{
		{"replica", []int64{2, 3}, ""},
		{"none", nil, "no placement peer holds a replica of them"},
		{"lagging", []int64{2}, "the newest replica on its placement peers is of step 2, older than step 3"},
		{"newer", []int64{4}, "its placement peers hold replicas of steps [4], not of step 3"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := testGroup(t, "arc", 1, true)
			v := testView(node(1), saved(3, []int{1})...)
			for _, st := range tc.replicas {
				v.Add(node(2), peer.Watermark{Rank: 1, Shard: shard.Replica, Step: st, Seq: 1})
			}
			p := Planner{Node: node(1)}.Plan(g, v, 3)
			if p.OthersSource != sg.SourcePeer {
				t.Fatalf("unreplicated buffers from %s, want peer", p.OthersSource)
			}
			if tc.want == "" {
				if !p.OK || len(p.Others) != 1 || p.Others[0].Loc.Node != node(2) || p.Others[0].Loc.Key.Step != 3 {
					t.Fatalf("OK %v (%q), others %v: want step 3's replica on %s", p.OK, p.Reasons, p.Others, node(2))
				}
				return
			}
			if p.OK || len(p.Reasons) != 1 || !strings.Contains(p.Reasons[0], tc.want) || !strings.Contains(p.Reasons[0], "unreplicated buffers (rng)") {
				t.Fatalf("OK %v, reasons %q; want one with %q", p.OK, p.Reasons, tc.want)
			}
			if len(p.Lost) != 1 || p.Lost[0].Kind != "unreplicated" || p.Lost[0].Position != -1 {
				t.Fatalf("lost shards %+v", p.Lost)
			}
		})
	}
}

// TestPlanRecordedRing: a step is planned on the ring its generations
// recorded, so a lost member's ARC copy is read from its predecessor on
// that ring; members that disagree make the step unusable.
func TestPlanRecordedRing(t *testing.T) {
	ring := []int{0, 2, 1, 3}
	var gens []gen
	for _, r := range []int{0, 2, 3} { // rank 1 lost: position 2, after rank 2
		gens = append(gens, gen{rank: r, step: 3, ring: ring})
	}
	g := testGroup(t, "arc", 3, false)
	p := Planner{Node: node(3)}.Plan(g, testView(node(3), gens...), 3)
	if !p.OK || !slices.Equal(p.Ring, ring) {
		t.Fatalf("OK %v (%q), ring %v; want OK on %v", p.OK, p.Reasons, p.Ring, ring)
	}
	sh := p.Shards[2]
	if sh.Rank != 1 || sh.Source != sg.SourceARC || sh.Cands[0].Loc.Node != node(2) || sh.Cands[0].Sec != shard.ARC {
		t.Fatalf("rank 1's shard: %+v, want its ARC copy on rank 2's node", sh)
	}
	gens[1].ring = []int{0, 1, 2, 3}
	p = Planner{Node: node(3)}.Plan(g, testView(node(3), gens...), 3)
	if p.OK || p.Ring != nil || len(p.Reasons) != 1 || !strings.Contains(p.Reasons[0], "saved step 3 on different rings") {
		t.Fatalf("OK %v, ring %v, reasons %q; want a plan refused for disagreeing rings", p.OK, p.Ring, p.Reasons)
	}
}

// TestStepRing: a step's ring is the one its generations recorded, dp
// order for generations from before rings, and an error naming both when
// members disagree.
func TestStepRing(t *testing.T) {
	g := Group{Layout: sg.Layout{DP: 3, PP: 1, TP: 1}, World: 3, Rank: 1, Members: []int{0, 1, 2}}
	mk := func(rings ...[]int) *View {
		v := NewView(testTime)
		for r, rg := range rings {
			v.Gens[r] = map[int64][]Loc{5: {{Node: fmt.Sprint("n", r), Ring: rg}}}
		}
		return v
	}
	cases := []struct {
		name string
		v    *View
		want []int
		err  string
	}{
		{"recorded", mk([]int{0, 2, 1}, []int{0, 2, 1}, []int{0, 2, 1}), []int{0, 2, 1}, ""},
		{"legacy", mk(nil, nil, nil), []int{0, 1, 2}, ""},
		{"one member lost", mk([]int{2, 1, 0}, nil, []int{2, 1, 0}), []int{2, 1, 0}, ""},
		{"disagree", mk([]int{0, 2, 1}, []int{0, 1, 2}, nil), nil, "rank 0 on [0 2 1], rank 1 on [0 1 2]"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := StepRing(g, tc.v, 5)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one with %q", err, tc.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// TestFirstRestorable: the newest step that plans OK is chosen; when none
// does, the blame goes to the step the fewest members lack, not to a newer
// step only some survivors reached.
func TestFirstRestorable(t *testing.T) {
	g := testGroup(t, "arc", 0, false)
	pl := Planner{Node: node(0)}
	// Step 4 only rank 0 reached; step 3 all but rank 3.
	v := testView(node(0), append(saved(3, []int{3}), gen{rank: 0, step: 4})...)
	steps := v.Steps([]int{0, 1, 2, 3})
	if !slices.Equal(steps, []int64{4, 3}) {
		t.Fatalf("steps %v, want [4 3]", steps)
	}
	chosen, blame := pl.FirstRestorable(g, v, steps)
	if chosen == nil || chosen.Step != 3 || blame.Step != 3 {
		t.Fatalf("chose %+v, blamed step %d; want step 3 for both", chosen, blame.Step)
	}
	// Step 3: ranks 2 and 3 lost, adjacent on the ring: beyond arc.
	v = testView(node(0), append(saved(3, []int{2, 3}), gen{rank: 0, step: 4})...)
	chosen, blame = pl.FirstRestorable(g, v, steps)
	if chosen != nil || blame == nil || blame.Step != 3 || !strings.Contains(strings.Join(blame.Reasons, "; "), "lost ranks 2 and 3") {
		t.Fatalf("chose %v, blamed %+v; want none, step 3 blamed for ranks 2 and 3", chosen, blame)
	}
	// Both steps lack ranks 2 and 3: the newest is blamed.
	v = testView(node(0), append(saved(3, []int{2, 3}), saved(4, []int{2, 3})...)...)
	if chosen, blame = pl.FirstRestorable(g, v, steps); chosen != nil || blame == nil || blame.Step != 4 {
		t.Fatalf("chose %v, blamed %+v; want none, step 4 blamed", chosen, blame)
	}
}
