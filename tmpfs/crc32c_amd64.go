package tmpfs

import (
	"hash/crc32"

	"golang.org/x/sys/cpu"
)

// castagnoliAVX512 folds p into the inverted CRC-32C crc with AVX-512
// VPCLMULQDQ (crc32c_amd64.s); len(p) >= 256 and a multiple of 16.
//
// The constants are x^n mod P for P the Castagnoli polynomial 0x11EDC6F41,
// bit-reflected over 32 bits and shifted left by one (the form of Go's
// IEEE constants, which the same derivation reproduces): n = 2048±32
// folds four 512-bit accumulators, 512±32 one, 128+32 and 128-32 a
// 128-bit lane, 64 the final step; the Barrett pair is P and
// floor(x^64/P), reflected over 33 bits. TestCRC32CConstants recomputes
// them, and the tests compare every length and alignment with hash/crc32.
//
//go:noescape
func castagnoliAVX512(crc uint32, p []byte) uint32

// hasCLMUL512 is whether castagnoliAVX512 may run here.
var hasCLMUL512 = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL && cpu.X86.HasAVX512VPCLMULQDQ && cpu.X86.HasPCLMULQDQ && cpu.X86.HasSSE41

// clmulMin is the length from which the AVX-512 path runs; below it
// hash/crc32's SSE4.2 code is as fast.
const clmulMin = 512

// updateCRC is crc32.Update(crc, castagnoli, p), at AVX-512 VPCLMULQDQ
// speed where the CPU has it (same values: CRC-32C either way).
func updateCRC(crc uint32, p []byte) uint32 {
	if !hasCLMUL512 || len(p) < clmulMin {
		return crc32.Update(crc, castagnoli, p)
	}
	n := len(p) &^ 15
	crc = ^castagnoliAVX512(^crc, p[:n])
	if n == len(p) {
		return crc
	}
	return crc32.Update(crc, castagnoli, p[n:])
}
