// Package pmix discovers a rank's place in the job: its rank, the world size,
// its local rank, its node and the node of every rank. Under `srun --mpi=pmix`
// it asks the PMIx server in slurmstepd (libpmix, cgo); otherwise it falls back
// to the SLURM_* variables that every Slurm task gets.
package pmix

import (
	"errors"
	"fmt"
	"github.com/reft-hpc/reft/pmix/hostlist"
	"os"
	"strconv"
)

// Topology is where this process sits in the job.
type Topology struct {
	Rank      int      // global rank, 0..Size-1
	Size      int      // number of ranks in the job step
	LocalRank int      // rank among this step's ranks on this node
	NodeID    int      // index of this rank's node in the step's node list
	Nodes     []string // Nodes[r] is the hostname of rank r's node
	Source    string   // "pmix" or "slurm"
}

// Node returns the hostname of this rank's node.
func (t Topology) Node() string { return t.Nodes[t.Rank] }

// ErrUnavailable means no PMIx server is reachable (not launched by srun
// --mpi=pmix, or built without cgo).
var ErrUnavailable = errors.New("pmix: no PMIx server for this process")

// Discover asks PMIx first and falls back to the Slurm variables when PMIx is
// unavailable. It fails when neither source describes the process.
func Discover() (Topology, error) {
	if os.Getenv("PMIX_NAMESPACE") != "" {
		t, err := FromPMIx()
		if err == nil {
			return t, nil
		}
		if !errors.Is(err, ErrUnavailable) {
			return Topology{}, err
		}
	}
	return FromSlurm(os.Getenv)
}

// FromSlurm builds the topology from SLURM_* variables, read through getenv.
// The node of every rank follows the step's task layout
// (SLURM_STEP_TASKS_PER_NODE, SLURM_STEP_NODELIST) and SLURM_DISTRIBUTION
// (block, the default, or cyclic).
func FromSlurm(getenv func(string) string) (Topology, error) {
	num := func(key string) (int, error) {
		v := getenv(key)
		if v == "" {
			return 0, fmt.Errorf("pmix: %s is not set: not a Slurm task (launch with srun)", key)
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("pmix: %s=%q is not a non-negative integer", key, v)
		}
		return n, nil
	}
	var t Topology
	var err error
	if t.Rank, err = num("SLURM_PROCID"); err != nil {
		return Topology{}, err
	}
	if t.Size, err = num("SLURM_NTASKS"); err != nil {
		return Topology{}, err
	}
	if t.LocalRank, err = num("SLURM_LOCALID"); err != nil {
		return Topology{}, err
	}
	if t.NodeID, err = num("SLURM_NODEID"); err != nil {
		return Topology{}, err
	}
	if t.Rank >= t.Size {
		return Topology{}, fmt.Errorf("pmix: SLURM_PROCID=%d is not below SLURM_NTASKS=%d", t.Rank, t.Size)
	}
	nodelist := firstSet(getenv, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
	hosts, err := hostlist.Expand(nodelist)
	if err != nil {
		return Topology{}, fmt.Errorf("pmix: node list %q: %w", nodelist, err)
	}
	perNode, err := ExpandTasksPerNode(firstSet(getenv, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"))
	if err != nil {
		return Topology{}, fmt.Errorf("pmix: tasks per node: %w", err)
	}
	if len(perNode) != len(hosts) {
		return Topology{}, fmt.Errorf("pmix: %d nodes in the node list but tasks given for %d", len(hosts), len(perNode))
	}
	t.Nodes, err = layout(hosts, perNode, t.Size, getenv("SLURM_DISTRIBUTION"))
	if err != nil {
		return Topology{}, err
	}
	if t.NodeID >= len(hosts) || t.Nodes[t.Rank] != hosts[t.NodeID] {
		return Topology{}, fmt.Errorf("pmix: rank %d is on node %d by SLURM_NODEID but the task layout puts it on %s; set SLURM_DISTRIBUTION or launch with --mpi=pmix", t.Rank, t.NodeID, t.Nodes[t.Rank])
	}
	t.Source = "slurm"
	return t, nil
}

func firstSet(getenv func(string) string, keys ...string) string {
	for _, k := range keys {
		if v := getenv(k); v != "" {
			return v
		}
	}
	return ""
}

// layout assigns ranks to hosts: block fills each node in turn; cyclic deals
// ranks round-robin over nodes that still have room.
func layout(hosts []string, perNode []int, size int, dist string) ([]string, error) {
	total := 0
	for _, n := range perNode {
		total += n
	}
	if total != size {
		return nil, fmt.Errorf("pmix: tasks per node add up to %d, not SLURM_NTASKS=%d", total, size)
	}
	nodes := make([]string, 0, size)
	switch mode := firstField(dist); mode {
	case "", "block", "plane":
		for i, h := range hosts {
			for j := 0; j < perNode[i]; j++ {
				nodes = append(nodes, h)
			}
		}
	case "cyclic":
		left := append([]int(nil), perNode...)
		for len(nodes) < size {
			for i, h := range hosts {
				if left[i] > 0 {
					nodes = append(nodes, h)
					left[i]--
				}
			}
		}
	default:
		return nil, fmt.Errorf("pmix: SLURM_DISTRIBUTION=%q is not supported without PMIx; use block or cyclic, or launch with --mpi=pmix", dist)
	}
	return nodes, nil
}

// firstField returns the node-level part of a distribution ("cyclic:block" -> "cyclic").
func firstField(dist string) string {
	for i, c := range dist {
		if c == ':' || c == ',' {
			return dist[:i]
		}
	}
	return dist
}
