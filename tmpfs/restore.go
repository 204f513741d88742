package tmpfs

import (
	"fmt"
	"github.com/reft-hpc/reft/internal/crc32c"
	"os"
	"path/filepath"
)

// Latest is the newest completed generation of k that is not marked bad.
func (s *Store) Latest(k Key) (Generation, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ks := s.keys[k]; ks != nil {
		for i := len(ks.gens) - 1; i >= 0; i-- {
			if !ks.gens[i].bad {
				return s.view(ks, ks.gens[i]), true
			}
		}
	}
	return Generation{}, false
}

// Generations lists k's committed generations, newest first, bad ones
// included and flagged.
func (s *Store) Generations(k Key) []Generation {
	s.mu.Lock()
	defer s.mu.Unlock()
	ks := s.keys[k]
	if ks == nil {
		return nil
	}
	out := make([]Generation, 0, len(ks.gens))
	for i := len(ks.gens) - 1; i >= 0; i-- {
		out = append(out, s.view(ks, ks.gens[i]))
	}
	return out
}

// Restore reads the newest completed generation of k into dst (one slice
// per buffer, of the saved sizes), verifying every chunk. It returns
// ErrNoGeneration (wrapped) when there is none, and a *ChecksumError when
// chunks are corrupt: every other chunk is then in dst, and the generation
// is marked bad so it is never served again.
func (s *Store) Restore(k Key, dst map[string][]byte) (Generation, error) {
	g, ok := s.Latest(k)
	if !ok {
		return Generation{}, fmt.Errorf("tmpfs: restore %s: %w", k, ErrNoGeneration)
	}
	return g, s.RestoreGeneration(g, dst)
}

// Reader holds a generation's arena open for reading: the store does not
// reuse it until Close, even if a newer commit releases the generation.
type Reader struct {
	s    *Store
	ks   *keyState
	g    *gen
	data []byte
}

// Open pins generation g for reading, e.g. to serve chunks to a peer.
func (s *Store) Open(g Generation) (*Reader, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ks := s.keys[g.Key]
	if ks != nil {
		for _, h := range ks.gens {
			if h.m.Seq == g.Seq {
				if h.bad {
					return nil, fmt.Errorf("tmpfs: %s step %d is marked bad: %w", g.Key, g.Step, ErrCorrupt)
				}
				h.slot.readers++
				return &Reader{s: s, ks: ks, g: h, data: h.slot.arena.Bytes()}, nil
			}
		}
	}
	return nil, fmt.Errorf("tmpfs: %s step %d (seq %d) is no longer in the store: %w", g.Key, g.Step, g.Seq, ErrNoGeneration)
}

// Manifest is the generation's manifest.
func (r *Reader) Manifest() *Manifest { return r.g.m }

// Chunk returns chunk i of buffer name, straight from the arena, and its
// recorded checksum. The caller verifies it where it lands.
func (r *Reader) Chunk(name string, i int) ([]byte, uint32, error) {
	b := r.g.m.buffer(name)
	if b == nil || i < 0 || i >= len(b.CRC32C) {
		return nil, 0, fmt.Errorf("tmpfs: step %d has no chunk %d of buffer %q", r.g.m.Step, i, name)
	}
	lo := b.Offset + int64(i)*r.g.m.ChunkSize
	hi := min(lo+r.g.m.ChunkSize, b.Offset+b.Size)
	return r.data[lo:hi], b.CRC32C[i], nil
}

// Close releases the pin.
func (r *Reader) Close() {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	if r.g != nil {
		r.g.slot.readers--
		r.g = nil
	}
}

// RestoreGeneration reads generation g into dst with every chunk verified;
// see Restore.
func (s *Store) RestoreGeneration(g Generation, dst map[string][]byte) error {
	r, err := s.Open(g)
	if err != nil {
		return err
	}
	defer r.Close()
	m := r.g.m
	if err := matchBuffers(m, dst); err != nil {
		return err
	}
	type task struct {
		buf   *Buffer
		chunk int
		dst   []byte
		src   []byte
	}
	var tasks []task
	for i := range m.Buffers {
		b := &m.Buffers[i]
		for c := range b.CRC32C {
			lo, hi := int64(c)*m.ChunkSize, min(int64(c+1)*m.ChunkSize, b.Size)
			tasks = append(tasks, task{b, c, dst[b.Name][lo:hi], r.data[b.Offset+lo : b.Offset+hi]})
		}
	}
	got := make([]uint32, len(tasks))
	parallel(len(tasks), s.opt.Workers, func(i int) {
		got[i] = crc32c.Copy(0, tasks[i].dst, tasks[i].src)
	})
	var bad []BadChunk
	for i, t := range tasks {
		if want := t.buf.CRC32C[t.chunk]; got[i] != want {
			lo := int64(t.chunk) * m.ChunkSize
			bad = append(bad, BadChunk{Buffer: t.buf.Name, Index: t.chunk, Offset: lo, Length: int64(len(t.dst)), Want: want, Got: got[i]})
		}
	}
	s.metrics.Restores.Add(1)
	if len(bad) == 0 {
		return nil
	}
	cerr := &ChecksumError{Key: g.Key, Step: g.Step, Seq: g.Seq, Chunks: bad}
	s.markBad(r.ks, r.g, cerr)
	return cerr
}

// markBad records a corrupt generation on disk and in memory, so neither
// this agent nor a restarted one serves it again.
func (s *Store) markBad(ks *keyState, g *gen, cerr *ChecksumError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.metrics.ChecksumFailures.Add(int64(len(cerr.Chunks)))
	if g.bad {
		return
	}
	g.bad = true
	s.metrics.BadGenerations.Add(1)
	if err := writeAtomic(g.dir, badFile, []byte(cerr.Error()+"\n"), s.owner); err != nil && !os.IsNotExist(err) {
		s.log.Warn().Err(err).Str("dir", g.dir).Msg("tmpfs: could not record the bad generation on disk; it is still refused until the agent restarts")
	}
	s.log.Error().Str("event", "checksum_mismatch").Int("rank", ks.key.Rank).Str("shard", ks.key.Shard).Int64("step", g.m.Step).
		Int("bad_chunks", len(cerr.Chunks)).Str("dir", filepath.Base(g.dir)).Msg(cerr.Error())
}

// Verify pins generation g and checks every chunk against its recorded
// checksum, spread over the store's workers, for readers that copy out of
// the arena themselves (a rank's client). On success the caller reads
// through the returned Reader and closes it. On a mismatch the generation
// is marked bad and a *ChecksumError returned.
func (s *Store) Verify(g Generation) (*Reader, error) {
	r, err := s.Open(g)
	if err != nil {
		return nil, err
	}
	s.metrics.Restores.Add(1)
	if err := r.Verify(); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// Verify checks every chunk of r's generation against its recorded
// checksum, spread over the store's workers. On a mismatch the generation
// is marked bad (on disk too, so no agent serves it again) and a
// *ChecksumError names every bad chunk; r stays open. The agent calls it
// when a client that verified a restore while copying reports chunks that
// failed: the store's own reading decides.
func (r *Reader) Verify() error {
	if r.g == nil {
		return fmt.Errorf("tmpfs: Verify of a closed reader")
	}
	m := r.g.m
	type task struct {
		buf   *Buffer
		chunk int
		data  []byte
	}
	var tasks []task
	for i := range m.Buffers {
		b := &m.Buffers[i]
		for c := range b.CRC32C {
			lo, hi := int64(c)*m.ChunkSize, min(int64(c+1)*m.ChunkSize, b.Size)
			tasks = append(tasks, task{b, c, r.data[b.Offset+lo : b.Offset+hi]})
		}
	}
	got := make([]uint32, len(tasks))
	parallel(len(tasks), r.s.opt.Workers, func(i int) { got[i] = crc32c.Checksum(tasks[i].data) })
	var bad []BadChunk
	for i, t := range tasks {
		if want := t.buf.CRC32C[t.chunk]; got[i] != want {
			bad = append(bad, BadChunk{Buffer: t.buf.Name, Index: t.chunk, Offset: int64(t.chunk) * m.ChunkSize,
				Length: int64(len(t.data)), Want: want, Got: got[i]})
		}
	}
	if len(bad) == 0 {
		return nil
	}
	cerr := &ChecksumError{Key: r.ks.key, Step: m.Step, Seq: m.Seq, Chunks: bad}
	r.s.markBad(r.ks, r.g, cerr)
	return cerr
}
