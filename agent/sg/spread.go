package sg

// item is one thing to place on a ring (an SG member, or a node for GEMINI
// placement): its failure domain and, inside the domain, its node.
type item struct {
	domain string
	node   string
}

// spread orders items on a ring so that ring neighbours sit in different
// failure domains wherever the counts allow it, and returns the ring as
// indices into items (given in their natural order: dp index, or node list
// order). The algorithm, after SCR's redset:
//
//  1. Group the items by domain; a domain's items keep their natural order,
//     except that items sharing a node are dealt round-robin across the
//     domain's nodes (redset's "split across": the i-th item of every node
//     before any (i+1)-th), so that same-node items come apart too.
//  2. Build the ring one item at a time: take the next item of the domain
//     with the most items left, never the domain just taken while another
//     is left. Ties go to the domain of the ring's first item (using it up
//     early keeps the last item off the first one's domain across the
//     ring's wrap), then to the domain whose first item comes first in
//     natural order.
//
// Redset splits "across" failure groups and notes it only works for
// balanced groups; step 2 is the unbalanced case done right. Properties
// (tested exhaustively for small groups):
//   - with every item its own domain (no domains given, no shared nodes) the
//     ring is the natural order, and equal-size domains give redset's
//     round-robin;
//   - with a = the largest domain's item count and m items, the number of
//     ring-neighbour pairs in one domain is max(0, 2a-m), the least any
//     ring allows: none while a <= m/2.
func spread(items []item) []int {
	var doms []*dom
	byName := map[string]*dom{}
	nodeQueues := map[string]map[string][]int{} // domain -> node -> items
	nodeOrder := map[string][]string{}
	for i, it := range items {
		d := byName[it.domain]
		if d == nil {
			d = &dom{name: it.domain}
			byName[it.domain] = d
			doms = append(doms, d)
			nodeQueues[it.domain] = map[string][]int{}
		}
		q := nodeQueues[it.domain]
		if _, ok := q[it.node]; !ok {
			nodeOrder[it.domain] = append(nodeOrder[it.domain], it.node)
		}
		q[it.node] = append(q[it.node], i)
	}
	for _, d := range doms {
		q := nodeQueues[d.name]
		for round := 0; ; round++ {
			took := false
			for _, n := range nodeOrder[d.name] {
				if round < len(q[n]) {
					d.queue = append(d.queue, q[n][round])
					took = true
				}
			}
			if !took {
				break
			}
		}
	}

	ring := make([]int, 0, len(items))
	var prev, head *dom
	for len(ring) < len(items) {
		var best *dom
		for _, d := range doms {
			left := len(d.queue) - d.next
			if left == 0 {
				continue
			}
			if best == nil || d.better(best, left, len(best.queue)-best.next, prev, head) {
				best = d
			}
		}
		if head == nil {
			head = best
		}
		ring = append(ring, best.queue[best.next])
		best.next++
		prev = best
	}
	return ring
}

// dom is one failure domain while spread builds the ring.
type dom struct {
	name  string
	queue []int // item indices, in dealing order
	next  int   // queue[next] is the next item to place
}

// better reports whether d (with dl items left) should be taken before b
// (bl left), prev being the domain just taken and head the ring's first.
// Domains are offered in natural order, so a full tie keeps b, the earlier.
func (d *dom) better(b *dom, dl, bl int, prev, head *dom) bool {
	if (d == prev) != (b == prev) {
		return b == prev
	}
	if dl != bl {
		return dl > bl
	}
	if (d == head) != (b == head) {
		return d == head
	}
	return false
}
