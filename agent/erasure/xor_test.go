package erasure

import (
	"bytes"
	"fmt"
	"testing"
)

func naiveXOR(n int, srcs [][]byte) []byte {
	out := make([]byte, n)
	for _, s := range srcs {
		for i := 0; i < n && i < len(s); i++ {
			out[i] ^= s[i]
		}
	}
	return out
}

func TestXOR(t *testing.T) {
	big := 3*minSpan + 12345 // several spans, a partial last block
	tests := []struct {
		n       int
		lens    []int
		workers int
	}{
		{0, nil, 1},
		{10, nil, 1},                        // no source: zeros
		{10, []int{10}, 1},                  // one source: a copy
		{10, []int{3}, 1},                   // one short source
		{100, []int{100, 100, 100}, 1},      // fused first pair
		{100, []int{40, 100, 7, 0, 130}, 1}, // short, empty and long sources
		{xorBlock + 1, []int{xorBlock + 1, xorBlock, 5}, 1},
		{big, []int{big, big, big, big}, 1},
		{big, []int{big, big, big, big}, 2},
		{big, []int{big, big / 2, 3, big + 9}, 3},
		{big, []int{minSpan, big}, 8},
		{minSpan - 1, []int{minSpan - 1, minSpan - 1}, 4}, // too small to split
	}
	for i, tc := range tests {
		t.Run(fmt.Sprintf("%d_n%d_w%d", i, tc.n, tc.workers), func(t *testing.T) {
			var srcs [][]byte
			for j, l := range tc.lens {
				srcs = append(srcs, randBytes(uint64(100*i+j), l))
			}
			dst := randBytes(999, tc.n) // garbage must be overwritten
			XOR(dst, srcs, tc.workers)
			if want := naiveXOR(tc.n, srcs); !bytes.Equal(dst, want) {
				t.Fatal("XOR differs from the byte loop")
			}
		})
	}
}

// In-place accumulation: dst may be the first source.
func TestXORInPlace(t *testing.T) {
	a, b := randBytes(1, 5000), randBytes(2, 5000)
	want := naiveXOR(5000, [][]byte{a, b})
	XOR(a, [][]byte{a, b}, 2)
	if !bytes.Equal(a, want) {
		t.Fatal("in-place XOR differs")
	}
}
