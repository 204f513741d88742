package agent

import (
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

// whyLocal says why a registration under a SPEC that protects across
// nodes got the node-local layout (si nil), "" when it did not or the
// SPEC does not protect.
func whyLocal(sp spec.Spec, req proto.Register, si *shard.Geometry) string {
	if si != nil || !sp.Enabled() || !sp.ARC && !sp.AEC && !sp.AOR {
		return ""
	}
	l, err := shard.JobLayout(sp, req.Layout, req.World)
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

// slicePieces cuts slice range r into pieces of the replicated buffers,
// placed from offset at of section sec.
func slicePieces(si *shard.Geometry, r sg.Range, sec int, at int64) []piece {
	var out []piece
	for _, b := range si.Slice {
		lo, hi := max(r.Off, b.Off), min(r.End(), b.Off+b.Size)
		if hi <= lo {
			continue
		}
		out = append(out, piece{buffer: b.Name, offset: lo - b.Off, size: hi - lo, section: sec, at: at + lo - r.Off})
	}
	return out
}

// saveSections lays out a save: the sections (agent-filled ones last) and the
// pieces the client copies. agentSecs names the sections the agent fills
// at commit, which the client never sees.
func saveSections(si *shard.Geometry) (secs []tmpfs.BufferSpec, pieces []piece, agentSecs []string) {
	for _, b := range si.Other {
		if b.Size > 0 {
			pieces = append(pieces, piece{buffer: b.Name, size: b.Size, section: len(secs)})
		}
		secs = append(secs, tmpfs.BufferSpec{Name: b.Name, Size: b.Size})
	}
	for _, g := range si.AOR {
		r := g.Shards[si.SuccDP()]
		if r[1] > 0 {
			pieces = append(pieces, piece{buffer: g.Grad, offset: 4 * r[0], size: 4 * r[1], section: len(secs)})
		}
		secs = append(secs, tmpfs.BufferSpec{Name: secAORGrad + g.Grad, Size: 4 * r[1], Replicated: true})
	}
	if si.AOR != nil {
		defer func() { // agent-filled, last
			for _, g := range si.AOR {
				for _, st := range g.States {
					secs = append(secs, tmpfs.BufferSpec{Name: secAOR + st.Buf, Size: 4 * g.Shards[si.SuccDP()][1]})
					agentSecs = append(agentSecs, secAOR+st.Buf)
				}
			}
			secs = append(secs, tmpfs.BufferSpec{Name: secAORBase, Size: 8})
			agentSecs = append(agentSecs, secAORBase)
		}()
	}
	if si.Whole {
		for _, b := range si.Slice {
			if b.Size > 0 {
				pieces = append(pieces, piece{buffer: b.Name, size: b.Size, section: len(secs)})
			}
			secs = append(secs, tmpfs.BufferSpec{Name: b.Name, Size: b.Size, Replicated: true})
		}
		return secs, pieces, agentSecs
	}
	add := func(name string, r sg.Range) {
		pieces = append(pieces, slicePieces(si, r, len(secs), 0)...)
		secs = append(secs, tmpfs.BufferSpec{Name: name, Size: r.Len, Replicated: true})
	}
	add(secShard, si.Shard(si.Pos))
	if si.ARC {
		add(secARC, si.Shard(si.Succ(si.Pos)))
	}
	if si.EL != nil {
		var at int64
		sec := len(secs)
		for _, in := range si.EL.Inputs(si.Pos) {
			if in.Range.Len == 0 {
				continue
			}
			r := sg.Range{Off: int64(in.Range.Off), Len: int64(in.Range.Len)}
			pieces = append(pieces, slicePieces(si, r, sec, at)...)
			at += r.Len
		}
		secs = append(secs, tmpfs.BufferSpec{Name: secIn, Size: at, Replicated: true})
		secs = append(secs, tmpfs.BufferSpec{Name: secParity, Size: int64(si.EL.ParitySize()), Replicated: true})
		agentSecs = append(agentSecs, secParity)
	}
	return secs, pieces, agentSecs
}
