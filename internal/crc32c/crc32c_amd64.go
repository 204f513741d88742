package crc32c

import (
	"hash/crc32"
	"unsafe"

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

// copyCastagnoliAVX512NT copies src into dst with non-temporal stores and
// folds the stored registers into the inverted CRC-32C crc
// (crc32c_amd64.s); len(dst) == len(src), a multiple of 256, at least
// 256; dst 64-byte aligned.
//
//go:noescape
func copyCastagnoliAVX512NT(crc uint32, dst, src []byte) uint32

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

// ntMin is the length from which copyCRC streams with non-temporal
// stores, as runtime.memmove does from 1 MiB: the destination is not read
// for ownership, which on memory-bound copies is a third of the traffic.
const ntMin = 1 << 20

// copyCRC is CopyCRC's fast path: for a long copy where the CPU has
// AVX-512 VPCLMULQDQ, one pass that loads each 256 bytes of src into
// registers, stores them to dst (non-temporal) and folds the same
// registers into the CRC, so the checksum is of exactly the bytes
// written. ok is false where it does not apply.
func copyCRC(crc uint32, dst, src []byte) (_ uint32, ok bool) {
	if !hasCLMUL512 || len(src) < ntMin {
		return crc, false
	}
	head := int(-uintptr(unsafe.Pointer(unsafe.SliceData(dst))) & 63)
	copy(dst[:head], src[:head])
	crc = updateCRC(crc, dst[:head])
	body := (len(src) - head) &^ 255
	crc = ^copyCastagnoliAVX512NT(^crc, dst[head:head+body], src[head:head+body])
	rest := head + body
	copy(dst[rest:], src[rest:])
	return updateCRC(crc, dst[rest:]), true
}
