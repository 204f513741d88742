package sg

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Topology is where the ranks run.
type Topology struct {
	// RankNode[r] is the node of rank r; its length is the world size.
	RankNode []string
	// Nodes is the job's node list in allocation order (Slurm's
	// SLURM_JOB_NODELIST order). Nodes without ranks are spares. Nil means
	// the distinct nodes of RankNode in order of first appearance.
	Nodes []string
	// Domain maps a node to its failure domain (rack, switch, PDU): nodes
	// that can fail together. A node without an entry, or with "", is a
	// domain of its own. Entries for other nodes are ignored.
	Domain map[string]string
}

// nodes returns the effective node list.
func (t Topology) nodes() []string {
	if t.Nodes != nil {
		return t.Nodes
	}
	seen := map[string]bool{}
	var out []string
	for _, n := range t.RankNode {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out
}

// domain is node's failure domain label.
func (t Topology) domain(node string) string {
	if d := t.Domain[node]; d != "" {
		return d
	}
	return node
}

// validate checks the topology against a world size and returns the index
// of every node.
func (t Topology) validate(world int) (map[string]int, error) {
	if len(t.RankNode) != world {
		return nil, fmt.Errorf("rank-to-node map has %d ranks but the layout has %d (dp*pp*tp)", len(t.RankNode), world)
	}
	idx := map[string]int{}
	for i, n := range t.nodes() {
		if n == "" {
			return nil, fmt.Errorf("node list entry %d is empty", i)
		}
		if _, dup := idx[n]; dup {
			return nil, fmt.Errorf("node %s appears twice in the node list", n)
		}
		idx[n] = i
	}
	for r, n := range t.RankNode {
		if n == "" {
			return nil, fmt.Errorf("rank %d has no node", r)
		}
		if _, ok := idx[n]; !ok {
			return nil, fmt.Errorf("rank %d runs on node %s, which is not in the node list", r, n)
		}
	}
	return idx, nil
}

// Member is one rank of a sharding group.
type Member struct {
	Rank   int    `json:"rank"`
	DP     int    `json:"dp"`
	Node   string `json:"node"`
	Domain string `json:"domain"`
}

// Group is one sharding group (REFT 4.1): the DP ranks that hold the same
// (pp, tp) slice of replicated state. Members are in ring order: Members[i]
// is ring position i and owns shard i of the slice (ShardRange(w, m, i));
// its predecessor, Members[(i-1+m)%m], keeps its ARC copy and AOR replica
// (member j keeps shard j+1, as in agent/erasure).
type Group struct {
	PP      int      `json:"pp"`
	TP      int      `json:"tp"`
	Members []Member `json:"members"`
}

// Name is "(pp=P,tp=T)".
func (g Group) Name() string { return fmt.Sprintf("(pp=%d,tp=%d)", g.PP, g.TP) }

func (g Group) String() string { return "SG " + g.Name() }

// Ranks lists the members' ranks in ring order.
func (g Group) Ranks() []int {
	out := make([]int, len(g.Members))
	for i, m := range g.Members {
		out[i] = m.Rank
	}
	return out
}

// Position returns the ring position of rank r, or -1.
func (g Group) Position(r int) int {
	for i, m := range g.Members {
		if m.Rank == r {
			return i
		}
	}
	return -1
}

// Holder is the ring position that keeps position i's ARC copy and AOR
// replica: the one before it.
func (g Group) Holder(i int) int { return pred(i, len(g.Members)) }

// Warning is a placement problem worth one log line per job.
type Warning struct {
	Kind  string `json:"kind"`            // WarnSharedNode or WarnFewNodes
	Group string `json:"group,omitempty"` // "(pp=0,tp=0)" for group warnings
	Node  string `json:"node,omitempty"`
	Ranks []int  `json:"ranks,omitempty"`
	Msg   string `json:"message"`
}

// Warning kinds.
const (
	// WarnSharedNode: members of one SG share a node, so one node failure
	// takes several of them.
	WarnSharedNode = "shared-node"
	// WarnFewNodes: too few nodes for the peer copies the spec asks for.
	WarnFewNodes = "few-nodes"
)

func (w Warning) String() string { return w.Msg }

// FormGroups builds the sharding groups of a layout: one per (pp, tp), its
// members the DP ranks, in ring order spread across failure domains (see
// spread). It warns, once per group and node, about members that share a
// node. Groups come sorted by pp, then tp.
func FormGroups(l Layout, t Topology) ([]Group, []Warning, error) {
	if err := l.Validate(); err != nil {
		return nil, nil, err
	}
	if _, err := t.validate(l.World()); err != nil {
		return nil, nil, err
	}
	var groups []Group
	var warns []Warning
	for pp := 0; pp < l.PP; pp++ {
		for tp := 0; tp < l.TP; tp++ {
			nodes := make([]string, l.DP)
			for dp := range nodes {
				nodes[dp] = t.RankNode[l.Rank(Coord{DP: dp, PP: pp, TP: tp})]
			}
			g, w := formGroup(l, pp, tp, nodes, t)
			groups = append(groups, g)
			warns = append(warns, w...)
		}
	}
	return groups, warns, nil
}

// FormGroup builds one sharding group, (pp, tp), as FormGroups would,
// from its members' nodes alone: nodes[dp] is the node of the member with
// DP index dp. An agent knows where its own group's members run, not the
// whole job's map.
func FormGroup(l Layout, pp, tp int, nodes []string, domain map[string]string) (Group, []Warning, error) {
	if err := l.Validate(); err != nil {
		return Group{}, nil, err
	}
	if pp < 0 || pp >= l.PP || tp < 0 || tp >= l.TP {
		return Group{}, nil, fmt.Errorf("group (pp=%d,tp=%d) is outside the layout's pp=%d tp=%d", pp, tp, l.PP, l.TP)
	}
	if len(nodes) != l.DP {
		return Group{}, nil, fmt.Errorf("group (pp=%d,tp=%d): %d member nodes given for dp=%d", pp, tp, len(nodes), l.DP)
	}
	for dp, n := range nodes {
		if n == "" {
			return Group{}, nil, fmt.Errorf("group (pp=%d,tp=%d): rank %d has no node", pp, tp, l.Rank(Coord{DP: dp, PP: pp, TP: tp}))
		}
	}
	g, w := formGroup(l, pp, tp, nodes, Topology{Domain: domain})
	return g, w, nil
}

// formGroup orders group (pp, tp)'s members, on nodes[dp], into a ring
// spread across t's failure domains, and warns about shared nodes.
func formGroup(l Layout, pp, tp int, nodes []string, t Topology) (Group, []Warning) {
	g := Group{PP: pp, TP: tp}
	natural := make([]Member, l.DP)
	items := make([]item, l.DP)
	for dp := 0; dp < l.DP; dp++ {
		n := nodes[dp]
		natural[dp] = Member{Rank: l.Rank(Coord{DP: dp, PP: pp, TP: tp}), DP: dp, Node: n, Domain: t.domain(n)}
		items[dp] = item{domain: natural[dp].Domain, node: n}
	}
	for _, i := range spread(items) {
		g.Members = append(g.Members, natural[i])
	}
	return g, sharedNodes(g, natural)
}

// Reorder puts g's members in the ring order ring (member ranks), which
// must be a permutation of them: a ring recorded with a generation.
func (g Group) Reorder(ring []int) (Group, error) {
	if len(ring) != len(g.Members) {
		return g, fmt.Errorf("%s: ring %v has %d ranks, the group %d", g, ring, len(ring), len(g.Members))
	}
	out := Group{PP: g.PP, TP: g.TP, Members: make([]Member, len(ring))}
	used := make([]bool, len(ring))
	for i, r := range ring {
		j := g.Position(r)
		if j < 0 || used[j] {
			return g, fmt.Errorf("%s: ring %v is not an order of its members %v", g, ring, g.Ranks())
		}
		used[j] = true
		out.Members[i] = g.Members[j]
	}
	return out, nil
}

// sharedNodes warns about each node that hosts several members of g.
func sharedNodes(g Group, natural []Member) []Warning {
	byNode := map[string][]int{}
	var order []string
	for _, m := range natural {
		if _, ok := byNode[m.Node]; !ok {
			order = append(order, m.Node)
		}
		byNode[m.Node] = append(byNode[m.Node], m.Rank)
	}
	var out []Warning
	for _, n := range order {
		ranks := byNode[n]
		if len(ranks) < 2 {
			continue
		}
		out = append(out, Warning{
			Kind: WarnSharedNode, Group: g.Name(), Node: n, Ranks: ranks,
			Msg: fmt.Sprintf("%s: ranks %s share node %s, so losing %s loses %d of the group's %d members at once; "+
				"place a sharding group's DP ranks on different nodes (with order tp-dp-pp, run tp ranks per node)",
				g, joinInts(ranks), n, n, len(ranks), len(natural)),
		})
	}
	return out
}

// joinInts writes 1 and 2, or 1, 2 and 3.
func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return joinAnd(s)
}

func joinAnd(s []string) string {
	switch len(s) {
	case 0:
		return ""
	case 1:
		return s[0]
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
