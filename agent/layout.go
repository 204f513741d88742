package agent

import (
	"fmt"
	"slices"
	"strings"

	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/agent/shard"
	"github.com/reft-hpc/reft/tmpfs"
)

// The arena layout decides which byte ranges of a rank's registered
// buffers its saves copy and where in the arena they land, as regions
// inside checksummed sections (docs/PROTOCOL.md, "Regions and sections").
// Clients copy whatever regions the agent names, so a layout can change
// here alone: a sharding-group member will copy its shard of the
// replicated slice, its ARC neighbour's shard and its XOR pieces.

// piece is a region placed in a section, before tmpfs.Plan has given the
// sections their arena offsets.
type piece struct {
	buffer       string
	offset, size int64 // in the buffer
	section      int   // index into the layout's sections
	at           int64 // offset in the section
}

// layoutFunc lays out registered buffers (already checked) as sections,
// laid out in order by tmpfs.Plan, and the non-empty pieces that fill
// them exactly.
type layoutFunc func(bufs []proto.BufferSpec) ([]tmpfs.BufferSpec, []piece)

// identityLayout puts every buffer whole in a section of its name: the
// layout of agents before regions, so manifests read the same to them.
func identityLayout(bufs []proto.BufferSpec) ([]tmpfs.BufferSpec, []piece) {
	secs := make([]tmpfs.BufferSpec, len(bufs))
	var ps []piece
	for i, b := range bufs {
		secs[i] = tmpfs.BufferSpec{Name: b.Name, Size: b.Size, Replicated: b.Replicated}
		if b.Size > 0 {
			ps = append(ps, piece{buffer: b.Name, size: b.Size, section: i})
		}
	}
	return secs, ps
}

// scatterLayout, for tests only, cuts every buffer into up to three pieces
// at odd offsets and deals them in reverse order into two sections: the
// regions then straddle chunk boundaries, share chunks, cross from one
// section to another within a buffer and lie in another order than the
// buffers, as sharded layouts will, so that clients' general region
// handling is exercised against a real agent.
func scatterLayout(bufs []proto.BufferSpec) ([]tmpfs.BufferSpec, []piece) {
	var all []piece
	for _, b := range bufs {
		cuts := []int64{0, b.Size/3 | 1, 2*b.Size/3 | 1, b.Size}
		for k := range 3 {
			lo := min(cuts[k], b.Size)
			hi := max(lo, min(cuts[k+1], b.Size))
			if hi > lo {
				all = append(all, piece{buffer: b.Name, offset: lo, size: hi - lo})
			}
		}
	}
	secs := []tmpfs.BufferSpec{{Name: "scatter-0"}, {Name: "scatter-1"}}
	for k := len(all) - 1; k >= 0; k-- {
		p := &all[k]
		p.section = k % 2
		p.at = secs[p.section].Size
		secs[p.section].Size += p.size
	}
	return secs, all
}

// testLayouts are the layouts SetTestLayout knows; "" is the agent's own.
var testLayouts = map[string]layoutFunc{"": identityLayout, "identity": identityLayout, "scatter": scatterLayout}

// SetTestLayout makes later registrations use a test layout: "scatter"
// (see scatterLayout) or "" / "identity" (the default). It is for client
// conformance tests (tests/conformance-agent); a job's agent never calls
// it. Call it before Serve.
func (s *Server) SetTestLayout(name string) error {
	f, ok := testLayouts[name]
	if !ok {
		return fmt.Errorf("agent: unknown test layout %q: use \"identity\" or \"scatter\"", name)
	}
	s.snaps.layout = f
	return nil
}

// checkBuffers checks a registration's buffers, whatever sections the
// layout makes of them.
func checkBuffers(bufs []proto.BufferSpec) error {
	seen := make(map[string]bool, len(bufs))
	for _, b := range bufs {
		switch {
		case b.Name == "" || len(b.Name) > 256:
			return fmt.Errorf("buffer name %q must have 1 to 256 bytes", b.Name)
		case strings.Contains(b.Name, "@"):
			return fmt.Errorf("buffer name %q contains '@', which the agent's own section names use; rename the buffer", b.Name)
		case seen[b.Name]:
			return fmt.Errorf("buffer %q is registered twice; give every buffer its own name", b.Name)
		case b.Size < 0:
			return fmt.Errorf("buffer %q has negative size %d", b.Name, b.Size)
		}
		seen[b.Name] = true
	}
	return nil
}

// planLayout is the tmpfs spec every generation of a registration uses:
// the layout's sections, the registered buffers as sources and the
// regions at their arena offsets; and the laid-out sections.
func (s *snapshots) planLayout(req proto.Register, si *shard.Geometry) (tmpfs.Spec, []tmpfs.Buffer, int64, []string, error) {
	layout := s.layout
	if layout == nil {
		layout = identityLayout
	}
	var agentSecs []string
	var sections []tmpfs.BufferSpec
	var pieces []piece
	if si != nil {
		sections, pieces, agentSecs = saveSections(si)
	} else {
		sections, pieces = layout(req.Buffers)
	}
	spec := tmpfs.Spec{Layout: req.Layout, ChunkSize: req.ChunkSize, Buffers: sections,
		Sources: make([]tmpfs.Source, len(req.Buffers)), Regions: make([]tmpfs.Region, len(pieces))}
	for i, b := range req.Buffers {
		spec.Sources[i] = tmpfs.Source{Name: b.Name, Size: b.Size, Replicated: b.Replicated}
	}
	secs, size, err := tmpfs.Plan(spec)
	if err != nil {
		return spec, nil, 0, nil, err
	}
	for i, p := range pieces {
		spec.Regions[i] = tmpfs.Region{Buffer: p.buffer, Offset: p.offset, Size: p.size, ArenaOffset: secs[p.section].Offset + p.at}
	}
	return spec, secs, size, agentSecs, nil
}

// replyLayout is what save and restore replies say about the arena.
type replyLayout struct {
	// places are the registered buffers, at the offset where each lies
	// whole (for clients from before regions), else -1; 0 when empty.
	places   []proto.BufferPlace
	regions  []proto.Region
	sections []proto.Section
}

func newReplyLayout(sources []tmpfs.Source, secs []tmpfs.Buffer, regions []tmpfs.Region) replyLayout {
	out := replyLayout{places: make([]proto.BufferPlace, len(sources)), regions: make([]proto.Region, len(regions)),
		sections: make([]proto.Section, len(secs))}
	for i, r := range regions {
		out.regions[i] = proto.Region{Buffer: r.Buffer, Offset: r.Offset, Size: r.Size, ArenaOffset: r.ArenaOffset}
	}
	for i, b := range secs {
		out.sections[i] = proto.Section{Name: b.Name, ArenaOffset: b.Offset, Size: b.Size}
	}
	// A client from before regions copies every buffer whole to its
	// offset and checksums it as the section of the buffer's name: right
	// only for the identity layout. Otherwise the offsets are -1, which it
	// refuses.
	whole := make(map[tmpfs.Region]bool, len(regions))
	for _, r := range regions {
		whole[r] = true
	}
	identity := len(secs) == len(sources)
	n := 0
	for i := 0; identity && i < len(secs); i++ {
		b, src := secs[i], sources[i]
		identity = b.Name == src.Name && b.Size == src.Size
		if src.Size > 0 {
			identity = identity && whole[tmpfs.Region{Buffer: src.Name, Size: src.Size, ArenaOffset: b.Offset}]
			n++
		}
	}
	identity = identity && n == len(regions)
	for i, src := range sources {
		off := int64(-1)
		switch {
		case src.Size == 0:
			off = 0 // nothing to copy
		case identity:
			off = secs[i].Offset
		}
		out.places[i] = proto.BufferPlace{Name: src.Name, Offset: off, Size: src.Size, Replicated: src.Replicated}
	}
	return out
}

// check holds the agent to the protocol's rules before a client sees the
// layout.
func (l replyLayout) check(arenaSize int64, save bool) error {
	sizes := make(map[string]int64, len(l.places))
	for _, p := range l.places {
		sizes[p.Name] = p.Size
	}
	if err := proto.CheckLayout(sizes, arenaSize, l.sections, l.regions, save); err != nil {
		return fmt.Errorf("the agent's arena layout breaks the protocol (a bug in the agent; report it with its log): %w", err)
	}
	return nil
}

// manifestSpec is the spec that lays a generation out again as its
// manifest says (a persisted generation loaded into the node-local store
// keeps the layout it was saved with, whatever the agent's is now).
func manifestSpec(m *tmpfs.Manifest) tmpfs.Spec {
	spec := tmpfs.Spec{Step: m.Step, Layout: m.Layout, ChunkSize: m.ChunkSize, Sources: m.SourceList(), Regions: m.RegionList(), Ring: m.Ring}
	for _, b := range m.Buffers {
		spec.Buffers = append(spec.Buffers, tmpfs.BufferSpec{Name: b.Name, Size: b.Size, Replicated: b.Replicated})
	}
	return spec
}

// sameSources checks that a generation was saved from exactly the
// registered buffers, in the same order.
func sameSources(have []tmpfs.Source, want []proto.BufferSpec) error {
	if len(have) != len(want) {
		names := func(n int, f func(int) string) []string {
			out := make([]string, n)
			for i := range out {
				out[i] = f(i)
			}
			return out
		}
		return fmt.Errorf("the generation has buffers %v, this rank registered %v: register the same buffers as when it was saved",
			names(len(have), func(i int) string { return have[i].Name }), names(len(want), func(i int) string { return want[i].Name }))
	}
	for i, w := range want {
		if h := have[i]; h.Name == w.Name && h.Size == w.Size {
			continue
		}
		j := slices.IndexFunc(have, func(b tmpfs.Source) bool { return b.Name == w.Name })
		if j < 0 {
			return fmt.Errorf("the generation has no buffer %q: register the same buffers as when it was saved", w.Name)
		}
		if have[j].Size == w.Size {
			return fmt.Errorf("buffer %q: registered in another order than when the generation was saved; register in the same order", w.Name)
		}
		return fmt.Errorf("buffer %q: the generation has %d bytes, this rank registered %d; the model or optimizer changed since the snapshot",
			w.Name, have[j].Size, w.Size)
	}
	return nil
}
