package tmpfs

import (
	"bytes"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/reft-hpc/reft/internal/crc32c"
)

// TestFlippedBitAnywhereInArena flips one bit of a committed arena at the
// edges and in the middle of chunks that the one-pass non-temporal copy
// handles (4 MiB chunks, buffers not 64-byte aligned, short tails) as well
// as short chunks, and checks that the restore names exactly that chunk,
// restores every other one, and that the generation is never served again.
func TestFlippedBitAnywhereInArena(t *testing.T) {
	root := filepath.Join(t.TempDir(), "reft")
	s := openStore(t, root, func(o *Options) { o.ChunkSize = DefaultChunkSize; o.Keep = 1 })
	k := Key{Shard: DefaultShard}
	specs := []BufferSpec{{Name: "step", Size: 13}, {Name: "params", Size: 2*DefaultChunkSize + 12345}, {Name: "adam.m", Size: crc32c.NTMin + 77}}
	type spot struct {
		buf   int   // index in specs
		chunk int   // chunk index
		at    int64 // byte offset in the chunk
		bit   uint
	}
	r := rand.New(rand.NewPCG(3, 4))
	spots := []spot{
		{0, 0, 0, 0}, {0, 0, 12, 7},
		{1, 0, 0, 0}, {1, 0, 1, 3}, {1, 0, 63, 7}, {1, 0, 64, 1}, {1, 0, DefaultChunkSize / 2, 5}, {1, 0, DefaultChunkSize - 1, 7},
		{1, 1, int64(r.IntN(DefaultChunkSize)), uint(r.IntN(8))}, {1, 2, 0, 2}, {1, 2, 12344, 6},
		{2, 0, 0, 0}, {2, 0, crc32c.NTMin - 200, 4}, {2, 0, crc32c.NTMin + 76, 7},
	}
	for i, sp := range spots {
		step := int64(i + 1)
		g := save(t, s, k, step, specs)
		b := g.Manifest.Buffers[sp.buf]
		f, err := os.OpenFile(g.ArenaPath, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		off := b.Offset + int64(sp.chunk)*DefaultChunkSize + sp.at
		one := make([]byte, 1)
		if _, err := f.ReadAt(one, off); err != nil {
			t.Fatal(err)
		}
		one[0] ^= 1 << sp.bit
		if _, err := f.WriteAt(one, off); err != nil {
			t.Fatal(err)
		}
		f.Close()

		got := emptyState(specs)
		_, err = s.Restore(k, got)
		var ce *ChecksumError
		if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%+v: restore of a generation with a flipped bit = %v, want a *ChecksumError", sp, err)
		}
		if len(ce.Chunks) != 1 || ce.Chunks[0].Buffer != specs[sp.buf].Name || ce.Chunks[0].Index != sp.chunk {
			t.Fatalf("%+v: reported %+v, want only chunk %d of %q", sp, ce.Chunks, sp.chunk, specs[sp.buf].Name)
		}
		want := stateFor(step, specs)
		for j, spec := range specs {
			w, gb := want[spec.Name], got[spec.Name]
			if j == sp.buf {
				lo := int64(sp.chunk) * DefaultChunkSize
				hi := min(lo+DefaultChunkSize, spec.Size)
				w, gb = append(slices.Clone(w[:lo]), w[hi:]...), append(slices.Clone(gb[:lo]), gb[hi:]...)
			}
			if !bytes.Equal(gb, w) {
				t.Fatalf("%+v: the good chunks of %q were not restored", sp, spec.Name)
			}
		}
		if l, ok := s.Latest(k); ok && l.Step == step {
			t.Fatalf("%+v: the corrupt step %d is still the latest", sp, step)
		}
	}
}

// TestManifestChecksumsAreHashCRC32: the manifest format and its checksum
// algorithm are unchanged by the AVX-512 path (no algorithm field is
// needed): every chunk checksum a save records, through the one-pass
// non-temporal copy or the block loop, is hash/crc32's CRC-32C of the
// arena's bytes, so generations written before (and persisted files and
// peers' chunks, which carry the same lists) verify as they did.
func TestManifestChecksumsAreHashCRC32(t *testing.T) {
	root := filepath.Join(t.TempDir(), "reft")
	s := openStore(t, root, func(o *Options) { o.ChunkSize = DefaultChunkSize })
	k := Key{Shard: DefaultShard}
	specs := []BufferSpec{{Name: "params", Size: DefaultChunkSize + crc32c.NTMin + 5}, {Name: "step", Size: 8}}
	g := save(t, s, k, 1, specs)
	arena, err := os.ReadFile(g.ArenaPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range g.Manifest.Buffers {
		n := 0
		for lo := int64(0); lo < b.Size; lo += DefaultChunkSize {
			hi := min(lo+DefaultChunkSize, b.Size)
			if want := crc32.Checksum(arena[b.Offset+lo:b.Offset+hi], castagnoli); b.CRC32C[n] != want {
				t.Fatalf("buffer %q chunk %d: manifest has %#x, hash/crc32 gives %#x", b.Name, n, b.CRC32C[n], want)
			}
			n++
		}
		if n != len(b.CRC32C) {
			t.Fatalf("buffer %q: %d checksums for %d chunks", b.Name, len(b.CRC32C), n)
		}
	}
	got := emptyState(specs)
	if _, err := s.Restore(k, got); err != nil {
		t.Fatal(err)
	}
	checkState(t, got, 1, specs)
}
