package shard

import (
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/reft-hpc/reft/agent/aor"
	"github.com/reft-hpc/reft/agent/erasure"
	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/agent/sg"
	"github.com/reft-hpc/reft/spank/spec"
	"github.com/reft-hpc/reft/tmpfs"
)

// EncodeWorkers is the goroutines the parity encode (XOR or aec:K) uses
// at commit (erasure.NewCodec; BenchmarkAECEncode measures it against
// klauspost with the same count). One: the commit runs while the trainer
// computes its next step, so, like the client's copier
// (client.Options.Workers), it takes one core and leaves the others to the
// trainer. A decode runs at restore, when every rank waits for it, so the
// decoder uses every core (GOMAXPROCS).
const EncodeWorkers = 1

// SliceBuf is a replicated buffer's place in the SG's slice.
type SliceBuf struct {
	Name      string
	Off, Size int64
}

// Geometry is a registration's sharding group and the geometry of its
// slice: everything the sharded save, commit and restore need.
type Geometry struct {
	Spec    spec.Spec
	Layout  sg.Layout
	World   int
	Rank    int
	Pos, M  int   // ring position and members
	Members []int // member ranks by ring position (the group's ring; dp order until fixed)
	ARC     bool
	K       int // AEC parity units per stripe; 0 without aec
	W       int64
	Slice   []SliceBuf
	Other   []proto.BufferSpec // not replicated: saved whole
	EL      *erasure.Layout
	Codec   *erasure.Codec // encodes at commit, on EncodeWorkers
	Decoder *erasure.Codec // decodes at restore, on every core
	// Whole: aor without arc or aec. The replicated buffers are saved
	// whole, each in a section of its name (every member's copy is the
	// same, so any member's restores a lost one); the slice is not cut.
	Whole bool
	AOR   AORGroups // AOR optimizer shards, by gradient; nil without aor
}

// JobLayout is the job's parallel layout: dp, pp and tp from the SPEC, else
// from the client's layout string ("dp=4,pp=2,..."), else pure data
// parallel over the world.
func JobLayout(sp spec.Spec, clientLayout string, world int) (sg.Layout, error) {
	l := sg.Layout{DP: sp.DP, PP: sp.PP, TP: sp.TP}
	fillLayout(&l, clientLayout)
	if l.PP == 0 {
		l.PP = 1
	}
	if l.TP == 0 {
		l.TP = 1
	}
	if l.DP == 0 {
		l.DP = world / (l.PP * l.TP)
	}
	if l.World() != world {
		return l, fmt.Errorf("layout dp=%d pp=%d tp=%d has %d ranks but the job has world = %d; give dp=, pp=, tp= in --reft or the client's layout so that dp*pp*tp = world",
			l.DP, l.PP, l.TP, l.World(), world)
	}
	return l, l.Validate()
}

// fillLayout sets the degrees of l the SPEC left 0 from the client's
// layout string.
func fillLayout(l *sg.Layout, clientLayout string) {
	for _, f := range strings.FieldsFunc(clientLayout, func(r rune) bool { return r == ',' || r == ' ' || r == ';' }) {
		k, v, ok := strings.Cut(f, "=")
		n, err := strconv.Atoi(v)
		if !ok || err != nil || n < 1 {
			continue // other keys (zero1=...) are the client's own
		}
		var d *int
		switch k {
		case "dp":
			d = &l.DP
		case "pp":
			d = &l.PP
		case "tp":
			d = &l.TP
		}
		if d != nil && *d == 0 {
			*d = n
		}
	}
}

// NewGeometry decides whether a registration is sharded and lays it out;
// nil without error means the identity layout (no arc or aec, a single DP
// rank, or nothing replicated).
func NewGeometry(sp spec.Spec, req proto.Register) (*Geometry, error) {
	if !acrossNodes(sp, req.Buffers) {
		return nil, nil
	}
	l, err := JobLayout(sp, req.Layout, req.World)
	if err != nil {
		return nil, err
	}
	if l.DP < 2 {
		return nil, nil
	}
	si := &Geometry{Spec: sp, Layout: l, World: req.World, Rank: req.Rank, M: l.DP, ARC: sp.ARC}
	c := l.Coord(req.Rank)
	si.Pos = c.DP
	si.Members = si.DPOrder()
	if sp.AOR {
		if si.AOR, err = newAORGroups(req.Buffers, c.DP, si.M); err != nil {
			return nil, err
		}
	}
	addBuffers(si, req.Buffers)
	if si.W == 0 && si.AOR == nil {
		return nil, nil
	}
	si.Whole = !sp.ARC && !sp.AEC || si.W == 0
	if sp.AEC && !si.Whole {
		if err := addCode(si, max(sp.AECParity, 1)); err != nil {
			return nil, err
		}
	}
	return si, nil
}

// addBuffers places the registration's replicated buffers in the slice, in
// registration order, and lists the others.
func addBuffers(si *Geometry, bufs []proto.BufferSpec) {
	for _, b := range bufs {
		if si.AOR.IsGrad(b.Name) {
			continue // an input of the replicas, not state: only the successor's shard is saved
		}
		if b.Replicated {
			si.Slice = append(si.Slice, SliceBuf{Name: b.Name, Off: si.W, Size: b.Size})
			si.W += b.Size
		} else {
			si.Other = append(si.Other, b)
		}
	}
}

// addCode lays out aec with k parity units per stripe over the slice's
// shards, and makes its encoder and decoder.
func addCode(si *Geometry, k int) error {
	si.K = k
	shards := sg.Shards(si.W, si.M)
	cut := make([]erasure.Range, len(shards))
	for i, r := range shards {
		cut[i] = erasure.Range{Off: int(r.Off), Len: int(r.Len)}
	}
	el, err := erasure.NewLayout(erasure.Params{Members: si.M, Parity: si.K, Size: int(si.W), ARC: si.ARC, Shards: cut})
	if err != nil {
		return fmt.Errorf("--reft=%s with dp=%d: %w", si.Spec, si.M, err)
	}
	si.EL = &el
	if si.Codec, err = erasure.NewCodec(el, EncodeWorkers); err != nil {
		return err
	}
	si.Decoder, err = erasure.NewCodec(el, runtime.GOMAXPROCS(0))
	return err
}

// acrossNodes says whether sp protects bufs across nodes: arc or aec, or
// aor with aor buffers to replicate.
func acrossNodes(sp spec.Spec, bufs []proto.BufferSpec) bool {
	return sp.Enabled() && (sp.ARC || sp.AEC || sp.AOR && HasAOR(bufs))
}

// DPOrder is the group's members by DP index.
func (si *Geometry) DPOrder() []int {
	c := si.Layout.Coord(si.Rank)
	out := make([]int, si.Layout.DP)
	for dp := range out {
		out[dp] = si.Layout.Rank(sg.Coord{DP: dp, PP: c.PP, TP: c.TP})
	}
	return out
}

// GroupName is the group's name, "(pp=P,tp=T)".
func (si *Geometry) GroupName() string {
	c := si.Layout.Coord(si.Rank)
	return sg.Group{PP: c.PP, TP: c.TP}.Name()
}

// WithRing is si on ring (the members' ranks in ring order).
func (si *Geometry) WithRing(ring []int) (*Geometry, error) {
	if len(ring) != si.M || !sameMembers(ring, si.Members) {
		return nil, fmt.Errorf("ring %v is not an order of SG %s's members %v", ring, si.GroupName(), si.DPOrder())
	}
	c := *si
	c.Members = slices.Clone(ring)
	c.Pos = slices.Index(ring, si.Rank)
	return &c, nil
}

func sameMembers(a, b []int) bool {
	x, y := slices.Clone(a), slices.Clone(b)
	slices.Sort(x)
	slices.Sort(y)
	return slices.Equal(x, y) && len(slices.Compact(x)) == len(a)
}

// SuccDP is the DP index of the ring successor: its entry in an AOR
// gradient's ZeRO-1 cuts, which are in DP order.
func (si *Geometry) SuccDP() int { return si.Layout.Coord(si.Members[si.Succ(si.Pos)]).DP }

// Shard is the slice range of ring position q's shard.
func (si *Geometry) Shard(q int) sg.Range { return sg.ShardRange(si.W, si.M, q) }

// Succ is the ring position after q: the shard q's ARC copy holds.
func (si *Geometry) Succ(q int) int { return (q + 1) % si.M }

// Pred is the ring position before q: the holder of q's ARC copy.
func (si *Geometry) Pred(q int) int { return (q - 1 + si.M) % si.M }

// Encode fills the agent's sections of a save before it commits.
func (si *Geometry) Encode(o *tmpfs.Ongoing) error {
	if si.Codec == nil {
		return nil
	}
	in, err := o.Buffer(In)
	if err != nil {
		return err
	}
	par, err := o.Buffer(Parity)
	if err != nil {
		return err
	}
	if err := si.Codec.EncodeInputs(si.Pos, in, par); err != nil {
		return fmt.Errorf("parity of ring position %d: %w", si.Pos, err)
	}
	return o.ComputeChecksums(Parity)
}

// RestoreSpec lays out an assembled restore: the whole slice in one
// section, every replicated buffer a region of it, the others whole.
func (si *Geometry) RestoreSpec(sources []tmpfs.Source, chunk int64) (tmpfs.Spec, error) {
	spec := tmpfs.Spec{ChunkSize: chunk, Sources: sources, Layout: "reft-restore"}
	spec.Buffers = append(spec.Buffers, tmpfs.BufferSpec{Name: Rep, Size: si.W, Replicated: true})
	for _, b := range si.Other {
		spec.Buffers = append(spec.Buffers, tmpfs.BufferSpec{Name: b.Name, Size: b.Size})
	}
	secs, _, err := tmpfs.Plan(spec)
	if err != nil {
		return spec, err
	}
	for _, b := range si.Slice {
		if b.Size > 0 {
			spec.Regions = append(spec.Regions, tmpfs.Region{Buffer: b.Name, Offset: 0, Size: b.Size, ArenaOffset: secs[0].Offset + b.Off})
		}
	}
	for i, b := range si.Other {
		if b.Size > 0 {
			spec.Regions = append(spec.Regions, tmpfs.Region{Buffer: b.Name, Size: b.Size, ArenaOffset: secs[i+1].Offset})
		}
	}
	return spec, nil
}

// Describe names the arena layout for the log.
func (si *Geometry) Describe() string {
	if si == nil {
		return "whole buffers"
	}
	s := fmt.Sprintf("sharded: SG of %d (ring %v), ring position %d, slice %d bytes, own shard", si.M, si.Members, si.Pos, si.W)
	if si.Whole {
		s = fmt.Sprintf("SG of %d (ring %v), ring position %d, replicated buffers whole (%d bytes)", si.M, si.Members, si.Pos, si.W)
	}
	if si.AOR != nil {
		s += " + AOR replica of position " + strconv.Itoa(si.Succ(si.Pos)) + "'s optimizer shard"
	}
	if si.ARC {
		s += " + ARC copy of position " + strconv.Itoa(si.Succ(si.Pos))
	}
	if si.EL != nil {
		s += fmt.Sprintf(" + %d parity unit(s) of %d bytes", si.K, si.EL.PieceSize())
	}
	return s
}

// AORGroup is one gradient's optimizer: its state buffers of this rank.
type AORGroup struct {
	Grad   string
	Opt    aor.Optimizer
	Shards [][2]int64 // every DP rank's cut, in float32 elements
	States []AORState
}

type AORState struct {
	Buf, State string
}

// HasAOR reports whether a registration has aor buffers.
func HasAOR(bufs []proto.BufferSpec) bool {
	return slices.ContainsFunc(bufs, func(b proto.BufferSpec) bool { return b.AOR != nil })
}

// newAORGroups collects a registration's aor buffers (already checked by
// proto.CheckAOR) by gradient, and checks them against the layout: one
// shard per DP rank and this rank's DP index as the index.
func newAORGroups(bufs []proto.BufferSpec, pos, m int) (AORGroups, error) {
	var out AORGroups
	for _, b := range bufs {
		a := b.AOR
		if a == nil {
			continue
		}
		if len(a.Shards) != m {
			return nil, fmt.Errorf("buffer %q: aor.shards has %d entries, the job has dp=%d: give one ZeRO-1 shard per DP rank", b.Name, len(a.Shards), m)
		}
		if a.Index != pos {
			return nil, fmt.Errorf("buffer %q: aor.index = %d, but this rank is DP index %d in the job's layout: send the rank's own DP index", b.Name, a.Index, pos)
		}
		i := slices.IndexFunc(out, func(g AORGroup) bool { return g.Grad == a.Grad })
		if i < 0 {
			out = append(out, AORGroup{Grad: a.Grad, Opt: a.Opt(), Shards: slices.Clone(a.Shards)})
			i = len(out) - 1
		}
		out[i].States = append(out[i].States, AORState{Buf: b.Name, State: a.State})
	}
	return out, nil
}

// AORGroups are a rank's AOR optimizer groups (one per gradient): which
// of its registered buffers are gradients and which optimizer state, and
// how they are sharded. Read-only once NewGeometry made them.
type AORGroups []AORGroup

// IsGrad reports whether buffer name is an AOR gradient.
func (gs AORGroups) IsGrad(name string) bool {
	return slices.ContainsFunc(gs, func(g AORGroup) bool { return g.Grad == name })
}

// StateOf reports whether buffer name is an AOR state buffer, and its
// group.
func (gs AORGroups) StateOf(name string) (*AORGroup, bool) {
	for i := range gs {
		for _, st := range gs[i].States {
			if st.Buf == name {
				return &gs[i], true
			}
		}
	}
	return nil, false
}

// StateNames lists the AOR state buffers.
func (gs AORGroups) StateNames() []string {
	var out []string
	for _, g := range gs {
		for _, st := range g.States {
			out = append(out, st.Buf)
		}
	}
	return out
}

// SuccBytes is the size of succ's shard of a state buffer of g.
func (si *Geometry) SuccBytes(g *AORGroup) int64 { return 4 * g.Shards[si.SuccDP()][1] }

// Placed are the unreplicated buffers that get peer copies: those AOR
// does not cover.
func (si *Geometry) Placed() []string {
	var out []string
	for _, b := range si.Other {
		if _, ok := si.AOR.StateOf(b.Name); !ok {
			out = append(out, b.Name)
		}
	}
	return out
}

// Copies is how many peer copies of the placed buffers the SPEC asks
// for: as many failed nodes as its modes tolerate, at least one (the
// failure analysis's count, agent/sg).
func (si *Geometry) Copies() int {
	n := si.K
	if si.ARC {
		n++
	}
	return max(n, 1)
}
