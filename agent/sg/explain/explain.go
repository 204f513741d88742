// Package explain implements `reft explain`: for a protection spec, a
// layout and a node list it prints the sharding groups, placement warnings,
// and which sets of failed nodes the job survives in memory, and why the
// others do not. It runs the same analysis (agent/sg) as the restore
// planner. docs/EXPLAIN.md says how to read the output.
package explain

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"math/rand"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/agent/sg"
	"github.com/reft-hpc/reft/pmix/hostlist"
	"github.com/reft-hpc/reft/spank/spec"
)

const usageHead = `usage: reft explain --spec SPEC --nodes HOSTLIST [--dp N] [--pp N] [--tp N]
                    [--ranks-per-node N | --map FILE] [--domains LIST]
                    [--order tp-dp-pp] [--buffers LIST] [--failures K] [--json]

Shows how a job's snapshots are protected under --reft=SPEC: its sharding
groups, warnings about their placement, and which sets of up to K failed nodes
it survives from memory; for each set it does not survive, why.

  --map FILE     one line per rank: "RANK NODE", "RANK: NODE" (the output of
                 'srun -l hostname') or "FIRST-LAST NODE"; '#' starts a comment
  --domains LIST failure domains as HOSTLIST=LABEL items, as in
                 n[1-4]=rackA,n[5-8]=rackB; every node needs a label.
                 Without it, the [topology] labels of reft.toml (--config)
                 are used, as the agents use them

See docs/EXPLAIN.md for how to read the output.

flags:
`

// Defaults and limits.
const (
	defaultMaxSets = 100000
	textFailing    = 10  // failing sets printed per size
	jsonFailing    = 100 // failing sets listed per size in --json
	textGroups     = 32  // groups printed before "... N more"
	textHolders    = 16  // placement lines printed
	textWarnings   = 20  // warnings printed
	textAlso       = 3   // further reasons printed per failing set
)

type options struct {
	spec, nodes, order, mapFile, domains, buffers string
	config                                        string
	configGiven                                   bool
	dp, pp, tp, rpn, failures, maxSets            int
	json                                          bool
}

// Command is the `reft explain` entry point; it returns the exit code:
// 0 (whatever the job survives), 2 for bad input.
func Command(args []string, stdout, stderr io.Writer) int {
	var o options
	fs := flag.NewFlagSet("reft explain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usageHead)
		fs.PrintDefaults()
	}
	fs.StringVar(&o.spec, "spec", "", "protection `SPEC` as given to --reft (arc, aec, aec:K, aor, off, or '+' combinations)")
	fs.StringVar(&o.nodes, "nodes", "", "the job's node list, a Slurm `HOSTLIST` such as n[1-8]")
	fs.IntVar(&o.dp, "dp", 0, "data-parallel degree `N` (default: from SPEC, or the rank count / (pp*tp))")
	fs.IntVar(&o.pp, "pp", 0, "pipeline stages `N` (default: from SPEC, or 1)")
	fs.IntVar(&o.tp, "tp", 0, "tensor-parallel degree `N` (default: from SPEC, or 1)")
	fs.StringVar(&o.order, "order", sg.DefaultOrder, "rank `ORDER`, fastest-varying dimension first")
	fs.IntVar(&o.rpn, "ranks-per-node", 0, "ranks per node `N`, placed in rank order (Slurm's block distribution; default: ranks / nodes)")
	fs.StringVar(&o.mapFile, "map", "", "rank-to-node map `FILE` instead of --ranks-per-node")
	fs.StringVar(&o.domains, "domains", "", "failure domains `LIST`, as in n[1-4]=rackA,n[5-8]=rackB")
	fs.StringVar(&o.config, "config", config.UserPath(), "reft configuration `file` (default $REFT_CONFIG or "+config.DefaultPath+"), for its [topology] failure domains when --domains is not given")
	fs.StringVar(&o.buffers, "buffers", "", "buffer kinds the job registers, `LIST` of "+sg.ValidKinds+" (default: replicated,sharded, plus optimizer with aor)")
	fs.IntVar(&o.failures, "failures", -1, "check every set of up to `K` failed nodes (default: the guaranteed tolerance + 1)")
	fs.IntVar(&o.maxSets, "max-sets", defaultMaxSets, "check at most `N` sets per size; larger sizes are sampled")
	fs.BoolVar(&o.json, "json", false, "print the report as JSON")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "reft explain: run 'reft explain -h' for the flags\n")
		return 2
	}
	fs.Visit(func(f *flag.Flag) { o.configGiven = o.configGiven || f.Name == "config" })
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "reft explain: unexpected argument %q; every input is a --flag (run 'reft explain -h')\n", fs.Arg(0))
		return 2
	}
	rep, err := explain(o)
	if err != nil {
		fmt.Fprintf(stderr, "reft explain: %v\n", err)
		return 2
	}
	if o.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			fmt.Fprintf(stderr, "reft explain: %v\n", err)
			return 1
		}
		return 0
	}
	writeText(stdout, rep)
	return 0
}

// report is what explain found; --json prints it as is.
type report struct {
	Spec         string          `json:"spec"`
	Layout       layoutJSON      `json:"layout"`
	Nodes        []string        `json:"nodes"`
	Spares       []string        `json:"spares,omitempty"`
	RanksPerNode map[string]int  `json:"ranks_per_node"`
	Buffers      sg.Kind         `json:"buffers"`
	Protection   []sg.Protection `json:"protection"`
	Groups       []sg.Group      `json:"groups"`
	Placement    sg.Placement    `json:"placement"`
	Warnings     []sg.Warning    `json:"warnings"`
	// Tolerance is the number of failed nodes always survived, by the
	// layout's construction; AllSurvive is the largest k for which every
	// checked set of up to k nodes survived.
	Tolerance  int            `json:"tolerance"`
	AllSurvive int            `json:"all_survive"`
	Failures   []failureCount `json:"failures"`
	Domains    []domainResult `json:"domains,omitempty"`
}

type layoutJSON struct {
	DP    int    `json:"dp"`
	PP    int    `json:"pp"`
	TP    int    `json:"tp"`
	Order string `json:"order"`
	World int    `json:"world"`
}

type failureCount struct {
	Nodes    int          `json:"nodes"`   // failed nodes per set
	Sets     string       `json:"sets"`    // C(N, k), as a decimal string (it can exceed int64)
	Checked  int          `json:"checked"` // sets checked
	Survived int          `json:"survived"`
	Exact    bool         `json:"exact"` // every set checked; false: a uniform sample
	Failing  []failingSet `json:"failing"`
}

type failingSet struct {
	Nodes   []string `json:"nodes"`
	Reasons []string `json:"reasons"`
}

type domainResult struct {
	Domain   string   `json:"domain"`
	Nodes    []string `json:"nodes"`
	Survives bool     `json:"survives"`
	Reasons  []string `json:"reasons,omitempty"`
}

func explain(o options) (*report, error) {
	s, nodes, order, err := parseJob(o)
	if err != nil {
		return nil, err
	}
	l, rankNode, err := layout(o, s, nodes, order)
	if err != nil {
		return nil, err
	}
	domains, err := siteDomains(o, nodes)
	if err != nil {
		return nil, err
	}
	var kinds sg.Kind
	if o.buffers != "" {
		if kinds, err = sg.ParseKinds(o.buffers); err != nil {
			return nil, fmt.Errorf("--buffers: %w", err)
		}
	}
	md, err := sg.NewModel(sg.Job{Spec: s, Layout: l, Topology: sg.Topology{RankNode: rankNode, Nodes: nodes, Domain: domains}, Kinds: kinds})
	if err != nil {
		return nil, err
	}
	rep := newReport(md, s, l, order, nodes)
	if err := rep.countFailures(md, o); err != nil {
		return nil, err
	}
	if domains != nil {
		if rep.Domains, err = domainResults(md, nodes, domains); err != nil {
			return nil, err
		}
	}
	return rep, nil
}

// parseJob reads --spec, --nodes, --order and --max-sets.
func parseJob(o options) (spec.Spec, []string, sg.Order, error) {
	var order sg.Order
	if strings.TrimSpace(o.spec) == "" {
		return spec.Spec{}, nil, order, fmt.Errorf("--spec is required: give the value you pass to --reft, as in --spec arc+aec")
	}
	s, err := spec.Parse(o.spec)
	if err != nil {
		return s, nil, order, fmt.Errorf("--spec: %w", err)
	}
	if strings.TrimSpace(o.nodes) == "" {
		return s, nil, order, fmt.Errorf("--nodes is required: the job's node list, as in --nodes n[1-8]")
	}
	nodes, err := hostlist.Expand(o.nodes)
	if err != nil {
		return s, nil, order, fmt.Errorf("--nodes %q: %w; write a Slurm host list such as n[1-8] or a,b,c", o.nodes, err)
	}
	if order, err = sg.ParseOrder(o.order); err != nil {
		return s, nil, order, fmt.Errorf("--order: %w", err)
	}
	if o.maxSets < 1 {
		return s, nil, order, fmt.Errorf("--max-sets must be >= 1; got %d", o.maxSets)
	}
	return s, nodes, order, nil
}

// siteDomains are the failure domains of nodes: --domains, else the
// site's labels as the agents see them (--config; a missing default file
// is no error: then there are none), a node without a label a domain of
// its own. nil: none.
func siteDomains(o options, nodes []string) (map[string]string, error) {
	domains, err := parseDomains(o.domains, nodes)
	if err != nil || domains != nil || o.config == "" {
		return domains, err
	}
	cfg, err := config.Load(o.config, !o.configGiven && config.MissingOK(o.config))
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	if domains, err = cfg.Topology.DomainsOf(nodes); err != nil {
		return nil, err
	}
	if len(domains) == 0 {
		return nil, nil
	}
	for _, n := range nodes { // a node without a label is a domain of its own
		if domains[n] == "" {
			domains[n] = n
		}
	}
	return domains, nil
}

// newReport is the report of md's job, without its failure counts.
func newReport(md *sg.Model, s spec.Spec, l sg.Layout, order sg.Order, nodes []string) *report {
	rep := &report{
		Spec:         s.String(),
		Layout:       layoutJSON{DP: l.DP, PP: l.PP, TP: l.TP, Order: order.String(), World: l.World()},
		Nodes:        nodes,
		RanksPerNode: map[string]int{},
		Buffers:      md.Kinds,
		Protection:   md.Protection,
		Groups:       md.Groups,
		Placement:    md.Placement,
		Warnings:     md.Warnings,
		Tolerance:    md.Tolerance(),
	}
	if rep.Warnings == nil {
		rep.Warnings = []sg.Warning{}
	}
	for _, n := range nodes {
		if k := len(md.NodeRanks(n)); k > 0 {
			rep.RanksPerNode[n] = k
		} else {
			rep.Spares = append(rep.Spares, n)
		}
	}
	return rep
}

// countFailures checks the failure sets of 1 up to --failures state
// nodes (default: one more than the tolerance) and finds how many
// failures every set survives.
func (rep *report) countFailures(md *sg.Model, o options) error {
	state := md.StateNodes()
	k := o.failures
	if k < 0 {
		k = rep.Tolerance + 1
	}
	k = min(k, len(state))
	// Explaining a failing set costs a full plan: only as many as printed.
	keep := textFailing
	if o.json {
		keep = jsonFailing
	}
	rep.AllSurvive = -1
	for size := 1; size <= k; size++ {
		fc, err := countFailures(md, state, size, o.maxSets, keep)
		if err != nil {
			return err
		}
		rep.Failures = append(rep.Failures, fc)
		if rep.AllSurvive < 0 && fc.Survived < fc.Checked {
			rep.AllSurvive = size - 1
		}
	}
	if rep.AllSurvive < 0 {
		rep.AllSurvive = k
	}
	return nil
}

// domainResults plans the loss of each failure domain's nodes at once, in
// the order the domains first appear in nodes.
func domainResults(md *sg.Model, nodes []string, domains map[string]string) ([]domainResult, error) {
	byDomain := map[string][]string{}
	var labels []string
	for _, n := range nodes {
		d := domains[n]
		if _, ok := byDomain[d]; !ok {
			labels = append(labels, d)
		}
		byDomain[d] = append(byDomain[d], n)
	}
	var out []domainResult
	for _, d := range labels {
		p, err := md.Plan(byDomain[d])
		if err != nil {
			return nil, err
		}
		out = append(out, domainResult{Domain: d, Nodes: byDomain[d], Survives: p.Survives, Reasons: p.Reasons})
	}
	return out, nil
}

// layout settles dp, pp, tp and the rank-to-node map from the flags, the
// spec's keys and the node list.
func layout(o options, s spec.Spec, nodes []string, order sg.Order) (sg.Layout, []string, error) {
	dp, pp, tp, err := dims(o, s)
	if err != nil {
		return sg.Layout{}, nil, err
	}
	if o.rpn != 0 && o.mapFile != "" {
		return sg.Layout{}, nil, fmt.Errorf("--ranks-per-node and --map both given; use one")
	}
	if o.rpn < 0 {
		return sg.Layout{}, nil, fmt.Errorf("--ranks-per-node must be >= 1; got %d", o.rpn)
	}
	var rankNode []string
	if o.mapFile != "" {
		if rankNode, err = readMap(o.mapFile, nodes); err != nil {
			return sg.Layout{}, nil, err
		}
	}
	world, err := worldSize(o, dp, pp, tp, rankNode, len(nodes))
	if err != nil {
		return sg.Layout{}, nil, err
	}
	l := sg.Layout{DP: world / (pp * tp), PP: pp, TP: tp, Order: order}
	if err := l.Validate(); err != nil {
		return sg.Layout{}, nil, err
	}
	if rankNode != nil {
		if len(rankNode) != world {
			return sg.Layout{}, nil, fmt.Errorf("--map %s lists %d ranks but dp*pp*tp = %d; list every rank 0..%d once", o.mapFile, len(rankNode), world, world-1)
		}
		return l, rankNode, nil
	}
	rankNode, err = spreadRanks(o.rpn, nodes, world)
	return l, rankNode, err
}

// dims are dp, pp and tp from the flags or the spec's keys (dp 0: not
// given; pp and tp at least 1).
func dims(o options, s spec.Spec) (dp, pp, tp int, err error) {
	pick := func(name string, flagV, specV int) (int, error) {
		switch {
		case flagV < 0:
			return 0, fmt.Errorf("--%s must be >= 1; got %d", name, flagV)
		case flagV > 0 && specV > 0 && flagV != specV:
			return 0, fmt.Errorf("--%s %d disagrees with %s=%d in --spec; drop one or make them agree", name, flagV, name, specV)
		case flagV > 0:
			return flagV, nil
		}
		return specV, nil
	}
	if dp, err = pick("dp", o.dp, s.DP); err != nil {
		return 0, 0, 0, err
	}
	if pp, err = pick("pp", o.pp, s.PP); err != nil {
		return 0, 0, 0, err
	}
	if tp, err = pick("tp", o.tp, s.TP); err != nil {
		return 0, 0, 0, err
	}
	return dp, max(pp, 1), max(tp, 1), nil
}

// worldSize is the job's rank count: dp*pp*tp, else the map's ranks, else
// --ranks-per-node on every node; a multiple of pp*tp.
func worldSize(o options, dp, pp, tp int, rankNode []string, nodes int) (int, error) {
	world := dp * pp * tp
	switch {
	case dp > 0 && world > sg.MaxWorld:
		return 0, fmt.Errorf("dp*pp*tp = %d ranks is more than %d", world, sg.MaxWorld)
	case dp > 0:
		return world, nil
	case rankNode != nil:
		world = len(rankNode)
	case o.rpn > 0:
		world = o.rpn * nodes
	default:
		return 0, fmt.Errorf("give --dp (or dp= in --spec), or --ranks-per-node or --map so the rank count is known")
	}
	if world%(pp*tp) != 0 {
		return 0, fmt.Errorf("%d ranks are not a multiple of pp*tp = %d; give --dp, or fix --pp/--tp", world, pp*tp)
	}
	return world, nil
}

// spreadRanks puts world ranks on nodes in order, rpn per node (0: as
// many as fill the nodes evenly).
func spreadRanks(rpn int, nodes []string, world int) ([]string, error) {
	if rpn == 0 {
		if world%len(nodes) != 0 {
			return nil, fmt.Errorf("%d ranks (dp*pp*tp) do not fill %d nodes evenly; give --ranks-per-node or --map", world, len(nodes))
		}
		rpn = world / len(nodes)
	}
	if rpn*len(nodes) < world {
		return nil, fmt.Errorf("--ranks-per-node %d on %d nodes gives %d slots for %d ranks (dp*pp*tp); add nodes or raise --ranks-per-node", rpn, len(nodes), rpn*len(nodes), world)
	}
	rankNode := make([]string, world)
	for r := range rankNode {
		rankNode[r] = nodes[r/rpn]
	}
	return rankNode, nil
}

// readMap reads a rank-to-node map file; every rank must appear once and
// every node must be in nodes.
func readMap(path string, nodes []string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--map: %w", err)
	}
	defer f.Close()
	known := map[string]bool{}
	for _, n := range nodes {
		known[n] = true
	}
	byRank := map[int]string{}
	maxRank := -1
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(text)
		if len(fields) == 0 {
			continue
		}
		if err := mapLine(byRank, &maxRank, text, fields, known); err != nil {
			return nil, fmt.Errorf("--map %s line %d: %w", path, line, err)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("--map %s: %w", path, err)
	}
	if len(byRank) == 0 {
		return nil, fmt.Errorf("--map %s lists no ranks; write one line per rank, as in \"0 n1\"", path)
	}
	out := make([]string, maxRank+1)
	for r := range out {
		n, ok := byRank[r]
		if !ok {
			return nil, fmt.Errorf("--map %s has no line for rank %d; ranks 0..%d must each appear once", path, r, maxRank)
		}
		out[r] = n
	}
	return out, nil
}

// mapLine takes one map line (text, split into fields): RANK NODE,
// RANK: NODE or FIRST-LAST NODE, a node of known, each rank once.
func mapLine(byRank map[int]string, maxRank *int, text string, fields []string, known map[string]bool) error {
	if len(fields) != 2 {
		return fmt.Errorf("%q: want RANK NODE, RANK: NODE or FIRST-LAST NODE", strings.TrimSpace(text))
	}
	ranks, node := strings.TrimSuffix(fields[0], ":"), fields[1]
	lo, hi, isRange := strings.Cut(ranks, "-")
	if !isRange {
		hi = lo
	}
	a, err1 := strconv.Atoi(lo)
	b, err2 := strconv.Atoi(hi)
	if err1 != nil || err2 != nil || a < 0 || b < a || b >= sg.MaxWorld {
		return fmt.Errorf("%q is not a rank or a rank range FIRST-LAST", ranks)
	}
	if !known[node] {
		return fmt.Errorf("node %s is not in --nodes; add it there or fix the map", node)
	}
	for r := a; r <= b; r++ {
		if prev, dup := byRank[r]; dup {
			return fmt.Errorf("rank %d is mapped twice (to %s and %s)", r, prev, node)
		}
		byRank[r] = node
		*maxRank = max(*maxRank, r)
	}
	return nil
}

// parseDomains reads "n[1-4]=rackA,n[5-8]=rackB". Hosts written without a
// label ("n1,n2=rackA") take the next label given, so plain comma lists
// work too. Every node must end up with a label.
func parseDomains(list string, nodes []string) (map[string]string, error) {
	if strings.TrimSpace(list) == "" {
		return nil, nil
	}
	known := map[string]bool{}
	for _, n := range nodes {
		known[n] = true
	}
	out := map[string]string{}
	var pending []string
	for _, item := range hostlist.SplitTop(list) {
		hosts, label, hasLabel := strings.Cut(item, "=")
		hosts, label = strings.TrimSpace(hosts), strings.TrimSpace(label)
		expanded, err := hostlist.Expand(hosts)
		if err != nil {
			return nil, fmt.Errorf("--domains item %q: %w; write HOSTLIST=LABEL items, as in n[1-4]=rackA,n[5-8]=rackB", item, err)
		}
		pending = append(pending, expanded...)
		if !hasLabel {
			continue
		}
		if label == "" || strings.ContainsAny(label, "=[], \t") {
			return nil, fmt.Errorf("--domains item %q: the label after '=' must be a plain name, as in rackA", item)
		}
		if err := labelHosts(out, pending, label, known); err != nil {
			return nil, err
		}
		pending = nil
	}
	if len(pending) > 0 {
		return nil, fmt.Errorf("--domains ends with hosts %s without a label; finish with =LABEL, as in %s=rackC", hostlist.Compress(pending), hostlist.Compress(pending))
	}
	if err := everyNodeLabelled(out, nodes); err != nil {
		return nil, err
	}
	return out, nil
}

// labelHosts puts hosts, each one of --nodes (known), in domain label,
// which none of them may already be in under another.
func labelHosts(out map[string]string, hosts []string, label string, known map[string]bool) error {
	for _, h := range hosts {
		if !known[h] {
			return fmt.Errorf("--domains names %s, which is not in --nodes; fix the host list", h)
		}
		if prev, dup := out[h]; dup && prev != label {
			return fmt.Errorf("--domains puts %s in both %s and %s; a node belongs to one domain", h, prev, label)
		}
		out[h] = label
	}
	return nil
}

// everyNodeLabelled: each of nodes has a domain in out.
func everyNodeLabelled(out map[string]string, nodes []string) error {
	var missing []string
	for _, n := range nodes {
		if _, ok := out[n]; !ok {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("--domains gives no domain for %s; label every node, as in %s=rackC", hostlist.Compress(missing), hostlist.Compress(missing))
	}
	return nil
}

// countFailures checks the k-node failure sets among state: all of them
// when there are at most maxSets, else maxSets drawn uniformly (fixed seed,
// so output is reproducible).
func countFailures(md *sg.Model, state []string, k, maxSets, keep int) (failureCount, error) {
	total := new(big.Int).Binomial(int64(len(state)), int64(k))
	fc := failureCount{Nodes: k, Sets: total.String(), Exact: total.IsInt64() && total.Int64() <= int64(maxSets), Failing: []failingSet{}}
	set := make([]string, k)
	check := func(idx []int) error {
		for i, j := range idx {
			set[i] = state[j]
		}
		return fc.check(md, set, state, keep)
	}
	idx := make([]int, k)
	if fc.Exact {
		for i := range idx {
			idx[i] = i
		}
		for more := true; more; more = nextCombination(idx, len(state)) {
			if err := check(idx); err != nil {
				return fc, err
			}
		}
		return fc, nil
	}
	rng := rand.New(rand.NewSource(1))
	for n := 0; n < maxSets; n++ {
		sample(rng, len(state), idx)
		if err := check(idx); err != nil {
			return fc, err
		}
	}
	return fc, nil
}

// check counts the failure of the nodes of set; a set not survived is
// explained (its reasons, the nodes in state's order) while fewer than
// keep are.
func (fc *failureCount) check(md *sg.Model, set, state []string, keep int) error {
	ok, err := md.Survives(set)
	if err != nil {
		return err
	}
	fc.Checked++
	if ok {
		fc.Survived++
		return nil
	}
	if len(fc.Failing) < keep {
		reasons, err := md.Reasons(set)
		if err != nil {
			return err
		}
		names := append([]string(nil), set...)
		sortByList(names, state)
		fc.Failing = append(fc.Failing, failingSet{Nodes: names, Reasons: reasons})
	}
	return nil
}

// nextCombination moves idx, len(idx) increasing indexes below n, to the
// next combination in lexicographic order; false after the last.
func nextCombination(idx []int, n int) bool {
	k := len(idx)
	i := k - 1
	for i >= 0 && idx[i] == n-k+i {
		i--
	}
	if i < 0 {
		return false
	}
	idx[i]++
	for j := i + 1; j < k; j++ {
		idx[j] = idx[j-1] + 1
	}
	return true
}

// sample fills idx with len(idx) distinct indexes below n, uniformly
// (Floyd's algorithm).
func sample(rng *rand.Rand, n int, idx []int) {
	k := len(idx)
	chosen := map[int]bool{}
	for j := n - k; j < n; j++ {
		t := rng.Intn(j + 1)
		if chosen[t] {
			t = j
		}
		chosen[t] = true
	}
	i := 0
	for x := range chosen {
		idx[i] = x
		i++
	}
}

// sortByList orders names as they appear in list.
func sortByList(names, list []string) {
	pos := make(map[string]int, len(list))
	for i, n := range list {
		pos[n] = i
	}
	sort.Slice(names, func(i, j int) bool { return pos[names[i]] < pos[names[j]] })
}
