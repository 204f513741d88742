package sg

import (
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"testing"
)

// modes lists every replicated-state protection of the grammar with its
// guaranteed tolerance.
var modes = []struct {
	spec string
	tol  int
}{
	{"off", 0}, {"aor", -1}, {"arc", 1}, {"aec", 1}, {"aec:2", 2}, {"aec:3", 3},
	{"arc+aec", 2}, {"arc+aec:2", 3}, {"arc+aec:3", 4}, {"arc+aor", 1}, {"arc+aec+aor", 2},
}

// TestPlanMatchesBytes holds the analysis against real bytes: for every
// group size up to 8, every mode and every set of failed members, a shard
// is planned from memory exactly when the survivors' stored bytes
// (own shards, ARC copies, Reed-Solomon parity) rebuild it. Every set of up
// to the tolerance survives, and T+1 consecutive members never do.
func TestPlanMatchesBytes(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for m := 2; m <= 8; m++ {
		for _, mode := range modes {
			if mode.tol >= m {
				continue
			}
			mode := mode
			if mode.tol < 0 { // aor alone: every member keeps the whole slice
				mode.tol = m - 1
			}
			t.Run(fmt.Sprintf("%s/m=%d", mode.spec, m), func(t *testing.T) {
				md := mustModel(t, block(t, mode.spec, m, 1, 1, 1, Replicated, nil))
				if got := md.Protection[0].Tolerance; got != mode.tol {
					t.Fatalf("tolerance %d, want %d", got, mode.tol)
				}
				if got := md.Tolerance(); got != mode.tol {
					t.Fatalf("node tolerance %d, want %d", got, mode.tol)
				}
				st := newStorage(t, m, md.code.arc, md.code.ec, int64(997+m), rng)
				st.whole = md.code.whole
				subsets(m, func(failed []bool, size int) {
					plan, err := md.Plan(names(failed))
					if err != nil {
						t.Fatal(err)
					}
					fast, _ := md.Survives(names(failed))
					if fast != plan.Survives {
						t.Fatalf("failed %v: Survives %v, Plan.Survives %v", names(failed), fast, plan.Survives)
					}
					if reasons, _ := md.Reasons(names(failed)); !slices.Equal(reasons, plan.Reasons) {
						t.Fatalf("failed %v: Reasons %q, Plan.Reasons %q", names(failed), reasons, plan.Reasons)
					}
					back := st.rebuild(t, failed)
					for _, s := range plan.Shards {
						if inMem := s.Source != SourcePersistent; inMem != back[s.Position] {
							t.Fatalf("failed %v: shard %d planned from %s, bytes rebuilt: %v", names(failed), s.Position, s.Source, back[s.Position])
						}
						if failed[s.Position] == (s.Source == SourceLocal) {
							t.Fatalf("failed %v: shard %d source %s", names(failed), s.Position, s.Source)
						}
					}
					if size <= mode.tol && !plan.Survives {
						t.Fatalf("failed %v (%d <= tolerance %d) not survived: %v", names(failed), size, mode.tol, plan.Reasons)
					}
				})
				// T+1 consecutive ring positions: always fatal.
				if mode.tol+1 <= m {
					f := make([]bool, m)
					for i := 0; i <= mode.tol; i++ {
						f[i] = true
					}
					if ok, _ := md.Survives(names(f)); ok {
						t.Fatalf("%d consecutive failures survived; the tolerance is %d", mode.tol+1, mode.tol)
					}
				}
			})
		}
	}
}

// TestAECOnlyTight: without arc, parity alone survives no set of K+1 failed
// members, whichever they are.
func TestAECOnlyTight(t *testing.T) {
	for m := 2; m <= 7; m++ {
		for k := 1; k < m-1; k++ {
			md := mustModel(t, block(t, fmt.Sprintf("aec:%d", k), m, 1, 1, 1, Replicated, nil))
			subsets(m, func(f []bool, size int) {
				if ok, _ := md.Survives(names(f)); size == k+1 && ok {
					t.Fatalf("m=%d aec:%d survived %v", m, k, names(f))
				}
			})
		}
	}
}

// TestARCNonAdjacent: arc alone survives two failures of a group of four
// exactly when they are not ring neighbours.
func TestARCNonAdjacent(t *testing.T) {
	md := mustModel(t, block(t, "arc", 4, 1, 1, 1, Replicated, nil))
	for _, c := range []struct {
		failed []string
		ok     bool
	}{
		{[]string{"n1", "n3"}, true}, {[]string{"n2", "n4"}, true},
		{[]string{"n1", "n2"}, false}, {[]string{"n4", "n1"}, false},
	} {
		p, err := md.Plan(c.failed)
		if err != nil || p.Survives != c.ok {
			t.Errorf("arc dp=4 failed %v: survives %v (%v), want %v", c.failed, p.Survives, err, c.ok)
		}
	}
}

func TestReasonText(t *testing.T) {
	md := mustModel(t, block(t, "arc", 4, 1, 1, 1, Replicated|Sharded, nil))
	p, err := md.Plan([]string{"n3", "n2"})
	if err != nil {
		t.Fatal(err)
	}
	if p.Survives || !slices.Equal(p.Failed, []string{"n2", "n3"}) {
		t.Fatalf("plan %+v", p)
	}
	want := "SG (pp=0,tp=0) lost ranks 1 and 2 on nodes n2,n3; arc tolerates 1 failure per group: rank 2's shard was on n3 and its ARC copy on rank 1 (n2)"
	if len(p.Reasons) == 0 || p.Reasons[0] != want {
		t.Fatalf("reasons %q\nwant first %q", p.Reasons, want)
	}
	// Sharded state has GEMINI pairs (n1,n2),(n3,n4): n2 and n3 each keep a copy alive.
	if len(p.Reasons) != 1 {
		t.Errorf("sharded state should survive: %q", p.Reasons)
	}
	var srcs []string
	for _, s := range p.Shards {
		srcs = append(srcs, fmt.Sprintf("%s/%d:%s%v", s.Kind, s.Rank, s.Source, s.From))
	}
	got := strings.Join(srcs, " ")
	for _, w := range []string{"replicated/1:arc[n1]", "replicated/2:persistent[]", "sharded/1:peer[n1]", "sharded/2:peer[n4]", "sharded/0:local[]"} {
		if !strings.Contains(got, w) {
			t.Errorf("sources %s: missing %s", got, w)
		}
	}
}

func TestPlanKinds(t *testing.T) {
	tests := []struct {
		spec    string
		kinds   Kind
		failed  []string
		ok      bool
		reason  string // substring of the first reason
		sources []string
	}{
		// aor: optimizer shards of rank 1 survive on rank 0.
		{"aor", Optimizer, []string{"n2"}, true, "", []string{"optimizer/1:aor[n1]"}},
		{"aor", Optimizer, []string{"n1", "n2"}, false, "aor keeps 1 replica of each ZeRO-1 optimizer shard", nil},
		// aor alone keeps replicated state whole on every member (the
		// agent does not shard the slice without arc or aec): any survivor
		// has it. It does not cover sharded state.
		{"aor", Replicated, []string{"n2"}, true, "", []string{"replicated/1:peer[n3 n4 n1]"}},
		{"aor", Replicated, []string{"n1", "n2", "n3"}, true, "", []string{"replicated/0:peer[n4]"}},
		{"aor", Replicated, []string{"n1", "n2", "n3", "n4"}, false, "every other member of its group, each with a whole copy, failed too", nil},
		{"aor", Sharded, []string{"n2"}, false, "makes no peer copies of it", nil},
		{"off", Sharded, []string{"n2"}, false, "--reft=off keeps no copies", nil},
		{"off", Replicated, []string{"n4"}, false, "--reft=off keeps no redundancy", nil},
		// without aor, optimizer state travels with the sharded state.
		{"arc", Optimizer, []string{"n2"}, true, "", []string{"optimizer/1:peer[n1]"}},
		{"arc", Optimizer, []string{"n1", "n2"}, false, "including ZeRO-1 optimizer shards", nil},
		// arc+aec: 2 peer copies in GEMINI groups: 4 nodes, 3 replicas: mixed ring of 4.
		{"arc+aec", Sharded, []string{"n1", "n2"}, true, "", []string{"sharded/0:peer[n3]", "sharded/1:peer[n3 n4]"}},
		{"arc+aec", Sharded, []string{"n1", "n2", "n3"}, false, "node n1 (rank 0): per-rank state lost with all 2 peer copies (n2,n3); arc+aec keeps 2 peer copies per node (GEMINI ring n1,n2,n3,n4)", nil},
		{"arc+aec", Replicated, []string{"n1", "n2"}, true, "", []string{"replicated/1:aec[n3 n4]", "replicated/0:arc[n4]"}},
	}
	for _, tt := range tests {
		t.Run(tt.spec+"/"+tt.kinds.String()+"/"+strings.Join(tt.failed, ","), func(t *testing.T) {
			md := mustModel(t, block(t, tt.spec, 4, 1, 1, 1, tt.kinds, nil))
			p, err := md.Plan(tt.failed)
			if err != nil {
				t.Fatal(err)
			}
			if p.Survives != tt.ok {
				t.Fatalf("survives %v, want %v: %q", p.Survives, tt.ok, p.Reasons)
			}
			if tt.reason != "" && (len(p.Reasons) == 0 || !strings.Contains(p.Reasons[0], tt.reason)) {
				t.Fatalf("reasons %q, want %q", p.Reasons, tt.reason)
			}
			var srcs []string
			for _, s := range p.Shards {
				srcs = append(srcs, fmt.Sprintf("%s/%d:%s%v", s.Kind, s.Rank, s.Source, s.From))
			}
			got := strings.Join(srcs, " ")
			for _, w := range tt.sources {
				if !strings.Contains(got, w) {
					t.Errorf("sources %s: missing %s", got, w)
				}
			}
		})
	}
}

// TestMultiGroup: pp=2 with two ranks per node in Megatron order; each SG
// has its members on distinct nodes and every 1-node failure survives
// under arc, while losing the two nodes of a stage's neighbours does not.
func TestMultiGroup(t *testing.T) {
	// tp=2, dp=2, pp=2, 2 ranks per node: node = (dp, pp).
	md := mustModel(t, block(t, "arc", 2, 2, 2, 2, 0, nil))
	if len(md.Groups) != 4 || len(md.Warnings) != 0 {
		t.Fatalf("groups %v warnings %v", md.Groups, md.Warnings)
	}
	g := md.Groups[3] // pp=1, tp=1: ranks 5 (dp 0) and 7 (dp 1)
	if g.Name() != "(pp=1,tp=1)" || !slices.Equal(g.Ranks(), []int{5, 7}) || g.Members[0].Node != "n3" || g.Members[1].Node != "n4" {
		t.Fatalf("group 3 = %+v", g)
	}
	if md.Tolerance() != 1 {
		t.Fatalf("tolerance %d", md.Tolerance())
	}
	for _, n := range md.StateNodes() {
		if ok, _ := md.Survives([]string{n}); !ok {
			t.Errorf("lost with only %s failed", n)
		}
	}
	p, _ := md.Plan([]string{"n3", "n4"})
	if p.Survives || len(p.Reasons) < 2 || !strings.HasPrefix(p.Reasons[0], "SG (pp=1,tp=0) lost ranks 4 and 6 on nodes n3,n4") {
		t.Fatalf("plan %q", p.Reasons)
	}
}

func TestModelErrors(t *testing.T) {
	j := block(t, "arc+aec:2", 3, 1, 1, 1, 0, nil)
	if _, err := NewModel(j); err == nil || !strings.Contains(err.Error(), "needs at least 4 members") {
		t.Errorf("arc+aec:2 with dp=3: %v", err)
	}
	j = block(t, "aec:3", 3, 1, 1, 1, 0, nil)
	if _, err := NewModel(j); err == nil || !strings.Contains(err.Error(), "raise dp") {
		t.Errorf("aec:3 with dp=3: %v", err)
	}
	j = block(t, "aor", 1, 2, 1, 1, 0, nil)
	if _, err := NewModel(j); err == nil || !strings.Contains(err.Error(), "dp=1") {
		t.Errorf("aor with dp=1: %v", err)
	}
	j = block(t, "arc,dp=8", 4, 1, 1, 1, 0, nil)
	if _, err := NewModel(j); err == nil || !strings.Contains(err.Error(), "says dp=8 but the layout has dp=4") {
		t.Errorf("spec dp mismatch: %v", err)
	}
	j = block(t, "arc", 4, 1, 1, 1, 0, nil)
	j.Topology.RankNode = j.Topology.RankNode[:3]
	if _, err := NewModel(j); err == nil || !strings.Contains(err.Error(), "has 3 ranks but the layout has 4") {
		t.Errorf("short map: %v", err)
	}
	j = block(t, "arc", 4, 1, 1, 1, 0, nil)
	j.Topology.Nodes = []string{"n1", "n2", "n3"}
	if _, err := NewModel(j); err == nil || !strings.Contains(err.Error(), "n4, which is not in the node list") {
		t.Errorf("node missing from list: %v", err)
	}
	j.Topology.Nodes = []string{"n1", "n2", "n3", "n4", "n1"}
	if _, err := NewModel(j); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("duplicate node: %v", err)
	}
	md := mustModel(t, block(t, "arc", 4, 1, 1, 1, 0, nil))
	if _, err := md.Plan([]string{"n9"}); err == nil || !strings.Contains(err.Error(), `"n9" is not one of the job's nodes`) {
		t.Errorf("unknown failed node: %v", err)
	}
	if _, err := Analyze(block(t, "arc", 4, 1, 1, 1, 0, nil), []string{"n1"}); err != nil {
		t.Errorf("Analyze: %v", err)
	}
}

// TestDPOne: with dp=1 nothing is replicated; all state is per-rank and
// protected by peer copies only.
func TestDPOne(t *testing.T) {
	md := mustModel(t, block(t, "arc", 1, 4, 1, 1, Replicated, nil))
	if md.Kinds != Sharded {
		t.Fatalf("kinds %v, want sharded", md.Kinds)
	}
	if ok, _ := md.Survives([]string{"n1"}); !ok {
		t.Error("dp=1 arc: one failed node lost state")
	}
	if ok, _ := md.Survives([]string{"n1", "n2"}); ok {
		t.Error("dp=1 arc: a whole GEMINI pair failed and state survived")
	}
}

// TestFewNodes: more copies asked than nodes: a warning and fewer copies.
func TestFewNodes(t *testing.T) {
	md := mustModel(t, block(t, "arc+aec", 4, 1, 1, 2, 0, nil)) // 2 nodes
	var kinds []string
	for _, w := range md.Warnings {
		kinds = append(kinds, w.Kind)
	}
	if !slices.Contains(kinds, WarnFewNodes) || md.copies != 1 {
		t.Fatalf("warnings %v copies %d", md.Warnings, md.copies)
	}
	// One node takes 2 members, within arc+aec's 2, and its state has 1 copy.
	if md.Tolerance() != 1 {
		t.Errorf("tolerance %d, want 1", md.Tolerance())
	}
	if ok, _ := md.Survives([]string{"n1", "n2"}); ok {
		t.Error("both nodes failed and the job survived")
	}
}

func TestKinds(t *testing.T) {
	k, err := ParseKinds("replicated, Sharded")
	if err != nil || k != Replicated|Sharded || k.String() != "replicated,sharded" {
		t.Errorf("ParseKinds = %v, %v", k, err)
	}
	if _, err := ParseKinds("replicated,params"); err == nil || !strings.Contains(err.Error(), `"params"`) {
		t.Errorf("bad kind: %v", err)
	}
	var back Kind
	if err := back.UnmarshalText([]byte("optimizer")); err != nil || back != Optimizer {
		t.Errorf("UnmarshalText = %v, %v", back, err)
	}
}
