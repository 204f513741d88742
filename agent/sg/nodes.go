package sg

import "fmt"

// nodeMap is a job's node geometry: the node list, which nodes host
// ranks and which ranks. The Model embeds it; it is built once by NewModel
// and immutable after, hence safe for concurrent use. Node indexes are
// positions in the node list, and every []bool failure mask over nodes is
// indexed by them.
type nodeMap struct {
	nodes      []string
	nodeIdx    map[string]int
	stateNodes []int   // indices of nodes that host ranks, in node-list order
	nodeRanks  [][]int // ranks per node index
}

// Nodes is the job's node list; StateNodes those that host ranks.
func (nm *nodeMap) Nodes() []string { return append([]string(nil), nm.nodes...) }

// StateNodes lists the nodes that host ranks, in node-list order; only
// their failures matter.
func (nm *nodeMap) StateNodes() []string {
	out := make([]string, len(nm.stateNodes))
	for i, n := range nm.stateNodes {
		out[i] = nm.nodes[n]
	}
	return out
}

// NodeRanks lists the ranks on node.
func (nm *nodeMap) NodeRanks(node string) []int {
	i, ok := nm.nodeIdx[node]
	if !ok {
		return nil
	}
	return append([]int(nil), nm.nodeRanks[i]...)
}

// dead turns failed node names into a mask, rejecting unknown names; it
// also returns the names in node-list order.
func (nm *nodeMap) dead(failed []string) ([]bool, []string, error) {
	d := make([]bool, len(nm.nodes))
	for _, n := range failed {
		i, ok := nm.nodeIdx[n]
		if !ok {
			return nil, nil, fmt.Errorf("failed node %q is not one of the job's nodes (%s)", n, compactNodes(nm.nodes))
		}
		d[i] = true
	}
	var names []string
	for i, x := range d {
		if x {
			names = append(names, nm.nodes[i])
		}
	}
	return d, names, nil
}
