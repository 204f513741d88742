package pmix

import (
	"fmt"

	"github.com/reft-hpc/reft/pmix/hostlist"
)

// ExpandTasksPerNode expands Slurm's compressed task counts, e.g.
// "2(x3),1" -> [2 2 2 1].
func ExpandTasksPerNode(s string) ([]int, error) {
	if s == "" {
		return nil, fmt.Errorf("no tasks-per-node value (SLURM_STEP_TASKS_PER_NODE)")
	}
	c, err := hostlist.ExpandCounts(s)
	if err != nil {
		return nil, fmt.Errorf("tasks per node: %w", err)
	}
	return c, nil
}
