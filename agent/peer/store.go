package peer

import (
	"errors"
	"fmt"

	"github.com/reft-hpc/reft/tmpfs"
)

// StoreSource serves the node-local snapshot store.
type StoreSource struct {
	Store *tmpfs.Store
}

// Watermarks implements ChunkSource: every committed generation not marked
// bad, newest first per rank and shard.
func (s StoreSource) Watermarks(ranks []int) []Watermark {
	out := []Watermark{}
	for _, k := range s.Store.Keys() {
		if ranks != nil && !containsInt(ranks, k.Rank) {
			continue
		}
		for _, g := range s.Store.Generations(k) {
			if g.Bad {
				continue
			}
			var n int64
			for _, b := range g.Manifest.Buffers {
				n += b.Size
			}
			out = append(out, Watermark{Rank: k.Rank, Shard: k.Shard, Step: g.Step, Seq: g.Seq, Bytes: n, Ring: g.Manifest.Ring})
		}
	}
	return out
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// Open implements ChunkSource: it pins the generation with Store.Open, so
// a newer commit cannot reuse its arena while chunks stream out of it.
func (s StoreSource) Open(k GenKey) (SourceGeneration, error) {
	key := tmpfs.Key{Rank: k.Rank, Shard: k.Shard}
	for _, g := range s.Store.Generations(key) {
		if g.Step != k.Step || g.Seq != k.Seq {
			continue
		}
		if g.Bad {
			return nil, fmt.Errorf("%s: %w", k, ErrCorrupt)
		}
		r, err := s.Store.Open(g)
		switch {
		case errors.Is(err, tmpfs.ErrCorrupt):
			return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
		case errors.Is(err, tmpfs.ErrNoGeneration):
			return nil, fmt.Errorf("%w: %w", ErrNotFound, err)
		case err != nil:
			return nil, err
		}
		m := r.Manifest()
		info := &GenInfo{ChunkSize: m.ChunkSize, Buffers: make([]BufferInfo, len(m.Buffers))}
		for i, b := range m.Buffers {
			info.Buffers[i] = BufferInfo{Name: b.Name, Size: b.Size, CRC32C: b.CRC32C}
		}
		return &storeGen{r: r, info: info}, nil
	}
	return nil, fmt.Errorf("%s is not in this node's store (released, or never here): %w", k, ErrNotFound)
}

type storeGen struct {
	r    *tmpfs.Reader
	info *GenInfo
}

func (g *storeGen) Info() *GenInfo { return g.info }

func (g *storeGen) Chunk(buffer string, i int) ([]byte, uint32, error) {
	b, crc, err := g.r.Chunk(buffer, i)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	return b, crc, nil
}

func (g *storeGen) Close() { g.r.Close() }
