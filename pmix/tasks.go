package pmix

import (
	"fmt"
	"strconv"
	"strings"
)

// ExpandTasksPerNode expands Slurm's compressed task counts, e.g.
// "2(x3),1" -> [2 2 2 1].
func ExpandTasksPerNode(s string) ([]int, error) {
	if s == "" {
		return nil, fmt.Errorf("no tasks-per-node value (SLURM_STEP_TASKS_PER_NODE)")
	}
	var out []int
	for _, item := range strings.Split(s, ",") {
		count, rep := item, "1"
		if i := strings.Index(item, "(x"); i >= 0 && strings.HasSuffix(item, ")") {
			count, rep = item[:i], item[i+2:len(item)-1]
		}
		c, err1 := strconv.Atoi(count)
		r, err2 := strconv.Atoi(rep)
		if err1 != nil || err2 != nil || c < 0 || r < 1 || r > 1<<20 {
			return nil, fmt.Errorf("bad tasks-per-node item %q in %q", item, s)
		}
		for j := 0; j < r; j++ {
			out = append(out, c)
		}
	}
	return out, nil
}
