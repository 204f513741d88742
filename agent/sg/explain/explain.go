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
	fs.StringVar(&o.config, "config", config.DefaultPath, "reft configuration `file`, for its [topology] failure domains when --domains is not given")
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
	if strings.TrimSpace(o.spec) == "" {
		return nil, fmt.Errorf("--spec is required: give the value you pass to --reft, as in --spec arc+aec")
	}
	s, err := spec.Parse(o.spec)
	if err != nil {
		return nil, fmt.Errorf("--spec: %w", err)
	}
	if strings.TrimSpace(o.nodes) == "" {
		return nil, fmt.Errorf("--nodes is required: the job's node list, as in --nodes n[1-8]")
	}
	nodes, err := hostlist.Expand(o.nodes)
	if err != nil {
		return nil, fmt.Errorf("--nodes %q: %w; write a Slurm host list such as n[1-8] or a,b,c", o.nodes, err)
	}
	order, err := sg.ParseOrder(o.order)
	if err != nil {
		return nil, fmt.Errorf("--order: %w", err)
	}
	if o.maxSets < 1 {
		return nil, fmt.Errorf("--max-sets must be >= 1; got %d", o.maxSets)
	}
	l, rankNode, err := layout(o, s, nodes, order)
	if err != nil {
		return nil, err
	}
	domains, err := parseDomains(o.domains, nodes)
	if err != nil {
		return nil, err
	}
	if domains == nil && o.config != "" {
		// The site's labels, as the agents see them (a missing default
		// file is no error: then there are none).
		cfg, err := config.Load(o.config, !o.configGiven)
		if err != nil {
			return nil, fmt.Errorf("--config: %w", err)
		}
		if domains, err = cfg.Topology.DomainsOf(nodes); err != nil {
			return nil, err
		}
		if len(domains) == 0 {
			domains = nil
		} else {
			for _, n := range nodes { // a node without a label is a domain of its own
				if domains[n] == "" {
					domains[n] = n
				}
			}
		}
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
	state := md.StateNodes()
	for _, n := range nodes {
		if k := len(md.NodeRanks(n)); k > 0 {
			rep.RanksPerNode[n] = k
		} else {
			rep.Spares = append(rep.Spares, n)
		}
	}
	k := o.failures
	if k < 0 {
		k = rep.Tolerance + 1
	}
	k = min(k, len(state))
	rep.AllSurvive = -1
	for size := 1; size <= k; size++ {
		// Explaining a failing set costs a full plan: only as many as printed.
		keep := textFailing
		if o.json {
			keep = jsonFailing
		}
		fc, err := countFailures(md, state, size, o.maxSets, keep)
		if err != nil {
			return nil, err
		}
		rep.Failures = append(rep.Failures, fc)
		if rep.AllSurvive < 0 && fc.Survived < fc.Checked {
			rep.AllSurvive = size - 1
		}
	}
	if rep.AllSurvive < 0 {
		rep.AllSurvive = k
	}
	if domains != nil {
		byDomain := map[string][]string{}
		var labels []string
		for _, n := range nodes {
			d := domains[n]
			if _, ok := byDomain[d]; !ok {
				labels = append(labels, d)
			}
			byDomain[d] = append(byDomain[d], n)
		}
		for _, d := range labels {
			p, err := md.Plan(byDomain[d])
			if err != nil {
				return nil, err
			}
			rep.Domains = append(rep.Domains, domainResult{Domain: d, Nodes: byDomain[d], Survives: p.Survives, Reasons: p.Reasons})
		}
	}
	return rep, nil
}

// layout settles dp, pp, tp and the rank-to-node map from the flags, the
// spec's keys and the node list.
func layout(o options, s spec.Spec, nodes []string, order sg.Order) (sg.Layout, []string, error) {
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
	dp, err := pick("dp", o.dp, s.DP)
	if err != nil {
		return sg.Layout{}, nil, err
	}
	pp, err := pick("pp", o.pp, s.PP)
	if err != nil {
		return sg.Layout{}, nil, err
	}
	tp, err := pick("tp", o.tp, s.TP)
	if err != nil {
		return sg.Layout{}, nil, err
	}
	pp, tp = max(pp, 1), max(tp, 1)
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
	world := dp * pp * tp
	switch {
	case dp > 0 && world > sg.MaxWorld:
		return sg.Layout{}, nil, fmt.Errorf("dp*pp*tp = %d ranks is more than %d", world, sg.MaxWorld)
	case rankNode != nil && dp == 0:
		world = len(rankNode)
	case rankNode == nil && dp == 0 && o.rpn > 0:
		world = o.rpn * len(nodes)
	case rankNode == nil && dp == 0:
		return sg.Layout{}, nil, fmt.Errorf("give --dp (or dp= in --spec), or --ranks-per-node or --map so the rank count is known")
	}
	if dp == 0 {
		if world%(pp*tp) != 0 {
			return sg.Layout{}, nil, fmt.Errorf("%d ranks are not a multiple of pp*tp = %d; give --dp, or fix --pp/--tp", world, pp*tp)
		}
		dp = world / (pp * tp)
	}
	l := sg.Layout{DP: dp, PP: pp, TP: tp, Order: order}
	if err := l.Validate(); err != nil {
		return sg.Layout{}, nil, err
	}
	if rankNode != nil {
		if len(rankNode) != world {
			return sg.Layout{}, nil, fmt.Errorf("--map %s lists %d ranks but dp*pp*tp = %d; list every rank 0..%d once", o.mapFile, len(rankNode), world, world-1)
		}
		return l, rankNode, nil
	}
	rpn := o.rpn
	if rpn == 0 {
		if world%len(nodes) != 0 {
			return sg.Layout{}, nil, fmt.Errorf("%d ranks (dp*pp*tp) do not fill %d nodes evenly; give --ranks-per-node or --map", world, len(nodes))
		}
		rpn = world / len(nodes)
	}
	if rpn*len(nodes) < world {
		return sg.Layout{}, nil, fmt.Errorf("--ranks-per-node %d on %d nodes gives %d slots for %d ranks (dp*pp*tp); add nodes or raise --ranks-per-node", rpn, len(nodes), rpn*len(nodes), world)
	}
	rankNode = make([]string, world)
	for r := range rankNode {
		rankNode[r] = nodes[r/rpn]
	}
	return l, rankNode, nil
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
		fail := func(format string, a ...any) ([]string, error) {
			return nil, fmt.Errorf("--map %s line %d: %s", path, line, fmt.Sprintf(format, a...))
		}
		if len(fields) != 2 {
			return fail("%q: want RANK NODE, RANK: NODE or FIRST-LAST NODE", strings.TrimSpace(text))
		}
		ranks, node := strings.TrimSuffix(fields[0], ":"), fields[1]
		lo, hi, isRange := strings.Cut(ranks, "-")
		if !isRange {
			hi = lo
		}
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if err1 != nil || err2 != nil || a < 0 || b < a || b >= sg.MaxWorld {
			return fail("%q is not a rank or a rank range FIRST-LAST", ranks)
		}
		if !known[node] {
			return fail("node %s is not in --nodes; add it there or fix the map", node)
		}
		for r := a; r <= b; r++ {
			if prev, dup := byRank[r]; dup {
				return fail("rank %d is mapped twice (to %s and %s)", r, prev, node)
			}
			byRank[r] = node
			maxRank = max(maxRank, r)
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
	fc := failureCount{Nodes: k, Sets: total.String(), Exact: total.IsInt64() && total.Int64() <= int64(maxSets)}
	set := make([]string, k)
	check := func(idx []int) error {
		for i, j := range idx {
			set[i] = state[j]
		}
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
	idx := make([]int, k)
	if fc.Exact {
		for i := range idx {
			idx[i] = i
		}
		for {
			if err := check(idx); err != nil {
				return fc, err
			}
			// next combination in lexicographic order
			i := k - 1
			for i >= 0 && idx[i] == len(state)-k+i {
				i--
			}
			if i < 0 {
				break
			}
			idx[i]++
			for j := i + 1; j < k; j++ {
				idx[j] = idx[j-1] + 1
			}
		}
	} else {
		rng := rand.New(rand.NewSource(1))
		for n := 0; n < maxSets; n++ {
			// Floyd's algorithm: k distinct indices, uniformly.
			chosen := map[int]bool{}
			for j := len(state) - k; j < len(state); j++ {
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
			if err := check(idx); err != nil {
				return fc, err
			}
		}
	}
	if fc.Failing == nil {
		fc.Failing = []failingSet{}
	}
	return fc, nil
}

// sortByList orders names as they appear in list.
func sortByList(names, list []string) {
	pos := make(map[string]int, len(list))
	for i, n := range list {
		pos[n] = i
	}
	sort.Slice(names, func(i, j int) bool { return pos[names[i]] < pos[names[j]] })
}
