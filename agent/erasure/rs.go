package erasure

import (
	"fmt"

	"github.com/klauspost/reedsolomon"
)

// RS is a Reed-Solomon code over whole shards: m data shards and K parity
// shards, any K of the m+K lost and rebuilt (klauspost/reedsolomon's default
// Vandermonde-derived matrix and SIMD kernels). Use it where every data
// shard reaches the encoder anyway (sharded buffers sent over the network,
// parity kept off the group's nodes); for parity kept on the group's own
// members use [Codec], whose rotation keeps K member losses recoverable.
//
// Shard sizes: all shards of one code word share one length n, the longest
// data shard. A shorter data shard (the tail of a slice) counts as
// zero-padded to n; only such shards are copied, into padded scratch, so
// equal-length shards go to klauspost as they are. A rebuilt data shard comes
// back with n bytes: cut it to the length recorded in its manifest.
type RS struct {
	m, k int
	enc  reedsolomon.Encoder
}

// NewRS builds the code for m data shards and k parity shards (m+k <= 256).
func NewRS(m, k int) (*RS, error) {
	switch {
	case m < 1:
		return nil, fmt.Errorf("%w: Reed-Solomon over %d data shards: need at least 1", ErrParams, m)
	case k < 1:
		return nil, fmt.Errorf("%w: aec:%d: the parity count must be at least 1", ErrParams, k)
	case m+k > 256:
		return nil, fmt.Errorf("%w: %d data + %d parity shards exceed the 256 of GF(2^8) Reed-Solomon; use smaller groups", ErrParams, m, k)
	}
	enc, err := reedsolomon.New(m, k)
	if err != nil {
		return nil, fmt.Errorf("erasure: building Reed-Solomon(%d data, %d parity): %w", m, k, err)
	}
	return &RS{m: m, k: k, enc: enc}, nil
}

// DataShards is m.
func (r *RS) DataShards() int { return r.m }

// ParityShards is K, also the number of lost shards tolerated.
func (r *RS) ParityShards() int { return r.k }

// ShardSize is the length of every shard for a slice of w bytes, ceil(w/m).
func (r *RS) ShardSize(w int) int { return ceilDiv(max(w, 0), r.m) }

// Split cuts slice into m data shards of ShardSize bytes, without copying
// (the tail shards are short or empty), followed by K nil parity shards.
func (r *RS) Split(slice []byte) [][]byte {
	n := r.ShardSize(len(slice))
	out := make([][]byte, r.m+r.k)
	for i := range r.m {
		lo := min(i*n, len(slice))
		out[i] = slice[lo:min(lo+n, len(slice)):min(lo+n, len(slice))]
	}
	return out
}

func (r *RS) checkCount(shards [][]byte) error {
	if len(shards) != r.m+r.k {
		return fmt.Errorf("%w: got %d shards, the code has %d data + %d parity; pass one entry per shard, nil where it is missing", ErrSize, len(shards), r.m, r.k)
	}
	return nil
}

// Encode fills the parity shards shards[m:] from the data shards shards[:m].
// A nil parity shard is allocated; a given one must have exactly the length
// of the longest data shard.
func (r *RS) Encode(shards [][]byte) error {
	if err := r.checkCount(shards); err != nil {
		return err
	}
	n := 0
	for i, s := range shards[:r.m] {
		if s == nil {
			return fmt.Errorf("%w: data shard %d is nil; Encode needs every data shard (use Reconstruct to rebuild missing ones)", ErrSize, i)
		}
		n = max(n, len(s))
	}
	for t, p := range shards[r.m:] {
		if p != nil && len(p) != n {
			return fmt.Errorf("%w: parity shard %d (index %d) has %d bytes, the longest data shard has %d; allocate parity shards of that length or pass nil", ErrSize, t, r.m+t, len(p), n)
		}
	}
	for t := r.m; t < len(shards); t++ {
		if shards[t] == nil {
			shards[t] = make([]byte, n)
		}
	}
	if n == 0 {
		return nil
	}
	work := shards
	if !equalLen(shards[:r.m], n) {
		work = make([][]byte, len(shards))
		copy(work, shards)
		for i := range r.m {
			work[i] = padTo(shards[i], n)
		}
	}
	if err := r.enc.Encode(work); err != nil {
		return fmt.Errorf("erasure: Reed-Solomon(%d+%d) encode of %d-byte shards: %w", r.m, r.k, n, err)
	}
	return nil
}

func equalLen(shards [][]byte, n int) bool {
	for _, s := range shards {
		if len(s) != n {
			return false
		}
	}
	return true
}

// Reconstruct rebuilds every nil shard, data and parity, from the others.
// Present parity shards must all have the same length n; present data
// shards at most n. With more than K shards missing it rebuilds nothing and
// returns ErrTooManyLosses naming the missing shards.
func (r *RS) Reconstruct(shards [][]byte) error {
	if err := r.checkCount(shards); err != nil {
		return err
	}
	n, pn := 0, -1
	var missing []string
	for i, s := range shards {
		switch {
		case s == nil:
			missing = append(missing, r.shardName(i))
		case i < r.m:
			n = max(n, len(s))
		case pn >= 0 && len(s) != pn:
			return fmt.Errorf("%w: parity shards disagree: %s has %d bytes, an earlier one %d; pass them exactly as encoded", ErrSize, r.shardName(i), len(s), pn)
		default:
			pn = len(s)
		}
	}
	if len(missing) > r.k {
		return fmt.Errorf("%w: %d shards missing (%v) but Reed-Solomon(%d data + %d parity) tolerates %d: restore from the persistent checkpoint",
			ErrTooManyLosses, len(missing), missing, r.m, r.k, r.k)
	}
	if len(missing) == 0 {
		return nil
	}
	if pn >= 0 {
		if n > pn {
			return fmt.Errorf("%w: a data shard has %d bytes, longer than the %d-byte parity shards; pass shards exactly as encoded", ErrSize, n, pn)
		}
		n = pn
	}
	if n == 0 {
		for i := range shards {
			if shards[i] == nil {
				shards[i] = []byte{}
			}
		}
		return nil
	}
	work := make([][]byte, len(shards))
	for i, s := range shards {
		if s != nil {
			work[i] = padTo(s, n) // copies only short data shards
		}
	}
	if err := r.enc.Reconstruct(work); err != nil {
		return fmt.Errorf("erasure: Reed-Solomon(%d+%d) rebuilding %v from %d-byte shards: %w", r.m, r.k, missing, n, err)
	}
	for i := range shards {
		if shards[i] == nil {
			shards[i] = work[i]
		}
	}
	return nil
}

func (r *RS) shardName(i int) string {
	if i < r.m {
		return fmt.Sprintf("data %d", i)
	}
	return fmt.Sprintf("parity %d (index %d)", i-r.m, i)
}
