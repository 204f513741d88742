package tmpfs

import (
	"github.com/reft-hpc/reft/internal/crc32c"
	"runtime"
	"sync"
	"sync/atomic"
)

// ChunkCRCs is the checksum list of a buffer of p split into chunkSize
// pieces, as the manifest records it.
func ChunkCRCs(p []byte, chunkSize int64, workers int) []uint32 {
	out := make([]uint32, chunks(int64(len(p)), chunkSize))
	parallel(len(out), workers, func(i int) {
		lo := int64(i) * chunkSize
		out[i] = crc32c.Checksum(p[lo:min(lo+chunkSize, int64(len(p)))])
	})
	return out
}

// CopyChunks copies src into dst chunk by chunk on up to workers
// goroutines and fills crcs[i] with chunk i's CRC-32C. The Go client's
// background copier does the same per chunk with crc32c.Copy.
func CopyChunks(dst, src []byte, chunkSize int64, crcs []uint32, workers int) {
	parallel(len(crcs), workers, func(i int) {
		lo := int64(i) * chunkSize
		hi := min(lo+chunkSize, int64(len(src)))
		crcs[i] = crc32c.Copy(0, dst[lo:hi], src[lo:hi])
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
