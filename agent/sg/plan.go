package sg

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Source is where a shard is restored from.
type Source string

// Sources, in the order restore prefers them.
const (
	// SourceLocal: the owner's node survived; its tmpfs has the shard.
	SourceLocal Source = "local"
	// SourceARC: the ARC copy of a replicated shard, kept by the owner's
	// ring predecessor.
	SourceARC Source = "arc"
	// SourceAEC: decoded from AEC parity (XOR for aec, Reed-Solomon for
	// aec:K) and the surviving pieces of the stripes.
	SourceAEC Source = "aec"
	// SourceAOR: the AOR replica of a ZeRO-1 optimizer shard, kept by the
	// owner's ring predecessor.
	SourceAOR Source = "aor"
	// SourcePeer: a GEMINI placement copy of per-rank state on a peer node;
	// for replicated state under aor without arc or aec, a surviving SG
	// member's whole copy (every member keeps the slice whole then).
	SourcePeer Source = "peer"
	// SourcePersistent: nothing in memory survived; the persistent tier.
	SourcePersistent Source = "persistent"
)

// ShardPlan says how one shard comes back.
type ShardPlan struct {
	Kind Kind `json:"kind"`
	// Group is the SG, "(pp=P,tp=T)", for replicated and optimizer shards.
	Group string `json:"group,omitempty"`
	// Position is the owner's ring position in Group, which is also the
	// shard's index in the slice (ShardRange); -1 for sharded state.
	Position int    `json:"position"`
	Rank     int    `json:"rank"` // owner
	Node     string `json:"node"` // owner's node
	Source   Source `json:"source"`
	// From lists the nodes a restore reads: the copy's holder (arc, aor,
	// peer: all surviving holders, nearest first) or, for aec, every node
	// whose data or parity the decode needs.
	From []string `json:"from,omitempty"`
	// Reason says, for persistent, why no in-memory source is left.
	Reason string `json:"reason,omitempty"`
}

// Plan is the failure analysis for one set of failed nodes.
type Plan struct {
	Failed []string `json:"failed"`
	// Survives is true when every shard has an in-memory source, so the
	// job restarts from the newest globally restorable generation in memory.
	Survives bool        `json:"survives"`
	Shards   []ShardPlan `json:"shards"`
	// Reasons give one line per lost SG or failed node whose state only the
	// persistent tier still has.
	Reasons []string `json:"reasons,omitempty"`
}

// Lost returns the shards that need the persistent tier.
func (p Plan) Lost() []ShardPlan {
	var out []ShardPlan
	for _, s := range p.Shards {
		if s.Source == SourcePersistent {
			out = append(out, s)
		}
	}
	return out
}

// Analyze compiles job and plans the restore after failed nodes fail.
func Analyze(job Job, failed []string) (Plan, error) {
	md, err := NewModel(job)
	if err != nil {
		return Plan{}, err
	}
	return md.Plan(failed)
}

// Plan decides, for every shard of the job, whether and how it comes back
// when the failed nodes (and everything on them) are gone.
func (md *Model) Plan(failed []string) (Plan, error) {
	dead, names, err := md.dead(failed)
	if err != nil {
		return Plan{}, err
	}
	return md.plan(dead, names, true), nil
}

// Reasons is Plan(failed).Reasons without the per-shard list, for callers
// that only explain (cheaper on big jobs: it skips untouched groups).
func (md *Model) Reasons(failed []string) ([]string, error) {
	dead, names, err := md.dead(failed)
	if err != nil {
		return nil, err
	}
	return md.plan(dead, names, false).Reasons, nil
}

// plan builds the plan; without shards it only collects the reasons.
func (md *Model) plan(dead []bool, names []string, shards bool) Plan {
	p := Plan{Failed: names}
	if md.Kinds&Replicated != 0 {
		md.planGroups(&p, dead, Replicated, shards)
	}
	if md.Kinds&Optimizer != 0 && md.code.aor {
		md.planGroups(&p, dead, Optimizer, shards)
	}
	md.planPlaced(&p, dead, shards)
	p.Survives = len(p.Reasons) == 0
	return p
}

// Survives is Plan(failed).Survives without building the plan: fast enough
// to enumerate failure sets.
func (md *Model) Survives(failed []string) (bool, error) {
	dead, _, err := md.dead(failed)
	if err != nil {
		return false, err
	}
	return md.survives(dead), nil
}

func (md *Model) survives(dead []bool) bool {
	var f []bool
	for _, ns := range md.patterns {
		f = f[:0]
		any := false
		for _, n := range ns {
			f = append(f, dead[n])
			any = any || dead[n]
		}
		if !any {
			continue
		}
		for pos := range f {
			if !f[pos] {
				continue
			}
			if md.Kinds&Replicated != 0 && md.code.source(f, pos) == SourcePersistent {
				return false
			}
			if md.Kinds&Optimizer != 0 && md.code.aor && f[pred(pos, len(f))] {
				return false
			}
		}
	}
	return md.Kinds&md.placedKinds() == 0 || placedSurvive(md.stateNodes, md.holders, dead)
}

// placedSurvive: every dead node of state has a live holder of its
// copies.
func placedSurvive(state []int, holders [][]int, dead []bool) bool {
	for _, x := range state {
		if dead[x] && !anyAlive(holders[x], dead) {
			return false
		}
	}
	return true
}

func anyAlive(ns []int, dead []bool) bool {
	for _, n := range ns {
		if !dead[n] {
			return true
		}
	}
	return false
}

// pred is the ring position before i: the holder of i's ARC copy and AOR
// replica.
func pred(i, m int) int { return (i - 1 + m) % m }

// planGroups adds the shards of every SG for kind (Replicated, or
// Optimizer under aor) and one reason per SG that loses any.
func (md *Model) planGroups(p *Plan, dead []bool, kind Kind, shards bool) {
	for gi, g := range md.Groups {
		ns := md.groupNodes[gi]
		m := len(ns)
		f := make([]bool, m)
		hit := false
		for i, n := range ns {
			f[i] = dead[n]
			hit = hit || f[i]
		}
		if !hit && !shards {
			continue
		}
		var lost []string
		for pos, mem := range g.Members {
			s := ShardPlan{Kind: kind, Group: g.Name(), Position: pos, Rank: mem.Rank, Node: mem.Node}
			holder := g.Members[pred(pos, m)]
			if kind == Replicated {
				s.Source = md.code.source(f, pos)
			} else {
				s.Source = aorSource(f, pos)
			}
			switch s.Source {
			case SourceARC, SourceAOR:
				s.From = []string{holder.Node}
			case SourceAEC:
				s.From = md.code.decodeNodes(g, f, pos)
			case SourcePeer:
				s.From = survivorNodes(g, f, pos)
			case SourcePersistent:
				s.Reason = md.code.shardReason(g, f, pos, kind)
				lost = append(lost, s.Reason)
			}
			if shards {
				p.Shards = append(p.Shards, s)
			}
		}
		if len(lost) > 0 {
			p.Reasons = append(p.Reasons, md.code.groupReason(g, f, kind, lost))
		}
	}
}

// aorSource is where an optimizer shard under aor comes from, f marking
// the group's failed ring positions: its own node, else its ring
// predecessor's AOR replica, else the persistent tier.
func aorSource(f []bool, pos int) Source {
	switch {
	case !f[pos]:
		return SourceLocal
	case !f[pred(pos, len(f))]:
		return SourceAOR
	}
	return SourcePersistent
}

// survivorNodes are the nodes of g's surviving members, in ring order
// from pos on, each once.
func survivorNodes(g Group, f []bool, pos int) []string {
	var out []string
	m := len(f)
	for q := 1; q < m; q++ {
		if o := (pos + q) % m; !f[o] && !slices.Contains(out, g.Members[o].Node) {
			out = append(out, g.Members[o].Node)
		}
	}
	return out
}

// planPlaced adds the per-rank shards protected by peer copies: sharded
// state, and optimizer shards without aor. Reasons come one per node.
func (md *Model) planPlaced(p *Plan, dead []bool, shards bool) {
	kinds := md.Kinds & md.placedKinds()
	if kinds == 0 {
		return
	}
	lostNodes := map[int]bool{}
	for _, k := range []Kind{Optimizer, Sharded} {
		if kinds&k == 0 {
			continue
		}
		for r, node := range md.Job.Topology.RankNode {
			x := md.nodeIdx[node]
			if !shards {
				if dead[x] && !anyAlive(md.holders[x], dead) {
					lostNodes[x] = true
				}
				continue
			}
			s := ShardPlan{Kind: k, Position: -1, Rank: r, Node: node}
			if k == Optimizer {
				g, pos := md.groupOf(r)
				s.Group, s.Position = g.Name(), pos
			}
			switch {
			case !dead[x]:
				s.Source = SourceLocal
			case anyAlive(md.holders[x], dead):
				s.Source = SourcePeer
				for _, h := range md.holders[x] {
					if !dead[h] {
						s.From = append(s.From, md.nodes[h])
					}
				}
			default:
				s.Source = SourcePersistent
				s.Reason = md.nodeReason(x)
				lostNodes[x] = true
			}
			p.Shards = append(p.Shards, s)
		}
	}
	var xs []int
	for x := range lostNodes {
		xs = append(xs, x)
	}
	sort.Ints(xs)
	for _, x := range xs {
		p.Reasons = append(p.Reasons, md.nodeReason(x))
	}
}

// groupOf finds rank r's SG and ring position.
func (md *Model) groupOf(r int) (Group, int) {
	c := md.Job.Layout.Coord(r)
	g := md.Groups[c.PP*md.Job.Layout.TP+c.TP]
	return g, g.Position(r)
}

func (md *Model) nodeReason(x int) string {
	name := md.nodes[x]
	what := "per-rank state"
	if md.Kinds&Optimizer != 0 && !md.code.aor {
		what = "per-rank state (including ZeRO-1 optimizer shards)"
	}
	head := fmt.Sprintf("node %s (%s %s): %s", name, pluralWord(len(md.nodeRanks[x]), "rank", "ranks"), rankRanges(md.nodeRanks[x]), what)
	hs := md.holders[x]
	switch {
	case len(hs) > 0:
		var names []string
		for _, h := range hs {
			names = append(names, md.nodes[h])
		}
		where := ""
		for _, grp := range md.Placement.Groups {
			if contains(grp, name) {
				where = "GEMINI group " + strings.Join(grp, ",")
			}
		}
		if where == "" {
			where = "GEMINI ring " + strings.Join(md.Placement.Ring, ",")
		}
		copies := fmt.Sprintf("all %d peer copies", len(hs))
		if len(hs) == 1 {
			copies = "its peer copy"
		}
		return fmt.Sprintf("%s lost with %s (%s); %s keeps %s per node (%s)", head,
			copies, strings.Join(names, ","), md.code.modes(), plural(md.copies, "peer copy", "peer copies"), where)
	case !md.Job.Spec.Enabled():
		return head + " lost: --reft=off keeps no copies"
	case md.tNet == 0:
		return fmt.Sprintf("%s lost: --reft=%s makes no peer copies of it (arc or aec do; aor covers only ZeRO-1 optimizer shards)", head, md.Job.Spec)
	default:
		return head + " lost: the job has one node, so no peer copy fits"
	}
}

func pluralWord(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// rankRanges writes sorted ranks as "0-3,8".
func rankRanges(rs []int) string {
	var b strings.Builder
	for i := 0; i < len(rs); {
		j := i
		for j+1 < len(rs) && rs[j+1] == rs[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(rs[i]))
		if j > i {
			b.WriteString("-" + strconv.Itoa(rs[j]))
		}
		i = j + 1
	}
	return b.String()
}

func contains(s []string, x string) bool {
	for _, y := range s {
		if y == x {
			return true
		}
	}
	return false
}

// compactNodes lists nodes briefly for error messages.
func compactNodes(ns []string) string {
	if len(ns) <= 8 {
		return strings.Join(ns, ",")
	}
	return strings.Join(ns[:8], ",") + fmt.Sprintf(",... (%d in all)", len(ns))
}
