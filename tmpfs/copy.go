package tmpfs

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// fuseBlock is the step of the fused copy: small enough that a block just
// copied is still in L1/L2 when it is checksummed, large enough that the
// CRC-32C loop runs at full speed. Chosen by profiling (docs/BENCHMARKS.md).
const fuseBlock = 16 << 10

// CopyCRC copies src into dst (same length) and returns the CRC-32C
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
func CopyCRC(crc uint32, dst, src []byte) uint32 {
	if len(dst) != len(src) {
		panic("tmpfs: CopyCRC of unequal lengths")
	}
	if c, ok := copyCRC(crc, dst, src); ok {
		return c
	}
	for off := 0; off < len(src); off += fuseBlock {
		end := min(off+fuseBlock, len(src))
		copy(dst[off:end], src[off:end])
		crc = updateCRC(crc, dst[off:end])
	}
	return crc
}

// UpdateCRC is crc32.Update(crc, crc32.MakeTable(crc32.Castagnoli), p),
// with AVX-512 VPCLMULQDQ folding where the CPU has it (same values).
func UpdateCRC(crc uint32, p []byte) uint32 { return updateCRC(crc, p) }

// CRC is the CRC-32C of p.
func CRC(p []byte) uint32 { return updateCRC(0, p) }

// ChunkCRCs is the checksum list of a buffer of p split into chunkSize
// pieces, as the manifest records it.
func ChunkCRCs(p []byte, chunkSize int64, workers int) []uint32 {
	out := make([]uint32, chunks(int64(len(p)), chunkSize))
	parallel(len(out), workers, func(i int) {
		lo := int64(i) * chunkSize
		out[i] = CRC(p[lo:min(lo+chunkSize, int64(len(p)))])
	})
	return out
}

// CopyChunks copies src into dst chunk by chunk on up to workers
// goroutines and fills crcs[i] with chunk i's CRC-32C. The Go client's
// background copier does the same per chunk with CopyCRC.
func CopyChunks(dst, src []byte, chunkSize int64, crcs []uint32, workers int) {
	parallel(len(crcs), workers, func(i int) {
		lo := int64(i) * chunkSize
		hi := min(lo+chunkSize, int64(len(src)))
		crcs[i] = CopyCRC(0, dst[lo:hi], src[lo:hi])
	})
}

// parallel runs f(0..n-1) on up to workers goroutines (GOMAXPROCS when
// workers <= 0), handing out indexes in order so chunks stream.
func parallel(n, workers int, f func(i int)) {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	workers = min(workers, n)
	if workers <= 1 {
		for i := range n {
			f(i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				f(i)
			}
		}()
	}
	wg.Wait()
}
