package sg

import (
	"fmt"
	"slices"
	"testing"
)

// partitions calls f with every assignment of n items to domains, up to
// renaming domains (restricted growth strings: Bell(n) of them).
func partitions(n int, f func(label []int)) {
	label := make([]int, n)
	var rec func(i, maxLabel int)
	rec = func(i, maxLabel int) {
		if i == n {
			f(label)
			return
		}
		for l := 0; l <= maxLabel+1; l++ {
			label[i] = l
			rec(i+1, max(maxLabel, l))
		}
	}
	if n > 0 {
		label[0] = 0
		rec(1, 0)
	}
}

func sameDomainPairs(ring []int, label []int) int {
	n := 0
	for i := range ring {
		if label[ring[i]] == label[ring[(i+1)%len(ring)]] {
			n++
		}
	}
	return n
}

// TestSpreadOptimal: for every assignment of up to 9 items to domains, the
// ring is a permutation with the fewest same-domain neighbour pairs a ring
// allows, max(0, 2a-m), keeps each domain's items in natural order, and is
// the identity when every item is its own domain.
func TestSpreadOptimal(t *testing.T) {
	for m := 1; m <= 9; m++ {
		partitions(m, func(label []int) {
			items := make([]item, m)
			count := map[int]int{}
			for i, l := range label {
				items[i] = item{domain: fmt.Sprint("d", l), node: fmt.Sprint("x", i)}
				count[l]++
			}
			ring := spread(items)
			sorted := slices.Clone(ring)
			slices.Sort(sorted)
			for i, v := range sorted {
				if v != i {
					t.Fatalf("labels %v: ring %v is not a permutation", label, ring)
				}
			}
			a := 0
			for _, c := range count {
				a = max(a, c)
			}
			if m > 1 {
				if got, want := sameDomainPairs(ring, label), max(0, 2*a-m); got != want {
					t.Fatalf("labels %v: ring %v has %d same-domain neighbour pairs, want %d", label, ring, got, want)
				}
			}
			last := map[int]int{}
			for _, i := range ring {
				if prev, ok := last[label[i]]; ok && prev > i {
					t.Fatalf("labels %v: ring %v reorders domain %d", label, ring, label[i])
				}
				last[label[i]] = i
			}
			if len(count) == m {
				for i, v := range ring {
					if v != i {
						t.Fatalf("all distinct: ring %v, want identity", ring)
					}
				}
			}
		})
	}
}

func TestSpreadExamples(t *testing.T) {
	tests := []struct {
		domains string // one letter per item
		nodes   string // one letter per item; "" = each its own node
		want    []int
	}{
		{"AABB", "", []int{0, 2, 1, 3}},         // redset round-robin
		{"AAABBB", "", []int{0, 3, 1, 4, 2, 5}}, // balanced
		{"ABCABC", "", []int{0, 1, 2, 3, 4, 5}}, // already spread
		{"AAABBC", "", []int{0, 3, 1, 4, 2, 5}}, // A B A B A C
		{"AAAAB", "", []int{0, 4, 1, 2, 3}},     // a > m/2: 2a-m = 3 pairs
		{"AAAA", "xxyy", []int{0, 2, 1, 3}},     // inside a domain, across nodes
		{"AAAABBBB", "xxyyzzww", []int{0, 4, 2, 6, 1, 5, 3, 7}},
	}
	for _, tt := range tests {
		items := make([]item, len(tt.domains))
		for i := range items {
			items[i].domain = tt.domains[i : i+1]
			items[i].node = fmt.Sprint(i)
			if tt.nodes != "" {
				items[i].node = tt.nodes[i : i+1]
			}
		}
		if got := spread(items); !slices.Equal(got, tt.want) {
			t.Errorf("spread(%s/%s) = %v, want %v", tt.domains, tt.nodes, got, tt.want)
		}
	}
}
