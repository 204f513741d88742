package explain

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func run(args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = Command(args, &o, &e)
	return code, o.String(), e.String()
}

func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	code, out, errs := run(args...)
	if code != 0 {
		t.Fatalf("reft explain %v: exit %d: %s", args, code, errs)
	}
	return out
}

func wantLines(t *testing.T, out string, lines ...string) {
	t.Helper()
	for _, l := range lines {
		if !strings.Contains(out, l) {
			t.Errorf("output lacks %q:\n%s", l, out)
		}
	}
}

// TestTextBriefExample is the example: arc+aec, dp=4 pp=2, 8 nodes.
func TestTextBriefExample(t *testing.T) {
	out := mustRun(t, "--spec", "arc+aec", "--dp", "4", "--pp", "2", "--tp", "1", "--nodes", "n[1-8]", "--failures", "3")
	wantLines(t, out,
		"reft explain: --reft=arc+aec, dp=4 pp=2 tp=1 (order tp-dp-pp), 8 ranks on 8 nodes, 1 per node\n",
		"  replicated  arc+aec  each of the 4 members of an SG keeps its 1/4 shard",
		"survives any 2 failed members per SG",
		"  SG (pp=0,tp=0)  ranks 0,1,2,3  nodes n1,n2,n3,n4\n",
		"  SG (pp=1,tp=0)  ranks 4,5,6,7  nodes n5,n6,n7,n8\n",
		"Placement of per-rank state (GEMINI mixed, 3 replicas): groups {n[1-3]}, ring n4->n5->n6->n7->n8->\n",
		"  n7 -> copies on n8,n4\n",
		"Warnings\n  none\n",
		"  guaranteed by the layout: any 2 failed nodes\n",
		"  1 failed node: 8 of 8 sets survive\n",
		"  2 failed nodes: 28 of 28 sets survive\n",
		"  3 failed nodes: 45 of 56 sets survive; 11 do not:\n",
		"    n1,n2,n3: SG (pp=0,tp=0) lost ranks 0, 1 and 2 on nodes n1,n2,n3; arc+aec tolerates 2 failures per group: ",
		"    ... 1 more (--json lists up to 100)\n",
	)
}

func TestJSON(t *testing.T) {
	out := mustRun(t, "--spec", "arc", "--dp", "4", "--nodes", "n[1-4]", "--failures", "2", "--json")
	var r struct {
		Spec       string
		Tolerance  int
		AllSurvive int `json:"all_survive"`
		Groups     []struct {
			PP, TP  int
			Members []struct{ Rank int }
		}
		Failures []struct {
			Nodes, Checked, Survived int
			Sets                     string
			Exact                    bool
			Failing                  []struct{ Nodes, Reasons []string }
		}
		Placement struct {
			Strategy string
			Holders  map[string][]string
		}
		Warnings []any
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if r.Spec != "arc" || r.Tolerance != 1 || r.AllSurvive != 1 || len(r.Groups) != 1 || len(r.Groups[0].Members) != 4 || r.Warnings == nil {
		t.Fatalf("report %+v", r)
	}
	f := r.Failures[1]
	// 2 of 4 nodes: the 4 ring-neighbour pairs lose a replicated shard,
	// and the GEMINI pairs {n1,n2},{n3,n4} lose sharded state; only
	// {n1,n3} and {n2,n4} survive.
	if f.Nodes != 2 || f.Sets != "6" || f.Checked != 6 || f.Survived != 2 || !f.Exact || len(f.Failing) != 4 {
		t.Fatalf("2-node failures %+v", f)
	}
	if strings.Join(f.Failing[0].Nodes, ",") != "n1,n2" || !strings.HasPrefix(f.Failing[0].Reasons[0], "SG (pp=0,tp=0) lost ranks 0 and 1 on nodes n1,n2; arc tolerates 1 failure per group") {
		t.Errorf("first failing set %+v", f.Failing[0])
	}
	if r.Placement.Strategy != "group" || strings.Join(r.Placement.Holders["n2"], ",") != "n1" {
		t.Errorf("placement %+v", r.Placement)
	}
}

func TestDomainsAndSpares(t *testing.T) {
	out := mustRun(t, "--spec", "arc", "--dp", "4", "--tp", "2", "--nodes", "n[1-4],spare1", "--ranks-per-node", "2",
		"--domains", "n[1-2]=rackA,n3,n4,spare1=rackB")
	wantLines(t, out,
		"8 ranks on 4 nodes, 2 per node\n",
		"spare nodes (no ranks, their failure changes nothing): spare1\n",
		"  SG (pp=0,tp=0)  ranks 0,4,2,6  nodes n1,n3,n2,n4  domains rackA,rackB,rackA,rackB\n",
		"groups {n[1,3]} {n[2,4]}",
		"Domain failures (every node of one domain at once)\n    rackA (n[1-2]): survives\n    rackB (n[3-4],spare1): survives\n",
	)
	var r struct {
		Spares  []string
		Domains []struct {
			Domain   string
			Survives bool
		}
	}
	if err := json.Unmarshal([]byte(mustRun(t, "--spec", "arc", "--dp", "4", "--nodes", "n[1-4]", "--domains", "n[1-3]=A,n4=B", "--json")), &r); err != nil {
		t.Fatal(err)
	}
	// Rack A holds 3 of 4 members: neighbours cannot be avoided.
	if len(r.Domains) != 2 || r.Domains[0].Survives || !r.Domains[1].Survives {
		t.Errorf("domains %+v", r.Domains)
	}
}

// TestDomainsFromConfig: without --domains, reft.toml's [topology] labels
// apply (a node without one is a domain of its own); --domains wins over
// them; a --config that is given must exist.
func TestDomainsFromConfig(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "reft.toml")
	if err := os.WriteFile(conf, []byte("[topology]\ndomains = { rackA = \"n[1-2]\" }\ndomain_pattern = \"^(rack[B-Z])-\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"labels and pattern", []string{"--nodes", "n1,n2,rackB-1,rackB-2", "--config", conf},
			[]string{"nodes n1,rackB-1,n2,rackB-2  domains rackA,rackB,rackA,rackB"}},
		{"unlabelled node", []string{"--nodes", "n1,n2,x1,x2", "--config", conf},
			[]string{"nodes n1,x1,n2,x2  domains rackA,x1,rackA,x2"}},
		{"--domains wins", []string{"--nodes", "n1,n2,rackB-1,rackB-2", "--config", conf, "--domains", "n1,rackB-1=A,n2,rackB-2=B"},
			[]string{"nodes n1,n2,rackB-1,rackB-2  domains A,B,A,B"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wantLines(t, mustRun(t, append([]string{"--spec", "arc", "--dp", "4"}, tc.args...)...), tc.want...)
		})
	}
	code, _, errs := run("--spec", "arc", "--dp", "4", "--nodes", "n[1-4]", "--config", filepath.Join(t.TempDir(), "none.toml"))
	if code != 2 || !strings.Contains(errs, "none.toml") {
		t.Errorf("a missing --config: exit %d, %q", code, errs)
	}
}

func TestSharedNodes(t *testing.T) {
	out := mustRun(t, "--spec", "arc", "--dp", "4", "--nodes", "n[1-2]")
	wantLines(t, out,
		"  SG (pp=0,tp=0)  ranks 0,2,1,3  nodes n1,n2,n1,n2\n",
		"  SG (pp=0,tp=0): ranks 0 and 1 share node n1, so losing n1 loses 2 of the group's 4 members at once",
		"  guaranteed by the layout: none (a single node failure can lose state; see below)\n",
		"  1 failed node: 2 of 2 sets survive\n",
	)
}

func TestMapFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "map")
	// srun -l hostname style, cyclic distribution.
	if err := os.WriteFile(path, []byte("# rank: node\n0: a\n1: b\n2: a\n3: b\n4-5 c\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := mustRun(t, "--spec", "aec", "--pp", "2", "--nodes", "a,b,c", "--map", path)
	wantLines(t, out,
		"dp=3 pp=2 tp=1 (order tp-dp-pp), 6 ranks on 3 nodes, 2 per node\n",
		"  SG (pp=0,tp=0)  ranks 0,1,2  nodes a,b,a\n",
		"  SG (pp=0,tp=0): ranks 0 and 2 share node a",
	)
}

func TestSampling(t *testing.T) {
	out := mustRun(t, "--spec", "arc", "--dp", "8", "--pp", "4", "--nodes", "n[1-32]", "--failures", "3", "--max-sets", "300", "--json")
	var r struct {
		Failures []struct {
			Nodes, Checked, Survived int
			Sets                     string
			Exact                    bool
		}
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Failures) != 3 || !r.Failures[0].Exact || r.Failures[0].Checked != 32 || r.Failures[2].Exact ||
		r.Failures[2].Checked != 300 || r.Failures[2].Sets != "4960" {
		t.Fatalf("failures %+v", r.Failures)
	}
	txt := mustRun(t, "--spec", "arc", "--dp", "8", "--pp", "4", "--nodes", "n[1-32]", "--failures", "2", "--max-sets", "300")
	wantLines(t, txt, "  2 failed nodes: ", " of 300 sampled sets survive (496 sets in all)")
	// Same seed, same sample.
	if again := mustRun(t, "--spec", "arc", "--dp", "8", "--pp", "4", "--nodes", "n[1-32]", "--failures", "2", "--max-sets", "300"); again != txt {
		t.Error("sampled output differs between runs")
	}
}

func TestSpecKeysAndDefaults(t *testing.T) {
	// dp from the spec; 8 ranks over 4 nodes.
	out := mustRun(t, "--spec", "arc+aor,dp=4,pp=2", "--nodes", "n[1-4]")
	wantLines(t, out, "--reft=arc+aor,dp=4,pp=2, dp=4 pp=2 tp=1", "buffers: replicated,optimizer,sharded",
		"  optimizer   aor  ZeRO-1 optimizer shards")
	// dp derived from --ranks-per-node.
	out = mustRun(t, "--spec", "off", "--nodes", "n[1-3]", "--ranks-per-node", "2", "--buffers", "sharded")
	wantLines(t, out, "dp=6 pp=1 tp=1", "guaranteed by the layout: none",
		"n1: node n1 (ranks 0-1): per-rank state lost: --reft=off keeps no copies")
}

func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	dup := filepath.Join(dir, "dup")
	os.WriteFile(dup, []byte("0 n1\n0 n2\n"), 0o644)
	gap := filepath.Join(dir, "gap")
	os.WriteFile(gap, []byte("0 n1\n2 n2\n"), 0o644)
	junk := filepath.Join(dir, "junk")
	os.WriteFile(junk, []byte("0 n1 extra\n"), 0o644)
	stranger := filepath.Join(dir, "stranger")
	os.WriteFile(stranger, []byte("0 n9\n"), 0o644)
	base := []string{"--spec", "arc", "--dp", "4", "--nodes", "n[1-4]"}
	with := func(extra ...string) []string { return append(append([]string{}, base...), extra...) }
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--nodes", "n[1-4]"}, "--spec is required"},
		{[]string{"--spec", "arc"}, "--nodes is required"},
		{[]string{"--spec", "arc+bogus", "--nodes", "n1"}, `--spec: --reft=arc+bogus: unknown mode "bogus"`},
		{[]string{"--spec", "arc", "--dp", "2", "--nodes", "n[2-1]"}, "--nodes \"n[2-1]\": bad range"},
		{with("--order", "tp-pp"), "--order: rank order"},
		{[]string{"--spec", "arc,dp=2", "--dp", "4", "--nodes", "n[1-4]"}, "--dp 4 disagrees with dp=2 in --spec"},
		{[]string{"--spec", "arc", "--nodes", "n[1-4]"}, "give --dp"},
		{[]string{"--spec", "arc", "--dp", "3", "--nodes", "n[1-2]"}, "3 ranks (dp*pp*tp) do not fill 2 nodes evenly; give --ranks-per-node or --map"},
		{with("--ranks-per-node", "0", "--map", "x"), "no such file"},
		{with("--ranks-per-node", "1", "--map", dup), "--ranks-per-node and --map both given"},
		{[]string{"--spec", "arc", "--dp", "8", "--nodes", "n[1-2]", "--ranks-per-node", "2"}, "gives 4 slots for 8 ranks"},
		{with("--map", dup), "rank 0 is mapped twice (to n1 and n2)"},
		{with("--map", gap), "has no line for rank 1"},
		{with("--map", junk), `line 1: "0 n1 extra": want RANK NODE`},
		{with("--map", stranger), "node n9 is not in --nodes"},
		{with("--domains", "n[1-2]=A"), "--domains gives no domain for n[3-4]; label every node"},
		{with("--domains", "n[1-4]=A,n5=B"), "--domains names n5, which is not in --nodes"},
		{with("--domains", "n[1-4]=A,n1=B"), "puts n1 in both A and B"},
		{with("--domains", "n[1-4]"), "--domains ends with hosts n[1-4] without a label"},
		{with("--domains", "n[1-4]="), "the label after '=' must be a plain name"},
		{with("--buffers", "params"), `--buffers: unknown buffer kind "params"`},
		{with("--max-sets", "0"), "--max-sets must be >= 1"},
		{[]string{"--spec", "arc+aec:3", "--dp", "4", "--nodes", "n[1-4]"}, "arc+aec:3 needs at least 5 members per sharding group"},
		{[]string{"--spec", "aor", "--dp", "1", "--pp", "2", "--nodes", "n[1-2]"}, "dp=1 leaves none"},
		{with("--frobnicate"), "flag provided but not defined"},
		{with("stray"), `unexpected argument "stray"`},
	}
	for _, tt := range tests {
		code, out, errs := run(tt.args...)
		if code != 2 || out != "" || !strings.Contains(errs, tt.want) {
			t.Errorf("reft explain %q: exit %d, stdout %q, stderr %q; want exit 2 and %q", tt.args, code, out, errs, tt.want)
		}
	}
}

func TestHelp(t *testing.T) {
	code, out, errs := run("-h")
	if code != 0 || out != "" || !strings.Contains(errs, "usage: reft explain --spec SPEC --nodes HOSTLIST") || !strings.Contains(errs, "-ranks-per-node") {
		t.Errorf("-h: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

// TestManyReasons: tp=8 puts 8 SGs on the same two nodes; losing both
// gives 8 group reasons and 2 node reasons, of which text prints 4.
func TestManyReasons(t *testing.T) {
	out := mustRun(t, "--spec", "arc", "--dp", "2", "--tp", "8", "--nodes", "n[1-2]", "--failures", "2")
	wantLines(t, out,
		"  2 failed nodes: 0 of 1 sets survive; 1 do not:\n    n1,n2: SG (pp=0,tp=0) lost ranks 0 and 8 on nodes n1,n2; arc tolerates 1 failure per group: ",
		"      also SG (pp=0,tp=3) lost",
		"      and 6 more reasons (--json lists them)\n",
	)
	if strings.Contains(out, "also SG (pp=0,tp=4)") {
		t.Errorf("printed more than 3 further reasons:\n%s", out)
	}
}
