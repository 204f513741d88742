package erasure

import (
	"math/rand/v2"
)

// randBytes is n deterministic bytes with exact capacity, so an access
// past the end panics instead of reading a neighbour.
func randBytes(seed uint64, n int) []byte {
	b := make([]byte, n)
	r := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16), byte(seed >> 24)})
	r.Read(b)
	return b[:n:n]
}

// clone copies b with exact capacity (nil stays nil).
func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	c := make([]byte, len(b))
	copy(c, b)
	return c[:len(b):len(b)]
}

// subsets calls f with every subset of 0..n-1 of size at most k, as a list.
func subsets(n, k int, f func([]int)) {
	for mask := 0; mask < 1<<n; mask++ {
		var s []int
		for i := range n {
			if mask&(1<<i) != 0 {
				s = append(s, i)
			}
		}
		if len(s) <= k {
			f(s)
		}
	}
}

// subsetsOfSize calls f with every subset of 0..n-1 of exactly size k.
func subsetsOfSize(n, k int, f func([]int)) {
	subsets(n, k, func(s []int) {
		if len(s) == k {
			f(s)
		}
	})
}
