// Package restore plans how a sharded rank's state comes back after a
// failure: from the watermarks of its sharding group (a [View]) and the
// group's geometry (a [Group]), with agent/sg's failure analysis, so that a
// restore does what `reft explain` says. The [Planner] is pure: it reads no
// store, mesh or server, and the one thing it must ask the world (whether
// an AOR replica is valid for a step) it asks through a function it is
// given. The agent gathers the view, plans, and assembles the state the
// plan names (agent/sharded_restore.go).
package restore

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/reft-hpc/reft/agent/sg"
	"github.com/reft-hpc/reft/agent/shard"
	"github.com/reft-hpc/reft/spank/spec"
)

// Group is the geometry of a rank's sharding group that planning needs.
type Group struct {
	Spec    spec.Spec // the job's SPEC
	Layout  sg.Layout
	World   int
	Rank    int   // the restoring rank
	Members []int // member ranks by ring position (dp order until the ring is fixed)
	ARC     bool  // members keep their ring successor's shard
	Parity  bool  // members keep aec parity units
	// Whole: aor without arc or aec; the replicated buffers are saved
	// whole in every member's generation.
	Whole bool
	// AOR are the rank's AOR state buffers; empty without aor.
	AOR []string
	// Unreplicated: the rank registered buffers that are not replicated
	// (saved whole); Placed are those of them that get peer copies
	// (background replication), the AOR state buffers excluded.
	Unreplicated bool
	Placed       []string
}

func (g Group) m() int { return len(g.Members) }

// pos is the rank's ring position.
func (g Group) pos() int { return slices.Index(g.Members, g.Rank) }

func (g Group) pred(q int) int { return (q - 1 + g.m()) % g.m() }

// Name is the group's name, "(pp=P,tp=T)".
func (g Group) Name() string {
	c := g.Layout.Coord(g.Rank)
	return sg.Group{PP: c.PP, TP: c.TP}.Name()
}

// dpOrder is the group's members by DP index.
func (g Group) dpOrder() []int {
	c := g.Layout.Coord(g.Rank)
	out := make([]int, g.Layout.DP)
	for dp := range out {
		out[dp] = g.Layout.Rank(sg.Coord{DP: dp, PP: c.PP, TP: c.TP})
	}
	return out
}

// WithRing is g on ring (the members' ranks in ring order).
func (g Group) WithRing(ring []int) (Group, error) {
	if len(ring) != g.m() || !sameMembers(ring, g.Members) {
		return g, fmt.Errorf("ring %v is not an order of SG %s's members %v", ring, g.Name(), g.dpOrder())
	}
	g.Members = slices.Clone(ring)
	return g, nil
}

func sameMembers(a, b []int) bool {
	x, y := slices.Clone(a), slices.Clone(b)
	slices.Sort(x)
	slices.Sort(y)
	return slices.Equal(x, y) && len(slices.Compact(x)) == len(a)
}

// StepRing is the ring the group's generations of step were saved with:
// the one their manifests record (none: dp order, as before rings).
// Members that saved the step on different rings (agents that could not
// agree) make the step unusable from memory.
func StepRing(g Group, v *View, step int64) ([]int, error) {
	var ring []int
	var from int
	for _, r := range g.dpOrder() {
		for _, l := range v.Gens[r][step] {
			if l.Ring == nil {
				continue
			}
			if ring == nil {
				ring, from = l.Ring, r
			} else if !slices.Equal(ring, l.Ring) {
				return nil, fmt.Errorf("SG %s saved step %d on different rings (rank %d on %v, rank %d on %v): its agents did not agree, so the copies do not fit together",
					g.Name(), step, from, ring, r, l.Ring)
			}
		}
	}
	if ring == nil {
		return g.dpOrder(), nil
	}
	return ring, nil
}

// goneNode names, for the failure analysis, the node of a rank whose
// generation no agent reports: its node is no longer in the job.
func goneNode(r int) string { return "gone(rank " + strconv.Itoa(r) + "'s node)" }

// model is the failure analysis of the group's slice at one step:
// rankNode[r] is the node holding rank r's generation, "" when no agent
// reported it. Ranks whose generation is gone are put on nodes of their
// own, failed, listed in failed. The analysis is agent/sg's, so a restore
// does what `reft explain` says.
func (g Group) model(rankNode map[int]string) (md *sg.Model, failed []string, err error) {
	top := sg.Topology{RankNode: make([]string, g.World)}
	for r := range g.World {
		n := rankNode[r]
		if n == "" {
			n = goneNode(r)
			failed = append(failed, n)
		}
		top.RankNode[r] = n
	}
	// Ranks sharing a node in the store view is fine: the ring is given
	// (Rings) and failures are explicit; give co-located members distinct
	// names so that the analysis counts them apart.
	seen := map[string]int{}
	for r, n := range top.RankNode {
		if c := seen[n]; c > 0 {
			top.RankNode[r] = n + "#" + strconv.Itoa(c)
		}
		seen[n]++
	}
	sp := g.Spec
	sp.DP, sp.PP, sp.TP = 0, 0, 0
	kinds := sg.Replicated
	if len(g.AOR) > 0 {
		kinds |= sg.Optimizer
	}
	md, err = sg.NewModel(sg.Job{Spec: sp, Layout: g.Layout, Topology: top, Kinds: kinds, Rings: map[string][]int{g.Name(): g.Members}})
	return md, failed, err
}

// ShardSource says how one shard of the slice comes back.
type ShardSource struct {
	Pos    int
	Rank   int
	Source sg.Source
	Cands  []Cand // plain copies, nearest first; none for aec
}

// LostShard is one shard of a rank's state that memory lost.
type LostShard struct {
	Kind     string `json:"kind"`            // replicated, optimizer or unreplicated
	Group    string `json:"group,omitempty"` // the sharding group
	Position int    `json:"position"`        // ring position; -1 for unreplicated buffers
	Rank     int    `json:"rank"`            // the owner
	Reason   string `json:"reason"`
}

// Plan is how a rank's whole state at one step comes back.
type Plan struct {
	Step    int64
	OK      bool
	Ring    []int // the ring the step was saved with, which the plan's positions are on; nil when none fits
	Shards  []ShardSource
	Decode  []int    // positions decoded from parity
	Parity  [][]Cand // per position: its parity units; nil without
	Others  []Cand   // the rank's unreplicated buffers: copies of its generation, or its placement peers' replicas
	Reasons []string // why not OK
	// Lost are the shards no in-memory source can give back, each with
	// why (the restore_fallback and restore_persistent events list them
	// all; the reasons shorten a big group's).
	Lost []LostShard
	// Whole: copies of generations that hold the replicated buffers
	// whole (aor without arc or aec), the rank's own first.
	Whole []Cand
	// Opt: per AOR state buffer, its copies (section named); OptSource
	// says which (local: the rank's own; aor: its predecessor's replica).
	Opt       map[string][]Cand
	OptSource sg.Source
	Loaded    map[int]Loc // a persistent-tier plan's loaded generations

	// OthersSource says where Others are: local (the rank's own
	// generation, wherever it survives) or peer (placement peers' replicas).
	OthersSource sg.Source
}

// Sources names each part's source and first copy, for the restore event.
func (p Plan) Sources() string {
	var b strings.Builder
	for _, sh := range p.Shards {
		if b.Len() > 0 {
			b.WriteString(" ")
		}
		from := "decode"
		if len(sh.Cands) > 0 {
			from = nodeName(sh.Cands[0].Loc.Node)
		}
		fmt.Fprintf(&b, "%d:%s@%s", sh.Pos, sh.Source, from)
	}
	for name, cs := range p.Opt {
		if len(cs) > 0 {
			fmt.Fprintf(&b, " %s:%s@%s", name, p.OptSource, nodeName(cs[0].Loc.Node))
		}
	}
	if len(p.Others) > 0 {
		fmt.Fprintf(&b, " unreplicated:%s@%s", p.OthersSource, nodeName(p.Others[0].Loc.Node))
	}
	return b.String()
}

func nodeName(n string) string {
	if n == "" {
		return "local"
	}
	return n
}

// Planner decides, from a group's watermarks, how a rank's state at a step
// comes back.
//
// Contract: a Planner holds no state; its methods may run on any number of
// goroutines at once, over Views nobody modifies meanwhile. They read
// nothing but their arguments, except through ReadBase.
type Planner struct {
	// Node is this node's name: copies whose Loc.Node is "" are here.
	Node string
	// ReadBase reads the step an AOR replica is valid for (the aor@base
	// section) from the first of locs, a member's copies of its
	// generation, that can give it. Plan calls it on its own goroutine, at
	// most once a call, and only when the failure analysis takes the
	// rank's optimizer state from its ring predecessor's replica. It may
	// block on the network (it bounds its own wait) and must not call back
	// into the Planner. Nil: no replica is readable.
	ReadBase func(locs []Loc) (int64, error)
}

// Plan decides how rank g.Rank's state at step comes back, with agent/sg's
// failure analysis, on the ring the step was saved with (Plan.Ring). A
// plan that is not OK says why in Reasons, and what memory lost in Lost.
func (pl Planner) Plan(g Group, v *View, step int64) Plan {
	p := Plan{Step: step}
	ring, err := StepRing(g, v, step)
	if err == nil {
		g, err = g.WithRing(ring)
	}
	if err != nil {
		p.Reasons = append(p.Reasons, err.Error())
		return p
	}
	p.Ring = g.Members
	an, err := pl.analyze(g, v, step)
	if err != nil {
		p.Reasons = append(p.Reasons, fmt.Sprintf("failure analysis: %v", err))
		return p
	}
	locs := func(r int) []Loc { return v.Gens[r][step] }
	if !planShards(g, &p, an, locs) {
		return p
	}
	if g.Parity {
		for q, r := range g.Members {
			for _, l := range locs(r) {
				p.Parity[q] = append(p.Parity[q], Cand{Loc: l, Sec: shard.Parity})
			}
		}
	}
	if g.Whole {
		for _, sh := range p.Shards {
			if sh.Rank == g.Rank {
				p.Whole = sh.Cands
			}
		}
	}
	if len(g.AOR) > 0 {
		pl.planAOR(g, &p, an, locs)
	}
	if g.Unreplicated {
		planOthers(g, v, &p, locs)
	}
	p.OK = len(p.Reasons) == 0
	return p
}

// analyze runs the failure analysis of step: a rank is failed when no
// agent reports its generation of step.
func (pl Planner) analyze(g Group, v *View, step int64) (sg.Plan, error) {
	rankNode := map[int]string{}
	for r, steps := range v.Gens {
		if locs := steps[step]; len(locs) > 0 {
			rankNode[r] = locs[0].Node
			if locs[0].Node == "" {
				rankNode[r] = pl.Node
			}
		}
	}
	md, failed, err := g.model(rankNode)
	if err != nil {
		return sg.Plan{}, err
	}
	if failed == nil {
		failed = []string{}
	}
	return md.Plan(failed)
}

// planShards fills p's replicated shards and optimizer source from the
// analysis an; false when the analysis does not fit the group (a bug),
// with p's reasons saying so.
func planShards(g Group, p *Plan, an sg.Plan, locs func(int) []Loc) bool {
	group := g.Name()
	p.Parity = make([][]Cand, g.m())
	lost := false
	for _, sh := range an.Shards {
		if sh.Kind == sg.Optimizer && sh.Group == group && sh.Rank == g.Rank {
			p.OptSource = sh.Source
		}
		if sh.Kind != sg.Replicated || sh.Group != group {
			continue
		}
		q := sh.Position
		if q < 0 || q >= g.m() || g.Members[q] != sh.Rank {
			p.Reasons = append(p.Reasons, fmt.Sprintf("the failure analysis puts rank %d at ring position %d of SG %s, the layout rank %d (a bug; report it)",
				sh.Rank, q, group, g.Members[min(max(q, 0), g.m()-1)]))
			return false
		}
		src := ShardSource{Pos: q, Rank: sh.Rank, Source: sh.Source, Cands: shardCands(g, q, locs)}
		switch sh.Source {
		case sg.SourceAEC:
			src.Cands = nil
			p.Decode = append(p.Decode, q)
		case sg.SourcePersistent:
			lost = true
			p.Lost = append(p.Lost, LostShard{Kind: sg.Replicated.String(), Group: group, Position: q, Rank: sh.Rank, Reason: sh.Reason})
		}
		p.Shards = append(p.Shards, src)
	}
	if lost {
		p.Reasons = append(p.Reasons, groupReasons(an, group, "")...)
	}
	if len(p.Shards) != g.m() {
		p.Reasons = append(p.Reasons, fmt.Sprintf("the failure analysis gave %d shards of SG %s, want %d", len(p.Shards), group, g.m()))
	}
	return true
}

// shardCands are the plain copies of ring position q's shard, this
// node's first: its owner's own section, its predecessor's ARC copy, and
// with whole buffers any member's copy.
func shardCands(g Group, q int, locs func(int) []Loc) []Cand {
	var cs []Cand
	for _, l := range locs(g.Members[q]) {
		cs = append(cs, Cand{Loc: l, Sec: shard.Own})
	}
	if g.ARC {
		for _, l := range locs(g.Members[g.pred(q)]) {
			cs = append(cs, Cand{Loc: l, Sec: shard.ARC})
		}
	}
	if g.Whole {
		for k := 1; k < g.m(); k++ {
			for _, l := range locs(g.Members[(q+k)%g.m()]) {
				cs = append(cs, Cand{Loc: l})
			}
		}
	}
	LocalFirst(cs)
	return cs
}

// groupReasons are the analysis's reasons about group, those containing
// about only when it is not "".
func groupReasons(an sg.Plan, group, about string) []string {
	var out []string
	for _, r := range an.Reasons {
		if strings.HasPrefix(r, "SG "+group+" ") && strings.Contains(r, about) {
			out = append(out, r)
		}
	}
	return out
}

// planAOR decides where the rank's AOR state buffers come from at p.Step,
// as the failure analysis says: its own generation (local), or its ring
// predecessor's replica (aor) when that is valid for the step.
func (pl Planner) planAOR(g Group, p *Plan, an sg.Plan, locs func(int) []Loc) {
	p.Opt = map[string][]Cand{}
	had := len(p.Reasons)
	switch p.OptSource {
	case sg.SourceLocal:
		for _, n := range g.AOR {
			for _, l := range locs(g.Rank) {
				p.Opt[n] = append(p.Opt[n], Cand{Loc: l, Sec: n})
			}
		}
	case sg.SourceAOR:
		pl.planReplica(g, p, locs)
	case sg.SourcePersistent:
		for _, r := range groupReasons(an, g.Name(), "optimizer shard") {
			if !slices.Contains(p.Reasons, r) {
				p.Reasons = append(p.Reasons, r)
			}
		}
		if len(p.Reasons) == 0 {
			p.Reasons = append(p.Reasons, fmt.Sprintf("rank %d's optimizer state and its AOR replica of step %d are both gone", g.Rank, p.Step))
		}
	default:
		p.Reasons = append(p.Reasons, fmt.Sprintf("the failure analysis gave no source for rank %d's optimizer shard (a bug; report it)", g.Rank))
	}
	for _, n := range g.AOR {
		LocalFirst(p.Opt[n])
	}
	if len(p.Reasons) > had {
		p.Lost = append(p.Lost, LostShard{Kind: sg.Optimizer.String(), Group: g.Name(), Position: g.pos(), Rank: g.Rank,
			Reason: strings.Join(p.Reasons[had:], "; ")})
	}
}

// planReplica takes the rank's AOR state buffers from its ring
// predecessor's replica, if ReadBase says the replica is of p.Step.
func (pl Planner) planReplica(g Group, p *Plan, locs func(int) []Loc) {
	pred := g.Members[g.pred(g.pos())]
	names := strings.Join(g.AOR, ", ")
	var b int64
	err := fmt.Errorf("no reader of AOR replicas")
	if pl.ReadBase != nil {
		b, err = pl.ReadBase(locs(pred))
	}
	switch {
	case err != nil:
		p.Reasons = append(p.Reasons, fmt.Sprintf("rank %d's optimizer state (%s) of step %d lived only on its node; the AOR replica rank %d keeps cannot be read: %v",
			g.Rank, names, p.Step, pred, err))
	case b != p.Step:
		p.Reasons = append(p.Reasons, fmt.Sprintf("rank %d's optimizer state (%s) of step %d lived only on its node, and the AOR replica rank %d keeps is not valid for that step (it could not be brought forward: a step was not saved, or rank %d restored without a replica; its agent's aor_invalid event says why)",
			g.Rank, names, p.Step, pred, pred))
	default:
		for _, n := range g.AOR {
			for _, l := range locs(pred) {
				p.Opt[n] = append(p.Opt[n], Cand{Loc: l, Sec: shard.AOR + n})
			}
		}
	}
}

// planOthers decides where the rank's unreplicated buffers at p.Step come
// from: its own generation where one survives, else a placement peer's
// replica of that very step (never another step: a restore does not mix
// generations).
func planOthers(g Group, v *View, p *Plan, locs func(int) []Loc) {
	p.OthersSource = sg.SourceLocal
	for _, l := range locs(g.Rank) {
		p.Others = append(p.Others, Cand{Loc: l})
	}
	if len(p.Others) > 0 || len(g.Placed) == 0 {
		return
	}
	p.OthersSource = sg.SourcePeer
	for _, l := range v.Replicas[g.Rank][p.Step] {
		p.Others = append(p.Others, Cand{Loc: l})
	}
	if len(p.Others) > 0 {
		return
	}
	what := fmt.Sprintf("rank %d's unreplicated buffers (%s) of step %d lived only on its own node, which no agent serves any more,", g.Rank, strings.Join(g.Placed, ", "), p.Step)
	steps := v.ReplicaSteps(g.Rank)
	switch {
	case len(steps) == 0:
		p.Reasons = append(p.Reasons, what+" and no placement peer holds a replica of them (background replication had not copied any generation, or the peers holding one are lost too)")
	case steps[0] < p.Step:
		p.Reasons = append(p.Reasons, fmt.Sprintf("%s and the newest replica on its placement peers is of step %d, older than step %d (background replication lags behind the commits)",
			what, steps[0], p.Step))
	default:
		p.Reasons = append(p.Reasons, fmt.Sprintf("%s and its placement peers hold replicas of steps %v, not of step %d", what, steps, p.Step))
	}
	p.Lost = append(p.Lost, LostShard{Kind: "unreplicated", Position: -1, Rank: g.Rank, Reason: p.Reasons[len(p.Reasons)-1]})
}

// FirstRestorable plans steps in order and returns the first plan that
// is OK, and the plan to blame should none be: that of the step the fewest
// members lack (the newest such), since a step only some survivors reached
// would blame them too.
func (pl Planner) FirstRestorable(g Group, v *View, steps []int64) (chosen, blame *Plan) {
	bestMissing := -1
	for _, st := range steps {
		p := pl.Plan(g, v, st)
		missing := 0
		for _, r := range g.Members {
			if len(v.Gens[r][st]) == 0 {
				missing++
			}
		}
		if blame == nil || missing < bestMissing {
			blame, bestMissing = &p, missing
		}
		if p.OK {
			return &p, blame
		}
	}
	return nil, blame
}
