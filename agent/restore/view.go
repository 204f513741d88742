package restore

import (
	"maps"
	"slices"
	"time"

	"github.com/reft-hpc/reft/agent/peer"
	"github.com/reft-hpc/reft/agent/shard"
	"github.com/reft-hpc/reft/tmpfs"
)

// Loc is one place a rank's committed generation lives.
type Loc struct {
	Node string // "" for this node
	Key  peer.GenKey
	Ring []int // the SG ring it was saved with; nil: dp order (or unsharded)
}

// Cand is one copy of a byte range: a section of a generation somewhere.
type Cand struct {
	Loc Loc
	Sec string
}

// View is a sharding group's committed generations as the agents report
// them (commit watermarks): metadata only, O(group).
//
// Concurrency: a View is built by one owner (Add, then SortLocalFirst; an
// owner gathering replies on several goroutines serializes its Adds) and is
// read-only afterwards, so any number of planners may read it at once.
type View struct {
	At      time.Time
	Gens    map[int]map[int64][]Loc // rank -> step -> where, this node first
	Missing []string                // agents that did not answer, with why

	// Replicas are the placement peers' copies of ranks' unreplicated
	// buffers: rank -> step -> where, this node first.
	Replicas map[int]map[int64][]Loc
	// Asked are the other nodes asked, and ReplyRanks the distinct ranks
	// each reply carried (generations and hosted ranks).
	Asked      []string
	ReplyRanks map[string]int
}

// NewView is an empty view gathered at at.
func NewView(at time.Time) *View {
	return &View{At: at, Gens: map[int]map[int64][]Loc{}, Replicas: map[int]map[int64][]Loc{}, ReplyRanks: map[string]int{}}
}

// Add records watermark w, reported by node ("" for this node). Only ranks'
// own generations and replicas count: assembled restores and loaded
// persisted copies are not sources.
func (v *View) Add(node string, w peer.Watermark) {
	gens := v.Gens
	switch w.Shard {
	case tmpfs.DefaultShard:
	case shard.Replica:
		gens = v.Replicas
	default:
		return
	}
	if gens[w.Rank] == nil {
		gens[w.Rank] = map[int64][]Loc{}
	}
	gens[w.Rank][w.Step] = append(gens[w.Rank][w.Step], Loc{Node: node, Key: peer.GenKey{Rank: w.Rank, Shard: w.Shard, Step: w.Step, Seq: w.Seq}, Ring: w.Ring})
}

// SortLocalFirst orders every rank's copies this node's first, keeping
// the order otherwise; the owner calls it once, after the last Add.
func (v *View) SortLocalFirst() {
	for _, all := range []map[int]map[int64][]Loc{v.Gens, v.Replicas} {
		for _, steps := range all {
			for _, locs := range steps {
				slices.SortStableFunc(locs, func(a, b Loc) int { return remote(a) - remote(b) })
			}
		}
	}
}

// Steps are the steps any of ranks has, newest first.
func (v *View) Steps(ranks []int) []int64 {
	set := map[int64]bool{}
	for _, r := range ranks {
		for st := range v.Gens[r] {
			set[st] = true
		}
	}
	out := slices.Collect(maps.Keys(set))
	slices.SortFunc(out, func(a, b int64) int { return int(b - a) })
	return out
}

// ReplicaSteps lists, newest first, the steps of rank's replicas.
func (v *View) ReplicaSteps(rank int) []int64 {
	out := make([]int64, 0, len(v.Replicas[rank]))
	for st := range v.Replicas[rank] {
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b int64) int { return int(b - a) })
	return out
}

// LocalFirst orders copies on this node before those on peers, keeping
// the order otherwise.
func LocalFirst(cs []Cand) {
	slices.SortStableFunc(cs, func(a, b Cand) int { return remote(a.Loc) - remote(b.Loc) })
}

func remote(l Loc) int {
	if l.Node != "" {
		return 1
	}
	return 0
}
