package sg

import (
	"fmt"
	"sort"
	"strings"

	"github.com/reft-hpc/reft/spank/spec"
)

// Kind is a kind of registered buffer; kinds combine as a bit set.
type Kind uint8

// Buffer kinds.
const (
	// Replicated state is identical on the DP ranks of one (pp, tp):
	// vanilla-DP parameters and optimizer state, ZeRO-1 parameters. Each
	// SG member snapshots its 1/m shard; arc and aec protect it.
	Replicated Kind = 1 << iota
	// Optimizer is ZeRO-1 optimizer state: unique to each rank. aor keeps
	// a replica on the next SG member; without aor it is Sharded state.
	Optimizer
	// Sharded is any other per-rank state (RNG, data loader position,
	// activations kept across steps): copied to peer nodes by GEMINI
	// placement, as many copies as arc and aec together tolerate.
	Sharded
)

var kindNames = []struct {
	k    Kind
	name string
}{{Replicated, "replicated"}, {Optimizer, "optimizer"}, {Sharded, "sharded"}}

// String lists the kinds joined by ',' ("replicated,sharded").
func (k Kind) String() string {
	var s []string
	for _, kn := range kindNames {
		if k&kn.k != 0 {
			s = append(s, kn.name)
		}
	}
	return strings.Join(s, ",")
}

// MarshalText writes String, so JSON shows names.
func (k Kind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText is ParseKinds.
func (k *Kind) UnmarshalText(b []byte) error {
	v, err := ParseKinds(string(b))
	*k = v
	return err
}

// ValidKinds is quoted in errors.
const ValidKinds = "replicated, optimizer, sharded"

// ParseKinds reads a ','-separated list of kinds.
func ParseKinds(s string) (Kind, error) {
	var k Kind
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(strings.ToLower(p))
		found := false
		for _, kn := range kindNames {
			if p == kn.name {
				k |= kn.k
				found = true
			}
		}
		if !found {
			return 0, fmt.Errorf("unknown buffer kind %q; valid: %s, joined by ','", p, ValidKinds)
		}
	}
	return k, nil
}

// DefaultKinds is what a typical job registers: replicated parameters and
// some per-rank state, plus ZeRO-1 optimizer shards when the spec has aor
// (aor only makes sense with ZeRO-1).
func DefaultKinds(s spec.Spec) Kind {
	k := Replicated | Sharded
	if s.AOR {
		k |= Optimizer
	}
	return k
}

// Job is what the failure analysis needs to know about a job.
type Job struct {
	Spec     spec.Spec
	Layout   Layout
	Topology Topology
	// Kinds are the buffer kinds the job registers; 0 means DefaultKinds.
	Kinds Kind
	// Rings fixes the ring order of some groups (by Group.Name, the member
	// ranks in ring order) instead of the spread FormGroups computes: the
	// agent analyses generations with the ring they were saved with.
	Rings map[string][]int
}

// Protection says what protects one kind of buffer.
type Protection struct {
	Kind Kind `json:"kind"`
	// Modes are the spec's modes that protect this kind ("arc+aec", "aor",
	// "" for none).
	Modes string `json:"modes"`
	// Tolerance is how many failures are always survived: failed members
	// per SG for replicated state and AOR-protected optimizer shards,
	// failed nodes for state with peer copies.
	Tolerance int    `json:"tolerance"`
	Unit      string `json:"unit"` // "members per SG" or "nodes"
	Text      string `json:"text"`
}

// Model is a job compiled for failure analysis: its sharding groups, AEC
// layout and GEMINI placement. It is immutable and safe for concurrent use.
// It is made of the node geometry (nodeMap, embedded for its Nodes,
// StateNodes and NodeRanks), the redundancy inside each group (groupCode,
// which decides a group's shards from its failure mask alone) and the peer
// copies of per-rank state (holders); Plan and Survives join the three.
type Model struct {
	Job        Job
	Kinds      Kind // effective kinds (see NewModel)
	Groups     []Group
	Warnings   []Warning
	Placement  Placement // of sharded state (and optimizer state without aor)
	Protection []Protection

	nodeMap
	code       groupCode
	holders    [][]int // node index -> holder node indices
	groupNodes [][]int // per group: member node indices in ring order
	patterns   [][]int // distinct groupNodes
	tNet       int     // peer copies the spec asks for sharded state
	copies     int     // peer copies given (tNet, or fewer with few nodes)
}

// parity is the number of AEC parity pieces per stripe the spec asks for.
func parity(s spec.Spec) int {
	switch {
	case !s.AEC:
		return 0
	case s.AECParity > 0:
		return s.AECParity
	}
	return 1
}

// NewModel validates and compiles a job. With dp=1 no state is replicated,
// so Replicated counts as Sharded; aor then has no DP neighbour and is an
// error. A spec whose aec cannot fit the group size is an error; a node
// count too small for the peer copies of sharded state is a warning, and
// the copies are cut to the nodes there are.
func NewModel(j Job) (*Model, error) {
	if err := checkSpecLayout(j.Spec, j.Layout); err != nil {
		return nil, err
	}
	l, s := j.Layout, j.Spec
	idx, err := j.Topology.validate(l.World())
	if err != nil {
		return nil, err
	}
	md := &Model{Job: j, nodeMap: nodeMap{nodes: j.Topology.nodes(), nodeIdx: idx}}
	var m specModes
	if m, md.Kinds, err = modesOf(s, l.DP, j.Kinds); err != nil {
		return nil, err
	}
	md.code = groupCode{spec: s, dp: l.DP, arc: m.arc, aor: m.aor, k: m.k, whole: m.whole}
	if md.Kinds&Replicated != 0 && md.code.k > 0 {
		if md.code.ec, md.code.stripes, err = ecStripes(s, l.DP, md.code.k, md.code.arc); err != nil {
			return nil, err
		}
	}
	if md.Groups, md.Warnings, err = formRings(l, j.Topology, j.Rings); err != nil {
		return nil, err
	}
	md.groupNodes, md.patterns = groupPatterns(md.Groups, idx)
	var stateNames []string
	md.nodeRanks, md.stateNodes, stateNames = nodeRanks(j.Topology.RankNode, md.nodes, idx)
	md.tNet = md.code.k
	if md.code.arc {
		md.tNet++
	}
	md.copies = md.tNet
	if md.copies > len(stateNames)-1 {
		md.copies = len(stateNames) - 1
		if md.Kinds&md.placedKinds() != 0 {
			md.Warnings = append(md.Warnings, Warning{Kind: WarnFewNodes, Msg: fmt.Sprintf(
				"--reft=%s asks for %s of each rank's sharded state, but the ranks sit on %s, so only %d fit; use more nodes for the full protection",
				s, plural(md.tNet, "peer copy", "peer copies"), plural(len(stateNames), "node", "nodes"), md.copies)})
		}
	}
	if md.Placement, err = PlaceSpread(stateNames, j.Topology.Domain, md.copies+1); err != nil {
		return nil, fmt.Errorf("placement of sharded state: %w", err)
	}
	md.holders = holderIndexes(md.Placement.Holders, idx, len(md.nodes))
	md.Protection = md.protection()
	return md, nil
}

// specModes are the protection modes a spec turns on: arc, aor, the
// parity count k, and whole (aor alone: the state is kept whole).
type specModes struct {
	arc, aor, whole bool
	k               int
}

// modesOf reads the spec's modes, and the kinds of state they protect
// (kinds, or the spec's default): with dp=1 no state is replicated, so
// Replicated counts as Sharded, and aor has no DP neighbour.
func modesOf(s spec.Spec, dp int, kinds Kind) (specModes, Kind, error) {
	var m specModes
	if kinds == 0 {
		kinds = DefaultKinds(s)
	}
	if s.Enabled() {
		m.arc, m.aor, m.k = s.ARC, s.AOR, parity(s)
		m.whole = m.aor && !m.arc && m.k == 0
	}
	if dp != 1 {
		return m, kinds, nil
	}
	if m.aor {
		return m, kinds, fmt.Errorf("--reft=%s: aor keeps each rank's ZeRO-1 optimizer shard on the next rank of its DP group, and dp=1 leaves none; use dp >= 2 or drop aor", s)
	}
	if kinds&Replicated != 0 {
		kinds = kinds&^Replicated | Sharded
	}
	return m, kinds, nil
}

// checkSpecLayout: the dp, pp and tp the spec names (0: not named) are
// the layout's.
func checkSpecLayout(s spec.Spec, l Layout) error {
	if err := l.Validate(); err != nil {
		return err
	}
	for _, c := range []struct {
		name       string
		spec, have int
	}{{"dp", s.DP, l.DP}, {"pp", s.PP, l.PP}, {"tp", s.TP, l.TP}} {
		if c.spec > 0 && c.spec != c.have {
			return fmt.Errorf("--reft=%s says %s=%d but the layout has %s=%d; make them agree", s, c.name, c.spec, c.name, c.have)
		}
	}
	return nil
}

// ecStripes is the erasure code of a group of dp members with k parity
// units (and ARC), and its stripes.
func ecStripes(s spec.Spec, dp, k int, arc bool) (*EC, []Stripe, error) {
	ec, err := NewEC(dp, k, arc)
	if err != nil {
		return nil, nil, fmt.Errorf("--reft=%s with dp=%d: %w; raise dp or lower the parity count", s, dp, err)
	}
	var stripes []Stripe
	for a := 0; a < ec.M; a++ {
		stripes = append(stripes, ec.Stripe(a))
	}
	return &ec, stripes, nil
}

// formRings forms the sharding groups, each on the ring rings gives it
// (by name), if any.
func formRings(l Layout, t Topology, rings map[string][]int) ([]Group, []Warning, error) {
	groups, warns, err := FormGroups(l, t)
	if err != nil {
		return nil, nil, err
	}
	for i, g := range groups {
		if ring, ok := rings[g.Name()]; ok {
			if groups[i], err = g.Reorder(ring); err != nil {
				return nil, nil, err
			}
		}
	}
	return groups, warns, nil
}

// groupPatterns are each group's member nodes (indexes, ring order) and
// the distinct ones among them.
func groupPatterns(groups []Group, idx map[string]int) (groupNodes, patterns [][]int) {
	seen := map[string]bool{}
	for _, g := range groups {
		ns := make([]int, len(g.Members))
		for i, m := range g.Members {
			ns[i] = idx[m.Node]
		}
		groupNodes = append(groupNodes, ns)
		if key := fmt.Sprint(ns); !seen[key] {
			seen[key] = true
			patterns = append(patterns, ns)
		}
	}
	return groupNodes, patterns
}

// nodeRanks are the ranks of each node (by index), the nodes that host
// ranks (indexes and names, in node-list order).
func nodeRanks(rankNode, nodes []string, idx map[string]int) (ranks [][]int, state []int, stateNames []string) {
	ranks = make([][]int, len(nodes))
	for r, n := range rankNode {
		ranks[idx[n]] = append(ranks[idx[n]], r)
	}
	for i, rs := range ranks {
		if len(rs) > 0 {
			state = append(state, i)
			stateNames = append(stateNames, nodes[i])
		}
	}
	return ranks, state, stateNames
}

// holderIndexes is the placement's holders by node index.
func holderIndexes(holders map[string][]string, idx map[string]int, n int) [][]int {
	out := make([][]int, n)
	for x, hs := range holders {
		for _, h := range hs {
			out[idx[x]] = append(out[idx[x]], idx[h])
		}
	}
	return out
}

// placedKinds are the kinds protected by peer copies.
func (md *Model) placedKinds() Kind {
	k := Sharded
	if !md.code.aor {
		k |= Optimizer
	}
	return k
}

func plural(n int, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}

func (md *Model) protection() []Protection {
	var out []Protection
	m := md.Job.Layout.DP
	if md.Kinds&Replicated != 0 {
		p := Protection{Kind: Replicated, Modes: md.code.modes(), Unit: "members per SG"}
		p.Tolerance = md.code.tolerance()
		if md.code.whole {
			p.Modes = "aor"
		}
		ecPieces := 0
		if md.code.ec != nil {
			ecPieces = md.code.ec.DataPieces()
		}
		p.Text = replicatedText(m, md.code.whole, md.code.arc, md.code.k, ecPieces, md.code.modes(), p.Tolerance)
		out = append(out, p)
	}
	if md.Kinds&Optimizer != 0 && md.code.aor {
		out = append(out, Protection{Kind: Optimizer, Modes: "aor", Tolerance: 1, Unit: "members per SG",
			Text: "ZeRO-1 optimizer shards: the previous member of the SG (ring order) keeps an AOR replica, kept current from the gradients; survives any 1 failed member per SG (aor covers them, so they get no network copies)"})
	}
	for _, k := range []Kind{Optimizer, Sharded} {
		if md.Kinds&k == 0 || md.placedKinds()&k == 0 {
			continue
		}
		p := Protection{Kind: k, Unit: "nodes", Tolerance: md.copies}
		if md.tNet > 0 {
			p.Modes = md.code.modes()
		}
		p.Text = placedText(k, m, md.copies, md.tNet, md.Placement.Strategy)
		out = append(out, p)
	}
	return out
}

// replicatedText says how replicated state of a group of m members is
// protected: whole or sharded, the ARC copy, the parity (ecPieces 0:
// none), and the tolerance.
func replicatedText(m int, whole, arc bool, k, ecPieces int, modes string, tolerance int) string {
	var parts []string
	if whole {
		parts = append(parts, fmt.Sprintf("aor without arc or aec: each of the %d members of an SG keeps the whole slice (it is not sharded)", m))
	} else {
		parts = append(parts, fmt.Sprintf("each of the %d members of an SG keeps its 1/%d shard of the slice", m, m))
	}
	if arc {
		parts = append(parts, "arc: and the next member's shard (ARC copy)")
	}
	if ecPieces > 0 {
		kind := "rotated XOR parity"
		if k > 1 {
			kind = fmt.Sprintf("Reed-Solomon parity (%d pieces per stripe)", k)
		}
		parts = append(parts, fmt.Sprintf("%s: and %s (each parity piece 1/%d of a shard)", strings.TrimPrefix(modes, "arc+"), kind, ecPieces))
	}
	if tolerance == 0 {
		parts = append(parts, "nothing else (arc or aec protect replicated state): a failed member's shard comes from the persistent tier")
	} else {
		parts = append(parts, fmt.Sprintf("survives any %s per SG", plural(tolerance, "failed member", "failed members")))
	}
	return strings.Join(parts, "; ")
}

// placedText says how state of kind k placed on other nodes is protected:
// copies peer copies of the tNet the spec asks for, by strategy.
func placedText(k Kind, dp, copies, tNet int, strategy string) string {
	what := "per-rank state"
	if dp == 1 {
		what = "per-rank state (dp=1: nothing is replicated, so each rank's slice is too)"
	}
	if k == Optimizer {
		what = "ZeRO-1 optimizer shards (no aor: per-rank state)"
	}
	switch {
	case copies == 0 && tNet == 0:
		return what + ": no peer copies (only arc and aec add them): a failed node's state comes from the persistent tier"
	case copies == 0:
		return what + ": no peer copies fit on a single node"
	}
	return fmt.Sprintf("%s: %s on other nodes, over the network, by GEMINI %s placement; survives any %s",
		what, plural(copies, "peer copy", "peer copies"), strategy, plural(copies, "failed node", "failed nodes"))
}

// Tolerance is the number of failed nodes the job always survives, whatever
// nodes they are: the weakest kind's guarantee, with members that share a
// node counted together. Explain's enumeration may find that more survive.
func (md *Model) Tolerance() int {
	best := len(md.stateNodes)
	for _, p := range md.Protection {
		var t int
		switch p.Unit {
		case "nodes":
			t = p.Tolerance
		default:
			t = md.nodeTolerance(p.Tolerance)
		}
		best = min(best, t)
	}
	return best
}

// nodeTolerance turns "t failed members per SG" into failed nodes: the most
// nodes that can fail while no SG loses more than t members.
func (md *Model) nodeTolerance(t int) int {
	best := len(md.stateNodes)
	for _, ns := range md.patterns {
		count := map[int]int{}
		for _, n := range ns {
			count[n]++
		}
		c := make([]int, 0, len(count))
		for _, v := range count {
			c = append(c, v)
		}
		sort.Sort(sort.Reverse(sort.IntSlice(c)))
		k, sum := 0, 0
		for k < len(c) && sum+c[k] <= t {
			sum += c[k]
			k++
		}
		if k == len(c) {
			continue // the group's nodes all failing is within t: no limit
		}
		best = min(best, k)
	}
	return best
}

// EC is the AEC layout of the replicated state, or nil without aec.
func (md *Model) EC() *EC { return md.code.ec }
