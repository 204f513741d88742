package tmpfs

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/reft-hpc/reft/internal/crc32c"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/reft-hpc/reft/hostmem"
)

// Ongoing is a generation being written. The rank writes its bytes into
// the arena (in process with CopyIn, or from another process through the
// mapping of ArenaPath and then SetChecksums); Commit makes it completed.
type Ongoing struct {
	s    *Store
	ks   *keyState
	m    *Manifest
	dir  string
	slot *slot
	done bool
}

// Begin starts generation spec.Step of k. An earlier generation of k that
// is still being written is discarded first. The arena comes from a
// released generation when one of the right size is free; otherwise it is
// allocated, which fails with ErrNoSpace or ErrOverBudget when the store
// cannot hold it. Nothing committed is touched by a failure.
func (s *Store) Begin(k Key, spec Spec) (*Ongoing, error) {
	bufs, size, err := plan(spec)
	if err != nil {
		return nil, err
	}
	cs := spec.ChunkSize
	if cs == 0 {
		cs = s.opt.ChunkSize
	}
	if cs < 4096 {
		return nil, fmt.Errorf("tmpfs: chunk size %d is below 4 KiB", cs)
	}
	for i := range bufs {
		bufs[i].CRC32C = make([]uint32, chunks(bufs[i].Size, cs))
	}
	if spec.Regions != nil && spec.Sources == nil {
		return nil, fmt.Errorf("tmpfs: step %d has regions but no sources; give the registered buffers they come from", spec.Step)
	}
	if err := checkRegions(spec.Sources, bufs, spec.Regions); err != nil {
		return nil, fmt.Errorf("tmpfs: step %d: %w", spec.Step, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ks, err := s.key(k)
	if err != nil {
		return nil, err
	}
	if ks.ongoing != nil {
		s.log.Warn().Str("event", "generation_discarded").Int("rank", k.Rank).Str("shard", k.Shard).Int64("step", ks.ongoing.m.Step).
			Int64("next_step", spec.Step).Msg("tmpfs: an unfinished generation is discarded by the next save")
		ks.ongoing.abortLocked()
	}
	s.metrics.Saves.Add(1)
	seq := ks.nextSeq
	o := &Ongoing{s: s, ks: ks, dir: filepath.Join(ks.dir, genName(spec.Step, seq)), m: &Manifest{
		Format: manifestFormat, JobID: s.opt.JobID, Rank: k.Rank, Shard: k.Shard, Step: spec.Step, Seq: seq,
		Layout: spec.Layout, ChunkSize: cs, Buffers: bufs,
		Sources: slices.Clone(spec.Sources), Regions: slices.Clone(spec.Regions), Ring: slices.Clone(spec.Ring),
	}}
	if err := s.mkdir(o.dir); err != nil {
		return nil, s.saveFailed(k, spec.Step, size, err)
	}
	ks.nextSeq++
	s.hook("begin:dir")
	if o.slot, err = s.takeSlot(ks, size); err != nil {
		os.RemoveAll(o.dir)
		return nil, s.saveFailed(k, spec.Step, size, err)
	}
	o.slot.owner = o
	o.m.Arena, o.m.ArenaSize = o.slot.name, o.slot.arena.Size()
	ks.ongoing = o
	s.hook("begin:arena")
	return o, nil
}

// Preallocate creates the arenas that saves of spec will use (one for the
// ongoing generation, one for the newest completed one, Options.Keep for
// older ones and Options.Spare for pinned ones), so their cost (the
// kernel zeroing and mapping every page) and any ErrNoSpace or
// ErrOverBudget come at registration, not in the first saves.
func (s *Store) Preallocate(k Key, spec Spec) error {
	_, size, err := plan(spec)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ks, err := s.key(k)
	if err != nil {
		return err
	}
	have := 0
	for _, sl := range ks.arenas {
		if sl.want == size {
			have++
		}
	}
	for ; have < s.opt.Keep+2+s.opt.Spare; have++ {
		if _, err := s.newSlot(ks, size); err != nil {
			return s.saveFailed(k, spec.Step, size, fmt.Errorf("preallocate: %w", err))
		}
	}
	return nil
}

// takeSlot finds a free arena of the right size, or allocates one.
func (s *Store) takeSlot(ks *keyState, size int64) (*slot, error) {
	for _, sl := range ks.arenas {
		if sl.free() && sl.want == size {
			return sl, nil
		}
	}
	// A free arena of another size is memory this job no longer needs.
	for name, sl := range ks.arenas {
		if sl.free() {
			s.metrics.StoredBytes.Add(-sl.arena.Size())
			if err := sl.arena.Remove(); err != nil {
				return nil, err
			}
			delete(ks.arenas, name)
		}
	}
	return s.newSlot(ks, size)
}

// newSlot allocates a new arena for ks.
func (s *Store) newSlot(ks *keyState, size int64) (*slot, error) {
	name := arenaName(ks.nextArn)
	a, err := s.alloc.Create(filepath.Join(ks.dir, name), size, s.owner)
	if err != nil {
		return nil, err
	}
	ks.nextArn++
	s.metrics.StoredBytes.Add(a.Size())
	sl := &slot{name: name, want: size, arena: a}
	ks.arenas[name] = sl
	return sl, nil
}

// trimSpares frees free arenas beyond what the rank needs: Keep+2+Spare
// arenas in all (what Preallocate made), of which 1+Spare free (the next
// save's and the pinned generations' spares). More is memory the job does
// not use; fewer would make a later save allocate.
func (s *Store) trimSpares(ks *keyState) {
	total, limit, free := len(ks.arenas), s.opt.Keep+2+s.opt.Spare, 0
	for name, sl := range ks.arenas {
		if !sl.free() {
			continue
		}
		if free <= s.opt.Spare || total <= limit {
			free++
			continue
		}
		s.metrics.StoredBytes.Add(-sl.arena.Size())
		if err := sl.arena.Remove(); err != nil {
			s.log.Warn().Err(err).Msg("tmpfs: free a spare arena")
		}
		delete(ks.arenas, name)
		total--
	}
}

// saveFailed counts and logs a failed save and returns its error.
func (s *Store) saveFailed(k Key, step, size int64, err error) error {
	err = classify(err)
	s.metrics.SaveFailures.Add(1)
	reason := "error"
	switch {
	case errors.Is(err, ErrNoSpace):
		s.metrics.NoSpace.Add(1)
		reason = "no_space"
	case errors.Is(err, ErrOverBudget):
		s.metrics.OverBudget.Add(1)
		reason = "over_budget"
	}
	s.log.Error().Str("event", "save_failed").Str("reason", reason).Int("rank", k.Rank).Str("shard", k.Shard).
		Int64("step", step).Int64("bytes", size).Err(err).
		Msg("tmpfs: save failed; training can go on, the last completed generation is intact")
	return fmt.Errorf("tmpfs: save %s step %d: %w", k, step, err)
}

// Key is the rank and shard being written.
func (o *Ongoing) Key() Key { return o.ks.key }

// Step is the generation's step.
func (o *Ongoing) Step() int64 { return o.m.Step }

// Manifest is the layout the writer must follow: each buffer's offset in
// the arena and the chunk size for its checksums.
func (o *Ongoing) Manifest() Manifest { return *o.m }

// Arena is the agent's mapping of the arena.
func (o *Ongoing) Arena() *hostmem.Arena { return o.slot.arena }

// ArenaPath is the arena file for a rank to map with hostmem.MapShared (or
// pass Arena().File() to it with SCM_RIGHTS). The path is reused by later
// generations, so a rank can keep its mapping.
func (o *Ongoing) ArenaPath() string { return o.slot.arena.FilePath() }

// Buffer is the arena's region for one buffer.
func (o *Ongoing) Buffer(name string) ([]byte, error) {
	b := o.m.buffer(name)
	if b == nil {
		return nil, fmt.Errorf("tmpfs: generation step %d has no buffer %q", o.m.Step, name)
	}
	return o.slot.arena.Bytes()[b.Offset : b.Offset+b.Size], nil
}

// CopyIn copies every buffer of src into the arena and records its chunk
// checksums, with the checksum fused into the copy and chunks spread over
// the store's workers. src must hold exactly the buffers of the Spec.
func (o *Ongoing) CopyIn(src map[string][]byte) error {
	if err := matchBuffers(o.m, src); err != nil {
		return err
	}
	// Pin the arena while copying: should a newer Begin discard this
	// generation meanwhile, it must not hand the same arena out again.
	o.s.mu.Lock()
	if o.done {
		o.s.mu.Unlock()
		return fmt.Errorf("tmpfs: step %d is no longer being written (aborted, committed or superseded)", o.m.Step)
	}
	o.slot.readers++
	o.s.mu.Unlock()
	defer func() {
		o.s.mu.Lock()
		o.slot.readers--
		o.s.mu.Unlock()
	}()
	type task struct {
		dst, src []byte
		crc      *uint32
	}
	var tasks []task
	mem, cs := o.slot.arena.Bytes(), o.m.ChunkSize
	for i := range o.m.Buffers {
		b := &o.m.Buffers[i]
		s := src[b.Name]
		for c := range b.CRC32C {
			lo, hi := int64(c)*cs, min(int64(c+1)*cs, b.Size)
			tasks = append(tasks, task{mem[b.Offset+lo : b.Offset+hi], s[lo:hi], &b.CRC32C[c]})
		}
	}
	parallel(len(tasks), o.s.opt.Workers, func(i int) {
		t := tasks[i]
		*t.crc = crc32c.Copy(0, t.dst, t.src)
	})
	o.s.hook("write:done")
	return nil
}

// SetChecksums records the chunk checksums a rank computed while it copied
// buffer name into the arena itself.
func (o *Ongoing) SetChecksums(name string, crcs []uint32) error {
	b := o.m.buffer(name)
	if b == nil {
		return fmt.Errorf("tmpfs: generation step %d has no buffer %q", o.m.Step, name)
	}
	if len(crcs) != len(b.CRC32C) {
		return fmt.Errorf("tmpfs: buffer %q: %d checksums for %d chunks of %d bytes", name, len(crcs), len(b.CRC32C), o.m.ChunkSize)
	}
	copy(b.CRC32C, crcs)
	return nil
}

// ComputeChecksums checksums buffer name from the arena, for writers that
// cannot (a pure-Python client).
func (o *Ongoing) ComputeChecksums(name string) error {
	p, err := o.Buffer(name)
	if err != nil {
		return err
	}
	return o.SetChecksums(name, ChunkCRCs(p, o.m.ChunkSize, o.s.opt.Workers))
}

func matchBuffers(m *Manifest, bufs map[string][]byte) error {
	if len(bufs) != len(m.Buffers) {
		return fmt.Errorf("tmpfs: step %d has %d buffers, caller gave %d; register the same buffers as at save time", m.Step, len(m.Buffers), len(bufs))
	}
	for _, b := range m.Buffers {
		p, ok := bufs[b.Name]
		if !ok {
			return fmt.Errorf("tmpfs: step %d: caller has no buffer %q", m.Step, b.Name)
		}
		if int64(len(p)) != b.Size {
			return fmt.Errorf("tmpfs: step %d: buffer %q is %d bytes, the generation has %d", m.Step, b.Name, len(p), b.Size)
		}
	}
	return nil
}

// Generation is a committed generation of one rank and shard.
type Generation struct {
	Key       Key
	Step      int64
	Seq       uint64
	Bad       bool
	ArenaPath string
	Manifest  Manifest
}

func (s *Store) view(ks *keyState, g *gen) Generation {
	m := *g.m
	m.Buffers = make([]Buffer, len(g.m.Buffers))
	for i, b := range g.m.Buffers {
		b.CRC32C = slices.Clone(b.CRC32C)
		m.Buffers[i] = b
	}
	m.Sources, m.Regions = slices.Clone(g.m.Sources), slices.Clone(g.m.Regions)
	path := filepath.Join(ks.dir, g.m.Arena)
	if sl := ks.arenas[g.m.Arena]; sl != nil && sl.arena != nil {
		path = sl.arena.FilePath() // the file itself, for ranks that open it with O_NOFOLLOW
	}
	return Generation{Key: ks.key, Step: g.m.Step, Seq: g.m.Seq, Bad: g.bad, ArenaPath: path, Manifest: m}
}

// Commit makes the generation completed: the bytes are in place, the
// manifest goes in place, and the commit marker is renamed in last. Only
// then are older generations released. On error nothing committed is lost
// and this generation is discarded.
func (o *Ongoing) Commit() (Generation, error) {
	s := o.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if o.done || o.ks.ongoing != o {
		return Generation{}, fmt.Errorf("tmpfs: commit %s step %d: it is no longer being written (aborted or superseded by a newer save)", o.ks.key, o.m.Step)
	}
	o.m.Created = time.Now().UTC()
	s.hook("commit:bytes")
	raw, err := json.Marshal(o.m)
	if err != nil {
		return Generation{}, err
	}
	if err := writeAtomic(o.dir, manifestFile, raw, s.owner); err != nil {
		o.abortLocked()
		return Generation{}, s.saveFailed(o.ks.key, o.m.Step, o.m.ArenaSize, fmt.Errorf("write manifest: %w", err))
	}
	s.hook("commit:manifest")
	mk, _ := json.Marshal(marker{Step: o.m.Step, Seq: o.m.Seq, ManifestBytes: len(raw), ManifestCRC: crc32c.Checksum(raw)})
	if err := writeAtomic(o.dir, markerFile, mk, s.owner); err != nil {
		o.abortLocked()
		return Generation{}, s.saveFailed(o.ks.key, o.m.Step, o.m.ArenaSize, fmt.Errorf("write commit marker: %w", err))
	}
	s.hook("commit:marker")
	o.done = true
	g := &gen{m: o.m, dir: o.dir, slot: o.slot}
	o.slot.owner = g
	o.ks.ongoing = nil
	o.ks.gens = append(o.ks.gens, g)
	s.metrics.Commits.Add(1)
	s.prune(o.ks)
	s.trimSpares(o.ks)
	s.hook("commit:released")
	return s.view(o.ks, g), nil
}

// Abort discards the generation; the completed ones are untouched.
func (o *Ongoing) Abort() {
	o.s.mu.Lock()
	defer o.s.mu.Unlock()
	if !o.done && o.ks.ongoing == o {
		o.abortLocked()
	}
}

func (o *Ongoing) abortLocked() {
	o.done = true
	o.ks.ongoing = nil
	if o.slot != nil && o.slot.owner == o {
		o.slot.owner = nil
	}
	if err := os.RemoveAll(o.dir); err != nil {
		o.s.log.Warn().Err(err).Msg("tmpfs: remove aborted generation")
	}
	o.s.metrics.Aborted.Add(1)
}
