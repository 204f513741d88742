package hostlist

import (
	"fmt"
	"strconv"
	"strings"
)

// ExpandCounts expands Slurm's compressed per-node counts, the form of
// SLURM_TASKS_PER_NODE and SLURM_JOB_CPUS_PER_NODE: "2(x3),1" is
// [2 2 2 1]. Like Expand, it yields at most MaxHosts counts.
func ExpandCounts(s string) ([]int, error) {
	if s == "" {
		return nil, fmt.Errorf("empty count list")
	}
	var out []int
	for _, item := range strings.Split(s, ",") {
		count, rep := item, "1"
		if i := strings.Index(item, "(x"); i >= 0 && strings.HasSuffix(item, ")") {
			count, rep = item[:i], item[i+2:len(item)-1]
		}
		c, err1 := strconv.Atoi(count)
		r, err2 := strconv.Atoi(rep)
		if err1 != nil || err2 != nil || c < 0 || r < 1 {
			return nil, fmt.Errorf("bad count item %q in %q (want N or N(xR), R >= 1)", item, s)
		}
		if r > MaxHosts-len(out) {
			return nil, fmt.Errorf("count list %.40q counts more than %d nodes", s, MaxHosts)
		}
		for range r {
			out = append(out, c)
		}
	}
	return out, nil
}

// CompressCounts is ExpandCounts' inverse, in Slurm's form.
func CompressCounts(c []int) string {
	var parts []string
	for i := 0; i < len(c); {
		j := i
		for j < len(c) && c[j] == c[i] {
			j++
		}
		if j-i > 1 {
			parts = append(parts, fmt.Sprintf("%d(x%d)", c[i], j-i))
		} else {
			parts = append(parts, strconv.Itoa(c[i]))
		}
		i = j
	}
	return strings.Join(parts, ",")
}
