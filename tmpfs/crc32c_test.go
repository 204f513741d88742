package tmpfs

import (
	"bytes"
	"errors"
	"hash/crc32"
	"math/bits"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestCRC32CMatchesHashCRC32 compares updateCRC (AVX-512 VPCLMULQDQ where
// the CPU has it) with hash/crc32 for every length up to a few KiB, at
// every alignment of the start, from several running CRCs, and for a
// few large lengths; and CopyCRC, which uses it, the same way.
func TestCRC32CMatchesHashCRC32(t *testing.T) {
	if !hasCLMUL512 {
		t.Log("no AVX-512 VPCLMULQDQ on this CPU: updateCRC is hash/crc32 itself")
	}
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 1<<20+64)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	want := func(crc uint32, p []byte) uint32 { return crc32.Update(crc, castagnoli, p) }
	for _, crc := range []uint32{0, 0xffffffff, 0x12345678} {
		for n := 0; n <= 4200; n++ {
			off := n % 64
			p := buf[off : off+n]
			if got, w := updateCRC(crc, p), want(crc, p); got != w {
				t.Fatalf("crc %#x, len %d, offset %d: got %#x, hash/crc32 %#x", crc, n, off, got, w)
			}
		}
		for _, n := range []int{fuseBlock - 1, fuseBlock, fuseBlock + 17, 1 << 20} {
			for _, off := range []int{0, 1, 8, 63} {
				p := buf[off : off+n]
				if got, w := updateCRC(crc, p), want(crc, p); got != w {
					t.Fatalf("crc %#x, len %d, offset %d: got %#x, hash/crc32 %#x", crc, n, off, got, w)
				}
			}
		}
	}
	// CopyCRC: below ntMin the block loop, from it (where the CPU has
	// AVX-512 VPCLMULQDQ) the non-temporal one-pass copy, with an
	// unaligned head and a tail at every offset of dst.
	big := make([]byte, 2<<20+64)
	for i := range big {
		big[i] = byte(r.Uint32())
	}
	out := make([]byte, len(big))
	for _, n := range []int{0, 1, 255, 256, 4 << 10, fuseBlock + 3, ntMin - 1, ntMin, ntMin + 255, ntMin + 1000, 2 << 20} {
		for _, off := range []int{0, 1, 17, 63} {
			src := big[3 : 3+n]
			dst := out[off : off+n]
			clear(out)
			if got, w := CopyCRC(7, dst, src), want(7, src); got != w {
				t.Fatalf("CopyCRC len %d, dst offset %d: got %#x, hash/crc32 %#x", n, off, got, w)
			}
			if string(dst) != string(src) {
				t.Fatalf("CopyCRC len %d, dst offset %d: the copy differs from its source", n, off)
			}
			if off > 0 && out[off-1] != 0 || out[off+n] != 0 {
				t.Fatalf("CopyCRC len %d, dst offset %d: wrote outside dst", n, off)
			}
		}
	}
}

// TestCRC32CFlippedBit: a single flipped bit anywhere in a block changes
// the checksum (CRC-32C detects every single-bit error).
func TestCRC32CFlippedBit(t *testing.T) {
	p := make([]byte, 2048)
	pattern(p, 5, "flip")
	orig := updateCRC(0, p)
	for bit := 0; bit < len(p)*8; bit++ {
		p[bit/8] ^= 1 << (bit % 8)
		if updateCRC(0, p) == orig {
			t.Fatalf("bit %d flipped: same CRC-32C", bit)
		}
		p[bit/8] ^= 1 << (bit % 8)
	}
}

// TestCRC32CConstants recomputes the folding constants of
// crc32c_amd64.s: the same derivation gives Go's IEEE constants.
func TestCRC32CConstants(t *testing.T) {
	xnmod := func(n int, p uint64) uint64 {
		r := uint64(1)
		for range n {
			r <<= 1
			if r&(1<<32) != 0 {
				r ^= p
			}
		}
		return r
	}
	k := func(n int, p uint64) uint64 { return bits.Reverse64(xnmod(n, p)) >> 32 << 1 }
	for _, c := range []struct {
		poly uint64
		n    int
		want uint64
	}{
		{0x104C11DB7, 544, 0x154442bd4}, // hash/crc32's IEEE r2r1
		{0x104C11DB7, 480, 0x1c6e41596},
		{0x104C11DB7, 64, 0x163cd6124},
		{0x11EDC6F41, 2080, 0xdcb17aa4},
		{0x11EDC6F41, 2016, 0xb9e02b86},
		{0x11EDC6F41, 544, 0x740eef02},
		{0x11EDC6F41, 480, 0x9e4addf8},
		{0x11EDC6F41, 160, 0xf20c0dfe},
		{0x11EDC6F41, 96, 0x14cd00bd6},
		{0x11EDC6F41, 64, 0xdd45aab8},
	} {
		if got := k(c.n, c.poly); got != c.want {
			t.Errorf("poly %#x: x^%d constant %#x, the assembly has %#x", c.poly, c.n, got, c.want)
		}
	}
	if got := bits.Reverse64(0x11EDC6F41) >> 31; got != 0x105ec76f1 {
		t.Errorf("reflected P %#x, the assembly has 0x105ec76f1", got)
	}
}

// TestFlippedBitAnywhereInArena flips one bit of a committed arena at the
// edges and in the middle of chunks that the one-pass non-temporal copy
// handles (4 MiB chunks, buffers not 64-byte aligned, short tails) as well
// as short chunks, and checks that the restore names exactly that chunk,
// restores every other one, and that the generation is never served again.
func TestFlippedBitAnywhereInArena(t *testing.T) {
	root := filepath.Join(t.TempDir(), "reft")
	s := openStore(t, root, func(o *Options) { o.ChunkSize = DefaultChunkSize; o.Keep = 1 })
	k := Key{Shard: DefaultShard}
	specs := []BufferSpec{{Name: "step", Size: 13}, {Name: "params", Size: 2*DefaultChunkSize + 12345}, {Name: "adam.m", Size: ntMin + 77}}
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
		{2, 0, 0, 0}, {2, 0, ntMin - 200, 4}, {2, 0, ntMin + 76, 7},
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
	specs := []BufferSpec{{Name: "params", Size: DefaultChunkSize + ntMin + 5}, {Name: "step", Size: 8}}
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
