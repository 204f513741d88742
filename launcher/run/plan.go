package run

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Plan is where the step's ranks run. The step has len(Slots) nodes with
// TasksPerNode ranks each, in block order: rank r runs on Slots[r /
// TasksPerNode]. A lost node's slot goes to a spare, so every rank keeps
// its number and its place in the job's layout (its sharding group, its
// pipeline stage); only the replaced node's ranks move.
type Plan struct {
	Alloc        []string // the allocation's nodes, in Slurm's order
	Slots        []string // the step's nodes in rank order
	Excluded     []string // lost nodes, never used again in this allocation
	TasksPerNode int
}

// NewPlan holds the last spares nodes of the allocation back from the step.
func NewPlan(alloc []string, spares, tasksPerNode int) (Plan, error) {
	if len(alloc) == 0 {
		return Plan{}, fmt.Errorf("the allocation has no nodes")
	}
	if spares < 0 || spares >= len(alloc) {
		return Plan{}, fmt.Errorf("spares=%d leaves no node for the step in an allocation of %d node(s); "+
			"ask for more nodes (sbatch -N) or fewer spares (--reft=...,spares=N or --spares)", spares, len(alloc))
	}
	if tasksPerNode < 1 {
		return Plan{}, fmt.Errorf("tasks per node %d: want >= 1", tasksPerNode)
	}
	return Plan{Alloc: slices.Clone(alloc), Slots: slices.Clone(alloc[:len(alloc)-spares]), TasksPerNode: tasksPerNode}, nil
}

// Ranks is the step's task count.
func (p Plan) Ranks() int { return len(p.Slots) * p.TasksPerNode }

// NodeOf returns the node that runs rank r ("" when out of range).
func (p Plan) NodeOf(r int) string {
	if r < 0 || r >= p.Ranks() {
		return ""
	}
	return p.Slots[r/p.TasksPerNode]
}

// RanksOn lists the ranks a node runs.
func (p Plan) RanksOn(node string) []int {
	var out []int
	for i, n := range p.Slots {
		if n == node {
			for k := 0; k < p.TasksPerNode; k++ {
				out = append(out, i*p.TasksPerNode+k)
			}
		}
	}
	return out
}

// Spares lists the allocation's nodes that are neither in the step nor
// excluded, in allocation order.
func (p Plan) Spares() []string {
	var out []string
	for _, n := range p.Alloc {
		if !slices.Contains(p.Slots, n) && !slices.Contains(p.Excluded, n) {
			out = append(out, n)
		}
	}
	return out
}

// Replace excludes a lost node and gives its slot to the first spare. It
// returns the spare, or ok=false (and changes nothing) when none is left.
func (p *Plan) Replace(lost string) (spare string, ok bool) {
	i := slices.Index(p.Slots, lost)
	if i < 0 {
		if !slices.Contains(p.Excluded, lost) {
			p.Excluded = append(p.Excluded, lost) // a lost spare
		}
		return "", true
	}
	sp := p.Spares()
	if len(sp) == 0 {
		return "", false
	}
	p.Slots[i] = sp[0]
	p.Excluded = append(p.Excluded, lost)
	return sp[0], true
}

// Hostfile is the SLURM_HOSTFILE for -m arbitrary: one line per rank,
// naming its node.
func (p Plan) Hostfile() string {
	var b strings.Builder
	for r := 0; r < p.Ranks(); r++ {
		b.WriteString(p.NodeOf(r))
		b.WriteByte('\n')
	}
	return b.String()
}

// SrunArgs are the step's placement options. srun must find Hostfile() in
// the file named by SLURM_HOSTFILE. The layout is always stated rank by
// rank: inside an allocation whose nodes have unequal CPU counts, srun's
// block distribution fills the larger nodes first even with
// --ntasks-per-node (seen with Slurm 22.05), and a replacement node must
// take exactly the lost node's ranks.
func (p Plan) SrunArgs() []string {
	return []string{
		"--nodes=" + strconv.Itoa(len(p.Slots)),
		"--ntasks=" + strconv.Itoa(p.Ranks()),
		"--distribution=arbitrary",
	}
}
