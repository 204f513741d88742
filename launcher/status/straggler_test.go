package status

import (
	"bytes"
	"strings"
	"testing"

	"github.com/reft-hpc/reft/agent/proto"
)

// node is a node's report whose ranks did computeS of their own work per
// step (0: not measured: no progress, or no communication phases).
func node(name string, ranks map[int]float64) NodeReport {
	st := &proto.Status{Node: name}
	for r, c := range ranks {
		rs := proto.RankStatus{Rank: r}
		if c >= 0 {
			rs.Progress = &proto.RankProgress{Step: 9, ComputeS: c}
		}
		st.Ranks = append(st.Ranks, rs)
	}
	return NodeReport{Node: name, Agent: AgentUp, Status: st}
}

func TestFindStragglers(t *testing.T) {
	for _, tc := range []struct {
		name  string
		nodes []NodeReport
		want  []int // straggler ranks, slowest first
	}{
		{"none", []NodeReport{node("n1", map[int]float64{0: .1}), node("n2", map[int]float64{1: .11}), node("n3", map[int]float64{2: .1}), node("n4", map[int]float64{3: .12})}, nil},
		{"one slow rank", []NodeReport{node("n1", map[int]float64{0: .1}), node("n2", map[int]float64{1: .1}), node("n3", map[int]float64{2: .2}), node("n4", map[int]float64{3: .1})}, []int{2}},
		{"two, slowest first", []NodeReport{node("n1", map[int]float64{0: .1, 1: .3}), node("n2", map[int]float64{2: .1, 3: .1}), node("n3", map[int]float64{4: .2, 5: .1})}, []int{1, 4}},
		{"below the ratio", []NodeReport{node("n1", map[int]float64{0: .1}), node("n2", map[int]float64{1: .1}), node("n3", map[int]float64{2: .14})}, nil},
		{"fast steps: jitter under the margin", []NodeReport{node("n1", map[int]float64{0: .002}), node("n2", map[int]float64{1: .002}), node("n3", map[int]float64{2: .009})}, nil},
		{"two ranks say nothing", []NodeReport{node("n1", map[int]float64{0: .1}), node("n2", map[int]float64{1: .5})}, nil},
		{"unmeasured ranks and a down agent are left out", []NodeReport{node("n1", map[int]float64{0: .1, 1: -1}), {Node: "n2", Agent: AgentDown},
			node("n3", map[int]float64{2: .1}), node("n4", map[int]float64{3: .4, 4: 0})}, []int{3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := FindStragglers(tc.nodes)
			var ranks []int
			for _, s := range got {
				ranks = append(ranks, s.Rank)
				if s.Ratio < StragglerRatio || s.ComputeS <= s.MedianS {
					t.Errorf("straggler %+v below the thresholds", s)
				}
			}
			if len(ranks) != len(tc.want) || (len(ranks) > 0 && !equalInts(ranks, tc.want)) {
				t.Errorf("stragglers %+v, want ranks %v", got, tc.want)
			}
		})
	}
}

func equalInts(a, b []int) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return len(a) == len(b)
}

// TestPrintStragglers: the table's notes name a straggler, its node, its
// work per step and the job's median, and say reft does not act on it.
func TestPrintStragglers(t *testing.T) {
	rep := &Report{Job: "42", State: "RUNNING", User: "alice", Spec: "arc",
		Nodes: []NodeReport{node("n1", map[int]float64{0: .1}), node("n2", map[int]float64{1: .1}), node("n3", map[int]float64{2: .25}), node("n4", map[int]float64{3: .1})}}
	rep.Stragglers = FindStragglers(rep.Nodes)
	var b bytes.Buffer
	Print(&b, rep)
	want := "straggler: rank 2 on n3 works 250ms per step outside its collectives, 2.5x the job's median 100ms"
	if !strings.Contains(b.String(), want) || !strings.Contains(b.String(), "not acted on") {
		t.Errorf("Print lacks %q:\n%s", want, b.String())
	}
}
