package sg

import (
	"fmt"
	"slices"
	"strings"

	"github.com/reft-hpc/reft/spank/spec"
)

// groupCode is the redundancy inside one sharding group as the spec
// compiles it: the ARC copy, the AEC stripes, aor and whether members keep
// the slice whole. It knows nothing of nodes or of which groups exist: its
// methods are pure functions of one group's failure mask f (f[i]: ring
// position i failed, len(f) the group size), so the Model asks it once per
// group. It is built once by NewModel and immutable after, hence safe for
// concurrent use.
type groupCode struct {
	spec     spec.Spec
	dp       int  // group size in the layout
	arc, aor bool // the spec's modes
	// whole: aor without arc or aec. The agent then keeps every member's
	// replicated state whole (its slice is not sharded), so a member's
	// replicated state survives while any member of its SG lives.
	whole   bool
	k       int // AEC parity pieces per stripe, 0 without aec
	ec      *EC // nil without aec (or without replicated state)
	stripes []Stripe
}

// modes writes the modes in effect for replicated state ("arc+aec:2").
func (c *groupCode) modes() string {
	var m []string
	if c.arc {
		m = append(m, "arc")
	}
	switch {
	case c.k == 1:
		m = append(m, "aec")
	case c.k > 1:
		m = append(m, fmt.Sprintf("aec:%d", c.k))
	}
	return strings.Join(m, "+")
}

// tolerance is the guaranteed failed members per SG for replicated state.
func (c *groupCode) tolerance() int {
	if c.whole {
		return c.dp - 1
	}
	t := c.k
	if c.arc {
		t++
	}
	return t
}

// source decides a replicated shard's source; f marks the group's failed
// ring positions.
func (c *groupCode) source(f []bool, pos int) Source {
	m := len(f)
	switch {
	case !f[pos]:
		return SourceLocal
	case c.arc && m > 1 && !f[pred(pos, m)]:
		return SourceARC
	case c.ec != nil && c.decodable(f, pos) == -1:
		return SourceAEC
	case c.whole && slices.Contains(f, false):
		return SourcePeer // any member's whole copy
	}
	return SourcePersistent
}

// known reports whether the data of ring position q survives in plain
// form: at its owner or in its predecessor's ARC copy.
func (c *groupCode) known(f []bool, q int) bool {
	return !f[q] || (c.arc && !f[pred(q, len(f))])
}

// decodable returns -1 when every piece of pos's shard can be decoded from
// its stripe, else the first stripe that cannot: a stripe decodes while its
// unknown data pieces are no more than its surviving parity pieces (XOR
// and Reed-Solomon are MDS: any K of the stripe's pieces may be missing).
func (c *groupCode) decodable(f []bool, pos int) int {
	for j := 0; j < c.ec.DataPieces(); j++ {
		a := c.ec.PieceStripe(pos, j)
		if c.stripeUnknown(f, a) > c.stripeParity(f, a) {
			return a
		}
	}
	return -1
}

// stripeUnknown counts stripe a's data pieces known neither at their owner
// nor in an ARC copy.
func (c *groupCode) stripeUnknown(f []bool, a int) int {
	u := 0
	for _, d := range c.stripes[a].Data {
		if !c.known(f, d.Member) {
			u++
		}
	}
	return u
}

// stripeParity counts stripe a's surviving parity pieces.
func (c *groupCode) stripeParity(f []bool, a int) int {
	n := 0
	for _, q := range c.stripes[a].Parity {
		if !f[q] {
			n++
		}
	}
	return n
}

// decodeNodes lists the nodes an AEC decode of pos's shard reads: for each
// of its stripes, the surviving parity and the plain data of the others.
func (c *groupCode) decodeNodes(g Group, f []bool, pos int) []string {
	seen := map[string]bool{}
	var out []string
	add := func(q int) {
		if n := g.Members[q].Node; !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	m := len(f)
	for j := 0; j < c.ec.DataPieces(); j++ {
		st := c.stripes[c.ec.PieceStripe(pos, j)]
		for _, q := range st.Parity {
			if !f[q] {
				add(q)
			}
		}
		for _, d := range st.Data {
			switch {
			case d.Member == pos:
			case !f[d.Member]:
				add(d.Member)
			case c.arc && !f[pred(d.Member, m)]:
				add(pred(d.Member, m))
			}
		}
	}
	return out
}

// tolPhrase is "arc tolerates 1 failure per group" for kind.
func (c *groupCode) tolPhrase(kind Kind) string {
	if kind == Optimizer {
		return "aor keeps 1 replica of each ZeRO-1 optimizer shard, on the previous member, so it tolerates 1 failure per group"
	}
	if !c.spec.Enabled() {
		return "--reft=off keeps no redundancy"
	}
	t := c.tolerance()
	if c.whole {
		return fmt.Sprintf("aor without arc or aec keeps the whole replicated slice on every member, so it tolerates %s per group", plural(t, "failure", "failures"))
	}
	if t == 0 {
		return fmt.Sprintf("--reft=%s does not protect replicated state (arc or aec do)", c.spec)
	}
	return fmt.Sprintf("%s tolerates %s per group", c.modes(), plural(t, "failure", "failures"))
}

// shardReason says why pos's shard of kind in g has no in-memory source.
func (c *groupCode) shardReason(g Group, f []bool, pos int, kind Kind) string {
	m := len(f)
	mem, holder := g.Members[pos], g.Members[pred(pos, m)]
	what := fmt.Sprintf("rank %d's shard", mem.Rank)
	if kind == Optimizer {
		what = fmt.Sprintf("rank %d's optimizer shard", mem.Rank)
		return fmt.Sprintf("%s was on %s and its AOR replica on rank %d (%s)", what, mem.Node, holder.Rank, holder.Node)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s was on %s", what, mem.Node)
	if c.arc && m > 1 {
		fmt.Fprintf(&b, " and its ARC copy on rank %d (%s)", holder.Rank, holder.Node)
	}
	if c.whole {
		b.WriteString(", and every other member of its group, each with a whole copy, failed too")
	}
	if c.ec != nil {
		a := c.decodable(f, pos)
		fmt.Fprintf(&b, "; AEC stripe %d misses %s with %s left", a,
			plural(c.stripeUnknown(f, a), "data piece", "data pieces"),
			plural(c.stripeParity(f, a), "parity piece", "parity pieces"))
	}
	return b.String()
}

// groupReason is the one line for g losing the shards lost (their
// shardReasons) of kind.
func (c *groupCode) groupReason(g Group, f []bool, kind Kind, lost []string) string {
	var ranks []int
	var nodes []string
	seen := map[string]bool{}
	for pos, x := range f {
		if x {
			ranks = append(ranks, g.Members[pos].Rank)
			if n := g.Members[pos].Node; !seen[n] {
				seen[n] = true
				nodes = append(nodes, n)
			}
		}
	}
	slices.Sort(ranks)
	slices.Sort(nodes)
	word := "ranks"
	if len(ranks) == 1 {
		word = "rank"
	}
	nodeWord := "nodes"
	if len(nodes) == 1 {
		nodeWord = "node"
	}
	// Two shards say enough; a big group would otherwise make pages.
	detail := strings.Join(lost[:min(2, len(lost))], "; ")
	if len(lost) > 2 {
		detail += fmt.Sprintf("; and %s more", plural(len(lost)-2, "shard", "shards"))
	}
	return fmt.Sprintf("%s lost %s %s on %s %s; %s: %s", g, word, joinInts(ranks), nodeWord,
		strings.Join(nodes, ","), c.tolPhrase(kind), detail)
}
