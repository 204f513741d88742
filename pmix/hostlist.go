package pmix

import (
	"fmt"
	"strconv"
	"strings"
)

// ExpandHostlist expands a Slurm hostlist such as "n[1-3,7],gpu01" into its
// hosts, in order. Zero padding in ranges is kept ("n[01-03]").
func ExpandHostlist(list string) ([]string, error) {
	if strings.TrimSpace(list) == "" {
		return nil, fmt.Errorf("empty host list")
	}
	var hosts []string
	for _, item := range splitTop(list) {
		open := strings.IndexByte(item, '[')
		if open < 0 {
			if strings.ContainsAny(item, "]") || item == "" {
				return nil, fmt.Errorf("bad host %q", item)
			}
			hosts = append(hosts, item)
			continue
		}
		close := strings.IndexByte(item, ']')
		if close < open {
			return nil, fmt.Errorf("unbalanced brackets in %q", item)
		}
		prefix, ranges, suffix := item[:open], item[open+1:close], item[close+1:]
		if strings.ContainsAny(suffix, "[]") {
			return nil, fmt.Errorf("more than one bracket group in %q is not supported", item)
		}
		for _, r := range strings.Split(ranges, ",") {
			lo, hi, found := strings.Cut(r, "-")
			if !found {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 != nil || err2 != nil || a > b || a < 0 {
				return nil, fmt.Errorf("bad range %q in %q", r, item)
			}
			if b-a > 1<<20 {
				return nil, fmt.Errorf("range %q in %q is too large", r, item)
			}
			width := len(lo)
			for n := a; n <= b; n++ {
				hosts = append(hosts, fmt.Sprintf("%s%0*d%s", prefix, width, n, suffix))
			}
		}
	}
	return hosts, nil
}

// splitTop splits on commas outside brackets.
func splitTop(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, c := range s {
		switch c {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	return append(out, s[start:])
}

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
