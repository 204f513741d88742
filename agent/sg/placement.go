package sg

import "fmt"

// Placement is GEMINI's mixed placement (GEMINI section 4, Algorithm 1) of
// per-rank sharded state: each node keeps its ranks' sharded buffers itself
// and sends copies to Replicas-1 peer nodes.
type Placement struct {
	// Replicas is m: the local copy plus m-1 peer copies.
	Replicas int `json:"replicas"`
	// Strategy is "group" when m divides the node count, "mixed" when it
	// does not, "none" when m is 1 (no peer copies).
	Strategy string `json:"strategy"`
	// Groups are the placement groups of m nodes; every member holds a copy
	// of every other member's state.
	Groups [][]string `json:"groups"`
	// Ring holds the last N - m(floor(N/m)-1) nodes under "mixed": each
	// sends its copies to the next m-1 nodes of the ring.
	Ring []string `json:"ring,omitempty"`
	// Holders maps a node to the nodes that keep copies of its sharded
	// state, nearest first.
	Holders map[string][]string `json:"holders"`
}

// Place computes GEMINI's placement of m replicas over nodes, in the given
// order: consecutive nodes form the groups, so order them across failure
// domains first (PlaceSpread does). With N nodes:
//
//   - m divides N: N/m groups of m ("group");
//   - otherwise floor(N/m)-1 groups, and the remaining N-m(floor(N/m)-1)
//     nodes, between m+1 and 2m-1 of them, form a ring in which node i
//     sends to nodes i+1..i+m-1 ("mixed"). Algorithm 1 writes these as one
//     oversized last group; the text and Figure 3c make it a ring.
//
// Either way every node's state has m replicas on distinct nodes, so any
// m-1 node failures leave a replica of everything.
func Place(nodes []string, m int) (Placement, error) {
	n := len(nodes)
	switch {
	case m < 1:
		return Placement{}, fmt.Errorf("placement needs at least 1 replica; got %d", m)
	case n == 0:
		return Placement{}, fmt.Errorf("placement needs at least one node")
	case m > n:
		return Placement{}, fmt.Errorf("%d replicas need %d distinct nodes; there are %d", m, m, n)
	}
	seen := map[string]bool{}
	for _, x := range nodes {
		if seen[x] {
			return Placement{}, fmt.Errorf("node %s appears twice", x)
		}
		seen[x] = true
	}
	p := Placement{Replicas: m, Holders: make(map[string][]string, n)}
	if m == 1 {
		p.Strategy = "none"
		for _, x := range nodes {
			p.Holders[x] = []string{}
			p.Groups = append(p.Groups, []string{x})
		}
		return p, nil
	}
	g := n / m
	p.Strategy = "group"
	if n%m != 0 {
		p.Strategy = "mixed"
		g--
	}
	for i := 0; i < g; i++ {
		grp := nodes[i*m : (i+1)*m]
		p.Groups = append(p.Groups, grp)
		for j, x := range grp {
			for k := 1; k < m; k++ {
				p.Holders[x] = append(p.Holders[x], grp[(j+k)%m])
			}
		}
	}
	if p.Strategy == "mixed" {
		p.Ring = nodes[g*m:]
		for j, x := range p.Ring {
			for k := 1; k < m; k++ {
				p.Holders[x] = append(p.Holders[x], p.Ring[(j+k)%len(p.Ring)])
			}
		}
	}
	return p, nil
}

// PlaceSpread orders nodes across failure domains (as sharding groups are
// ordered; domain maps node to domain, a node without one being its own)
// and then calls Place, so that a placement group spans as many domains as
// the counts allow. Without domains the order is unchanged.
func PlaceSpread(nodes []string, domain map[string]string, m int) (Placement, error) {
	items := make([]item, len(nodes))
	for i, x := range nodes {
		d := domain[x]
		if d == "" {
			d = x
		}
		items[i] = item{domain: d, node: x}
	}
	order := make([]string, len(nodes))
	for i, j := range spread(items) {
		order[i] = nodes[j]
	}
	return Place(order, m)
}
