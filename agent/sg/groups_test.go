package sg

import (
	"slices"
	"strings"
	"testing"
)

func TestFormGroupsMegatron(t *testing.T) {
	// dp=4 pp=2 tp=1 on 8 nodes: SG (pp=0) = ranks 0-3, SG (pp=1) = 4-7.
	j := block(t, "arc", 4, 2, 1, 1, 0, nil)
	gs, ws, err := FormGroups(j.Layout, j.Topology)
	if err != nil || len(ws) != 0 {
		t.Fatal(err, ws)
	}
	if len(gs) != 2 || !slices.Equal(gs[0].Ranks(), []int{0, 1, 2, 3}) || !slices.Equal(gs[1].Ranks(), []int{4, 5, 6, 7}) {
		t.Fatalf("groups %+v", gs)
	}
	if gs[1].String() != "SG (pp=1,tp=0)" || gs[1].Position(6) != 2 || gs[1].Position(0) != -1 || gs[1].Holder(0) != 3 {
		t.Errorf("group helpers: %s %d %d %d", gs[1], gs[1].Position(6), gs[1].Position(0), gs[1].Holder(0))
	}
	// dp-tp-pp order, tp=2: the DP ranks of one (pp, tp) are consecutive.
	j = block(t, "arc", 2, 1, 2, 1, 0, nil)
	j.Layout.Order = Order{DP, TP, PP}
	gs, _, _ = FormGroups(j.Layout, j.Topology)
	if !slices.Equal(gs[0].Ranks(), []int{0, 1}) || !slices.Equal(gs[1].Ranks(), []int{2, 3}) {
		t.Errorf("dp-tp-pp groups %v %v", gs[0].Ranks(), gs[1].Ranks())
	}
}

// TestSharedNodeWarning: dp=4 with 2 ranks per node puts two members of the
// one SG on each node; the warning names them, and the ring keeps same-node
// members apart.
func TestSharedNodeWarning(t *testing.T) {
	j := block(t, "arc", 4, 1, 1, 2, 0, nil)
	gs, ws, err := FormGroups(j.Layout, j.Topology)
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 2 {
		t.Fatalf("warnings %v", ws)
	}
	w := ws[0]
	if w.Kind != WarnSharedNode || w.Node != "n1" || !slices.Equal(w.Ranks, []int{0, 1}) || w.Group != "(pp=0,tp=0)" ||
		!strings.HasPrefix(w.Msg, "SG (pp=0,tp=0): ranks 0 and 1 share node n1, so losing n1 loses 2 of the group's 4 members at once") {
		t.Errorf("warning %+v", w)
	}
	if !slices.Equal(gs[0].Ranks(), []int{0, 2, 1, 3}) {
		t.Errorf("ring %v, want members of n1 and n2 alternating", gs[0].Ranks())
	}
	// With the ring alternating nodes, arc survives one node (2 members,
	// never neighbours) although the guarantee counts 2 > 1.
	md := mustModel(t, j)
	if ok, _ := md.Survives([]string{"n1"}); !ok {
		t.Error("arc lost state with one node of two failed")
	}
	if md.Tolerance() != 0 {
		t.Errorf("guaranteed tolerance %d, want 0 (a node takes 2 members)", md.Tolerance())
	}
}

// TestDomainSpreading: racks A (n1,n2) and B (n3,n4) hold an SG of four.
// The ring alternates racks, so under arc a whole rack can fail; dp order
// would have put both rack-A members next to each other and lost a shard.
func TestDomainSpreading(t *testing.T) {
	racks := map[string]string{"n1": "A", "n2": "A", "n3": "B", "n4": "B"}
	j := block(t, "arc", 4, 1, 1, 1, Replicated, racks)
	md := mustModel(t, j)
	g := md.Groups[0]
	var doms []string
	for _, m := range g.Members {
		doms = append(doms, m.Domain)
	}
	if !slices.Equal(g.Ranks(), []int{0, 2, 1, 3}) || strings.Join(doms, "") != "ABAB" {
		t.Fatalf("ring %v domains %v", g.Ranks(), doms)
	}
	for _, rack := range [][]string{{"n1", "n2"}, {"n3", "n4"}} {
		p, _ := md.Plan(rack)
		if !p.Survives {
			t.Errorf("rack %v failed: %v", rack, p.Reasons)
		}
	}
	// The same job without domains keeps dp order and loses a shard.
	plain := mustModel(t, block(t, "arc", 4, 1, 1, 1, Replicated, nil))
	if ok, _ := plain.Survives([]string{"n1", "n2"}); ok {
		t.Error("dp-order ring survived two neighbours failing")
	}
	// GEMINI pairs also span both racks.
	j.Kinds = Sharded
	md = mustModel(t, j)
	for _, grp := range md.Placement.Groups {
		if racks[grp[0]] == racks[grp[1]] {
			t.Errorf("placement group %v inside one rack", grp)
		}
	}
	if ok, _ := md.Survives([]string{"n1", "n2"}); !ok {
		t.Error("sharded state lost with one rack")
	}
}

// TestUnbalancedDomains: a rack holding 3 of 4 members cannot avoid ring
// neighbours; the ring has the fewest possible (2a-m = 2).
func TestUnbalancedDomains(t *testing.T) {
	racks := map[string]string{"n1": "A", "n2": "A", "n3": "A", "n4": "B"}
	md := mustModel(t, block(t, "arc", 4, 1, 1, 1, Replicated, racks))
	if ranks := md.Groups[0].Ranks(); !slices.Equal(ranks, []int{0, 3, 1, 2}) {
		t.Errorf("ring %v", ranks)
	}
	if ok, _ := md.Survives([]string{"n1", "n2", "n3"}); ok {
		t.Error("rack A (3 of 4 members) failed and arc survived")
	}
}
