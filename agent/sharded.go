package agent

import (
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/reft-hpc/reft/agent/erasure"
	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/agent/sg"
	"github.com/reft-hpc/reft/agent/shard"
	"github.com/reft-hpc/reft/spank/spec"
	"github.com/reft-hpc/reft/tmpfs"
)

// The sharded layout (REFT 4.1-4.2). With arc or aec in the SPEC and two
// or more DP ranks, a rank no longer snapshots its replicated buffers
// whole. Its replicated buffers, concatenated in registration order, are
// the slice its sharding group (SG) shares; the slice is cut into m
// balanced shards (sg.ShardRange), one per member, ring position = dp
// index. A save copies
//
//   - rep@shard: the member's own shard;
//   - rep@arc (arc): its ring successor's shard, cut from its own copy;
//   - rep@in (aec): the data pieces its parity units need, gathered in
//     erasure.Layout.Inputs order;
//
// and at commit the agent encodes rep@parity (aec) from rep@in, so the
// parity costs no network either. Buffers that are not replicated are
// saved whole, in sections of their names. Section names carry '@', which
// registered buffer names may not.
//
// A restore assembles the whole slice again (restoreSharded): own shard
// and ARC copy from the node's store, the other shards from the members'
// agents, lost shards decoded from parity.
//
// The names are agent/shard's, which the restore planner reads too.
const (
	secShard  = shard.Own
	secARC    = shard.ARC
	secIn     = shard.In
	secParity = shard.Parity
	secRep    = shard.Rep
	// AOR (sharded_aor.go).
	secAORGrad = shard.AORGrad
	secAOR     = shard.AOR
	secAORBase = shard.AORBase
	// restoreShard is the store key's shard of assembled restores.
	restoreShard = shard.Restored
	// persistedShard holds members' persisted generations loaded for a
	// persistent-tier restore.
	persistedShard = shard.Persisted
)

// encodeWorkers is the goroutines the parity encode (XOR or aec:K) uses
// at commit (erasure.NewCodec; BenchmarkAECEncode measures it against
// klauspost with the same count). One: the commit runs while the trainer
// computes its next step, so, like the client's copier
// (client.Options.Workers), it takes one core and leaves the others to the
// trainer. A decode runs at restore, when every rank waits for it, so the
// decoder uses every core (GOMAXPROCS).
const encodeWorkers = 1

// sliceBuf is a replicated buffer's place in the SG's slice.
type sliceBuf struct {
	name      string
	off, size int64
}

// sgInfo is a registration's sharding group and the geometry of its
// slice: everything the sharded save, commit and restore need.
type sgInfo struct {
	spec    spec.Spec
	layout  sg.Layout
	world   int
	rank    int
	pos, m  int   // ring position and members
	members []int // member ranks by ring position (the group's ring; dp order until fixed)
	arc     bool
	k       int // AEC parity units per stripe; 0 without aec
	w       int64
	slice   []sliceBuf
	other   []proto.BufferSpec // not replicated: saved whole
	el      *erasure.Layout
	codec   *erasure.Codec // encodes at commit, on encodeWorkers
	decoder *erasure.Codec // decodes at restore, on every core
	// whole: aor without arc or aec. The replicated buffers are saved
	// whole, each in a section of its name (every member's copy is the
	// same, so any member's restores a lost one); the slice is not cut.
	whole bool
	aor   []aorGroup // AOR optimizer shards, by gradient; nil without aor
}

// jobLayout is the job's parallel layout: dp, pp and tp from the SPEC, else
// from the client's layout string ("dp=4,pp=2,..."), else pure data
// parallel over the world.
func jobLayout(sp spec.Spec, clientLayout string, world int) (sg.Layout, error) {
	l := sg.Layout{DP: sp.DP, PP: sp.PP, TP: sp.TP}
	for _, f := range strings.FieldsFunc(clientLayout, func(r rune) bool { return r == ',' || r == ' ' || r == ';' }) {
		k, v, ok := strings.Cut(f, "=")
		n, err := strconv.Atoi(v)
		if !ok || err != nil || n < 1 {
			continue // other keys (zero1=...) are the client's own
		}
		switch k {
		case "dp":
			if l.DP == 0 {
				l.DP = n
			}
		case "pp":
			if l.PP == 0 {
				l.PP = n
			}
		case "tp":
			if l.TP == 0 {
				l.TP = n
			}
		}
	}
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

// newSGInfo decides whether a registration is sharded and lays it out;
// nil without error means the identity layout (no arc or aec, a single DP
// rank, or nothing replicated).
func newSGInfo(sp spec.Spec, req proto.Register) (*sgInfo, error) {
	if !sp.Enabled() || (!sp.ARC && !sp.AEC && !(sp.AOR && hasAOR(req.Buffers))) {
		return nil, nil
	}
	l, err := jobLayout(sp, req.Layout, req.World)
	if err != nil {
		return nil, err
	}
	if l.DP < 2 {
		return nil, nil
	}
	si := &sgInfo{spec: sp, layout: l, world: req.World, rank: req.Rank, m: l.DP, arc: sp.ARC}
	c := l.Coord(req.Rank)
	si.pos = c.DP
	si.members = si.dpOrder()
	if sp.AOR {
		if si.aor, err = newAORGroups(req.Buffers, c.DP, si.m); err != nil {
			return nil, err
		}
	}
	for _, b := range req.Buffers {
		if si.isAORGrad(b.Name) {
			continue // an input of the replicas, not state: only the successor's shard is saved
		}
		if b.Replicated {
			si.slice = append(si.slice, sliceBuf{name: b.Name, off: si.w, size: b.Size})
			si.w += b.Size
		} else {
			si.other = append(si.other, b)
		}
	}
	if si.w == 0 && si.aor == nil {
		return nil, nil
	}
	si.whole = !sp.ARC && !sp.AEC || si.w == 0
	if sp.AEC && !si.whole {
		si.k = max(sp.AECParity, 1)
		shards := sg.Shards(si.w, si.m)
		cut := make([]erasure.Range, len(shards))
		for i, r := range shards {
			cut[i] = erasure.Range{Off: int(r.Off), Len: int(r.Len)}
		}
		el, err := erasure.NewLayout(erasure.Params{Members: si.m, Parity: si.k, Size: int(si.w), ARC: si.arc, Shards: cut})
		if err != nil {
			return nil, fmt.Errorf("--reft=%s with dp=%d: %w", sp, si.m, err)
		}
		si.el = &el
		if si.codec, err = erasure.NewCodec(el, encodeWorkers); err != nil {
			return nil, err
		}
		if si.decoder, err = erasure.NewCodec(el, runtime.GOMAXPROCS(0)); err != nil {
			return nil, err
		}
	}
	return si, nil
}

// whyLocal says why a registration under a SPEC that protects across
// nodes got the node-local layout (si nil), "" when it did not or the
// SPEC does not protect.
func whyLocal(sp spec.Spec, req proto.Register, si *sgInfo) string {
	if si != nil || !sp.Enabled() || !sp.ARC && !sp.AEC && !sp.AOR {
		return ""
	}
	l, err := jobLayout(sp, req.Layout, req.World)
	switch {
	case err != nil:
		return "" // refused elsewhere
	case l.DP < 2:
		return "dp=1: its sharding group has no other member to keep a copy or parity"
	case !sp.ARC && !sp.AEC:
		return "aor keeps replicas only of ZeRO-1 optimizer state registered with aor objects, and this registration has none (an optimizer without state, such as SGD, or no ZeRO-1); add arc or aec (aor+arc) to protect the rest"
	}
	return "nothing is registered as replicated, so the rank has no sharding group; register the buffers that are the same on every DP rank as replicated"
}

// dpOrder is the group's members by DP index.
func (si *sgInfo) dpOrder() []int {
	c := si.layout.Coord(si.rank)
	out := make([]int, si.layout.DP)
	for dp := range out {
		out[dp] = si.layout.Rank(sg.Coord{DP: dp, PP: c.PP, TP: c.TP})
	}
	return out
}

// groupName is the group's name, "(pp=P,tp=T)".
func (si *sgInfo) groupName() string {
	c := si.layout.Coord(si.rank)
	return sg.Group{PP: c.PP, TP: c.TP}.Name()
}

// withRing is si on ring (the members' ranks in ring order).
func (si *sgInfo) withRing(ring []int) (*sgInfo, error) {
	if len(ring) != si.m || !sameMembers(ring, si.members) {
		return nil, fmt.Errorf("ring %v is not an order of SG %s's members %v", ring, si.groupName(), si.dpOrder())
	}
	c := *si
	c.members = slices.Clone(ring)
	c.pos = slices.Index(ring, si.rank)
	return &c, nil
}

func sameMembers(a, b []int) bool {
	x, y := slices.Clone(a), slices.Clone(b)
	slices.Sort(x)
	slices.Sort(y)
	return slices.Equal(x, y) && len(slices.Compact(x)) == len(a)
}

// succDP is the DP index of the ring successor: its entry in an AOR
// gradient's ZeRO-1 cuts, which are in DP order.
func (si *sgInfo) succDP() int { return si.layout.Coord(si.members[si.succ(si.pos)]).DP }

// shard is the slice range of ring position q's shard.
func (si *sgInfo) shard(q int) sg.Range { return sg.ShardRange(si.w, si.m, q) }

// succ is the ring position after q: the shard q's ARC copy holds.
func (si *sgInfo) succ(q int) int { return (q + 1) % si.m }

// pred is the ring position before q: the holder of q's ARC copy.
func (si *sgInfo) pred(q int) int { return (q - 1 + si.m) % si.m }

// slicePieces cuts slice range r into pieces of the replicated buffers,
// placed from offset at of section sec.
func (si *sgInfo) slicePieces(r sg.Range, sec int, at int64) []piece {
	var out []piece
	for _, b := range si.slice {
		lo, hi := max(r.Off, b.off), min(r.End(), b.off+b.size)
		if hi <= lo {
			continue
		}
		out = append(out, piece{buffer: b.name, offset: lo - b.off, size: hi - lo, section: sec, at: at + lo - r.Off})
	}
	return out
}

// sections lays out a save: the sections (agent-filled ones last) and the
// pieces the client copies. agentSecs names the sections the agent fills
// at commit, which the client never sees.
func (si *sgInfo) sections() (secs []tmpfs.BufferSpec, pieces []piece, agentSecs []string) {
	for _, b := range si.other {
		if b.Size > 0 {
			pieces = append(pieces, piece{buffer: b.Name, size: b.Size, section: len(secs)})
		}
		secs = append(secs, tmpfs.BufferSpec{Name: b.Name, Size: b.Size})
	}
	for _, g := range si.aor {
		r := g.shards[si.succDP()]
		if r[1] > 0 {
			pieces = append(pieces, piece{buffer: g.grad, offset: 4 * r[0], size: 4 * r[1], section: len(secs)})
		}
		secs = append(secs, tmpfs.BufferSpec{Name: secAORGrad + g.grad, Size: 4 * r[1], Replicated: true})
	}
	if si.aor != nil {
		defer func() { // agent-filled, last
			for _, g := range si.aor {
				for _, st := range g.states {
					secs = append(secs, tmpfs.BufferSpec{Name: secAOR + st.buf, Size: 4 * g.shards[si.succDP()][1]})
					agentSecs = append(agentSecs, secAOR+st.buf)
				}
			}
			secs = append(secs, tmpfs.BufferSpec{Name: secAORBase, Size: 8})
			agentSecs = append(agentSecs, secAORBase)
		}()
	}
	if si.whole {
		for _, b := range si.slice {
			if b.size > 0 {
				pieces = append(pieces, piece{buffer: b.name, size: b.size, section: len(secs)})
			}
			secs = append(secs, tmpfs.BufferSpec{Name: b.name, Size: b.size, Replicated: true})
		}
		return secs, pieces, agentSecs
	}
	add := func(name string, r sg.Range) {
		pieces = append(pieces, si.slicePieces(r, len(secs), 0)...)
		secs = append(secs, tmpfs.BufferSpec{Name: name, Size: r.Len, Replicated: true})
	}
	add(secShard, si.shard(si.pos))
	if si.arc {
		add(secARC, si.shard(si.succ(si.pos)))
	}
	if si.el != nil {
		var at int64
		sec := len(secs)
		for _, in := range si.el.Inputs(si.pos) {
			if in.Range.Len == 0 {
				continue
			}
			r := sg.Range{Off: int64(in.Range.Off), Len: int64(in.Range.Len)}
			pieces = append(pieces, si.slicePieces(r, sec, at)...)
			at += r.Len
		}
		secs = append(secs, tmpfs.BufferSpec{Name: secIn, Size: at, Replicated: true})
		secs = append(secs, tmpfs.BufferSpec{Name: secParity, Size: int64(si.el.ParitySize()), Replicated: true})
		agentSecs = append(agentSecs, secParity)
	}
	return secs, pieces, agentSecs
}

// encode fills the agent's sections of a save before it commits.
func (si *sgInfo) encode(o *tmpfs.Ongoing) error {
	if si.codec == nil {
		return nil
	}
	in, err := o.Buffer(secIn)
	if err != nil {
		return err
	}
	par, err := o.Buffer(secParity)
	if err != nil {
		return err
	}
	if err := si.codec.EncodeInputs(si.pos, in, par); err != nil {
		return fmt.Errorf("parity of ring position %d: %w", si.pos, err)
	}
	return o.ComputeChecksums(secParity)
}

// restoreSpec lays out an assembled restore: the whole slice in one
// section, every replicated buffer a region of it, the others whole.
func (si *sgInfo) restoreSpec(sources []tmpfs.Source, chunk int64) (tmpfs.Spec, error) {
	spec := tmpfs.Spec{ChunkSize: chunk, Sources: sources, Layout: "reft-restore"}
	spec.Buffers = append(spec.Buffers, tmpfs.BufferSpec{Name: secRep, Size: si.w, Replicated: true})
	for _, b := range si.other {
		spec.Buffers = append(spec.Buffers, tmpfs.BufferSpec{Name: b.Name, Size: b.Size})
	}
	secs, _, err := tmpfs.Plan(spec)
	if err != nil {
		return spec, err
	}
	for _, b := range si.slice {
		if b.size > 0 {
			spec.Regions = append(spec.Regions, tmpfs.Region{Buffer: b.name, Offset: 0, Size: b.size, ArenaOffset: secs[0].Offset + b.off})
		}
	}
	for i, b := range si.other {
		if b.Size > 0 {
			spec.Regions = append(spec.Regions, tmpfs.Region{Buffer: b.Name, Size: b.Size, ArenaOffset: secs[i+1].Offset})
		}
	}
	return spec, nil
}

// describe names the arena layout for the log.
func (si *sgInfo) describe() string {
	if si == nil {
		return "whole buffers"
	}
	s := fmt.Sprintf("sharded: SG of %d (ring %v), ring position %d, slice %d bytes, own shard", si.m, si.members, si.pos, si.w)
	if si.whole {
		s = fmt.Sprintf("SG of %d (ring %v), ring position %d, replicated buffers whole (%d bytes)", si.m, si.members, si.pos, si.w)
	}
	if si.aor != nil {
		s += " + AOR replica of position " + strconv.Itoa(si.succ(si.pos)) + "'s optimizer shard"
	}
	if si.arc {
		s += " + ARC copy of position " + strconv.Itoa(si.succ(si.pos))
	}
	if si.el != nil {
		s += fmt.Sprintf(" + %d parity unit(s) of %d bytes", si.k, si.el.PieceSize())
	}
	return s
}

// spec is the job's parsed SPEC (Info.Spec, normalized at start).
func (s *Server) spec() spec.Spec {
	s.specOnce.Do(func() {
		if sp, err := spec.Parse(s.info.Spec); err == nil {
			s.jobSpec = sp
		}
	})
	return s.jobSpec
}
