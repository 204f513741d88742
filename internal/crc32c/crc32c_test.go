package crc32c

import (
	"hash/crc32"
	"math/bits"
	"math/rand/v2"
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
		for _, n := range []int{FuseBlock - 1, FuseBlock, FuseBlock + 17, 1 << 20} {
			for _, off := range []int{0, 1, 8, 63} {
				p := buf[off : off+n]
				if got, w := updateCRC(crc, p), want(crc, p); got != w {
					t.Fatalf("crc %#x, len %d, offset %d: got %#x, hash/crc32 %#x", crc, n, off, got, w)
				}
			}
		}
	}
	// Copy: below ntMin the block loop, from it (where the CPU has
	// AVX-512 VPCLMULQDQ) the non-temporal one-pass copy, with an
	// unaligned head and a tail at every offset of dst.
	big := make([]byte, 2<<20+64)
	for i := range big {
		big[i] = byte(r.Uint32())
	}
	out := make([]byte, len(big))
	for _, n := range []int{0, 1, 255, 256, 4 << 10, FuseBlock + 3, ntMin - 1, ntMin, ntMin + 255, ntMin + 1000, 2 << 20} {
		for _, off := range []int{0, 1, 17, 63} {
			src := big[3 : 3+n]
			dst := out[off : off+n]
			clear(out)
			if got, w := Copy(7, dst, src), want(7, src); got != w {
				t.Fatalf("Copy len %d, dst offset %d: got %#x, hash/crc32 %#x", n, off, got, w)
			}
			if string(dst) != string(src) {
				t.Fatalf("Copy len %d, dst offset %d: the copy differs from its source", n, off)
			}
			if off > 0 && out[off-1] != 0 || out[off+n] != 0 {
				t.Fatalf("Copy len %d, dst offset %d: wrote outside dst", n, off)
			}
		}
	}
}

// TestCRC32CFlippedBit: a single flipped bit anywhere in a block changes
// the checksum (CRC-32C detects every single-bit error).
func TestCRC32CFlippedBit(t *testing.T) {
	p := make([]byte, 2048)
	r := rand.New(rand.NewPCG(5, 0))
	for i := range p {
		p[i] = byte(r.Uint32())
	}
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
