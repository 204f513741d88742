package erasure

import (
	"crypto/subtle"
	"sync"
)

// xorBlock is the span of dst finished before moving on: every source is
// XORed into it while it stays in L1 (48 KiB here), so each source byte is
// read once from memory and dst is written back once.
const xorBlock = 16 << 10

// minSpan is the least work worth a goroutine of its own.
const minSpan = 512 << 10

// XOR sets dst to the XOR of srcs. A source shorter than dst counts as
// zero-padded, a longer one is cut to len(dst), so callers pass short tail
// pieces as they are. Up to workers goroutines take contiguous spans of dst.
// dst may alias a source only if they start at the same address.
func XOR(dst []byte, srcs [][]byte, workers int) {
	n := len(dst)
	spans := max(1, min(workers, n/minSpan))
	if spans == 1 {
		xorSpan(dst, srcs, 0, n)
		return
	}
	// Spans on block boundaries keep every block whole.
	per := ceilDiv(ceilDiv(n, spans), xorBlock) * xorBlock
	var wg sync.WaitGroup
	for lo := 0; lo < n; lo += per {
		hi := min(lo+per, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			xorSpan(dst, srcs, lo, hi)
		}()
	}
	wg.Wait()
}

// xorSpan computes dst[lo:hi] block by block.
func xorSpan(dst []byte, srcs [][]byte, lo, hi int) {
	for a := lo; a < hi; a += xorBlock {
		xorRange(dst, srcs, a, min(a+xorBlock, hi))
	}
}

// xorRange computes dst[a:b] = XOR of srcs[i][a:b], each clipped to its
// length. The first two full sources go in one pass (no copy to start from).
func xorRange(dst []byte, srcs [][]byte, a, b int) {
	d := dst[a:b]
	started := false
	i := 0
	if len(srcs) >= 2 && len(srcs[0]) >= b && len(srcs[1]) >= b {
		subtle.XORBytes(d, srcs[0][a:b], srcs[1][a:b])
		started, i = true, 2
	}
	for ; i < len(srcs); i++ {
		s := srcs[i]
		if len(s) <= a {
			continue
		}
		seg := s[a:min(b, len(s))]
		if !started {
			copy(d, seg)
			clear(d[len(seg):])
			started = true
			continue
		}
		subtle.XORBytes(d[:len(seg)], d[:len(seg)], seg)
	}
	if !started {
		clear(d)
	}
}
