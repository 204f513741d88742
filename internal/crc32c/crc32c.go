// Package crc32c is CRC-32C (Castagnoli), the checksum of every reft
// snapshot chunk, manifest and peer frame, at AVX-512 VPCLMULQDQ speed
// where the CPU has it, and the fused copy-and-checksum that the store
// and the Go client copy arenas with. Its values are hash/crc32's
// Castagnoli values on every CPU (the tests compare them).
//
// A leaf: it imports only the standard library and x/sys/cpu, so the
// client links it without the store (tmpfs).
package crc32c

import "hash/crc32"

// castagnoli is hash/crc32's table, for the short lengths and the CPUs
// without the AVX-512 path.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Accelerated is whether the AVX-512 VPCLMULQDQ paths run on this CPU
// (benchmarks report it).
func Accelerated() bool { return hasCLMUL512 }

// NTMin is the length from which Copy streams with non-temporal stores
// where the CPU has AVX-512 VPCLMULQDQ; tests use its edges.
const NTMin = ntMin

// FuseBlock is the step of the fused copy below NTMin: small enough that a block just
// copied is still in L1/L2 when it is checksummed, large enough that the
// CRC-32C loop runs at full speed. Chosen by profiling (docs/BENCHMARKS.md).
const FuseBlock = 16 << 10

// Copy copies src into dst (same length) and returns the CRC-32C
// (Castagnoli) of the copied bytes, continuing from crc. The data crosses
// the memory bus once, as in a plain copy, and the checksum covers exactly
// the bytes written:
//
//   - from 1 MiB on CPUs with AVX-512 VPCLMULQDQ (copyCRC), one pass loads
//     each 256 bytes into registers, stores them with non-temporal stores
//     (no read for ownership of dst, as runtime.memmove above 1 MiB) and
//     folds the same registers into the CRC;
//   - otherwise each block is checksummed from dst right after it is
//     written, while it is hot in cache.
//
// Chosen by profiling (docs/BENCHMARKS.md, "AMD EPYC").
func Copy(crc uint32, dst, src []byte) uint32 {
	if len(dst) != len(src) {
		panic("crc32c: Copy of unequal lengths")
	}
	if c, ok := copyCRC(crc, dst, src); ok {
		return c
	}
	for off := 0; off < len(src); off += FuseBlock {
		end := min(off+FuseBlock, len(src))
		copy(dst[off:end], src[off:end])
		crc = updateCRC(crc, dst[off:end])
	}
	return crc
}

// Update is crc32.Update(crc, crc32.MakeTable(crc32.Castagnoli), p),
// with AVX-512 VPCLMULQDQ folding where the CPU has it (same values).
func Update(crc uint32, p []byte) uint32 { return updateCRC(crc, p) }

// Checksum is the CRC-32C of p.
func Checksum(p []byte) uint32 { return updateCRC(0, p) }
