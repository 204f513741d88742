package erasure

import "fmt"

// DefaultAlign is the boundary that shards and pieces start on: a cache
// line, so SIMD XOR and GF kernels run on aligned data, and a whole number of
// elements of any dtype up to 64 bytes.
const DefaultAlign = 64

// maxSize keeps every offset computation (sizes rounded up, times m) far
// from overflowing int.
const maxSize = 1 << 52

// Params describes one sharding group's slice and its AEC code.
type Params struct {
	Members int // m: members of the sharding group, >= 2
	Parity  int // K: parity units per stripe; 1 (or 0) is REFT's XOR AEC, K >= 2 is aec:K
	Size    int // W: bytes of the slice, replicated on every member
	Align   int // shard and piece boundaries are multiples of Align; 0 means DefaultAlign
}

// Range is a byte range [Off, Off+Len) of the slice.
type Range struct{ Off, Len int }

// End is the first byte after the range.
func (r Range) End() int { return r.Off + r.Len }

// Layout is the exact geometry of a group's shards, pieces and parity units
// (see the package comment for the rotation). It is a value: compute it
// once per slice with [NewLayout] and share it freely.
//
//   - Shard i covers [i·S, (i+1)·S) of the slice, clipped to W, where the
//     shard size S is ceil(W/m) rounded up to a multiple of (m-K)·Align, so
//     the tail shard is short, or empty when W is small.
//   - Each shard is cut into m-K pieces of P = S/(m-K) bytes, clipped the
//     same way; P is a multiple of Align.
//   - Stripe s (0 <= s < m) has parity units on members s .. s+K-1 and one
//     data piece from each other member i: piece (s-i-1) mod m of shard i.
//   - Member j stores K parity units of P bytes: unit t (at [t·P, (t+1)·P)
//     of its parity buffer) is parity row t of stripe j-t.
//
// Missing bytes of a short piece count as zeros in the arithmetic.
type Layout struct {
	m, k, w, align int
	shard, piece   int
}

// NewLayout checks p and computes the layout.
func NewLayout(p Params) (Layout, error) {
	m, k, w, a := p.Members, p.Parity, p.Size, p.Align
	if k == 0 {
		k = 1
	}
	if a == 0 {
		a = DefaultAlign
	}
	switch {
	case m < 2:
		return Layout{}, fmt.Errorf("%w: a sharding group of %d member(s) cannot protect itself; AEC needs m >= 2 members on different nodes", ErrParams, m)
	case k < 1 || k >= m:
		return Layout{}, fmt.Errorf("%w: aec:%d in a group of %d: the parity count must be 1..%d (m-1), since every stripe keeps at least one data piece", ErrParams, k, m, m-1)
	case k > 1 && m > 256:
		return Layout{}, fmt.Errorf("%w: aec:%d needs a group of at most 256 members (GF(2^8) Reed-Solomon); got %d: use aec (XOR) or smaller groups", ErrParams, k, m)
	case w < 0 || w > maxSize:
		return Layout{}, fmt.Errorf("%w: slice size %d bytes is outside 0..%d", ErrParams, w, maxSize)
	case a < 1 || a > 1<<20:
		return Layout{}, fmt.Errorf("%w: alignment %d must be 1..%d bytes", ErrParams, a, 1<<20)
	}
	d := m - k
	unit := d * a
	s := ceilDiv(ceilDiv(w, m), unit) * unit
	return Layout{m: m, k: k, w: w, align: a, shard: s, piece: s / d}, nil
}

// XORLayout is the layout of REFT's AEC (K = 1) for m members and a slice of
// w bytes, with the default alignment.
func XORLayout(m, w int) (Layout, error) {
	return NewLayout(Params{Members: m, Parity: 1, Size: w})
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// Members is m, the size of the sharding group.
func (l Layout) Members() int { return l.m }

// Parity is K, the parity units per stripe and the member losses tolerated.
func (l Layout) Parity() int { return l.k }

// DataPieces is m-K, the pieces every shard is cut into.
func (l Layout) DataPieces() int { return l.m - l.k }

// Size is W, the slice's length in bytes.
func (l Layout) Size() int { return l.w }

// Align is the boundary shards and pieces start on.
func (l Layout) Align() int { return l.align }

// ShardSize is S, the nominal shard size; only the tail shards are shorter.
func (l Layout) ShardSize() int { return l.shard }

// PieceSize is P = S/(m-K), the nominal piece size and the size of one
// parity unit.
func (l Layout) PieceSize() int { return l.piece }

// ParitySize is the bytes of parity each member stores, K·P: about
// K·W/(m(m-K)), REFT's W/(m(m-1)) for K = 1.
func (l Layout) ParitySize() int { return l.k * l.piece }

// clip cuts [off, off+n) to the slice.
func (l Layout) clip(off, n int) Range {
	lo := min(off, l.w)
	return Range{Off: lo, Len: min(off+n, l.w) - lo}
}

// Shard is the byte range of shard i in the slice (empty past the end).
// It panics if i is not a member, like an index out of range.
func (l Layout) Shard(i int) Range {
	l.mustMember(i)
	return l.clip(i*l.shard, l.shard)
}

// Piece is the byte range of piece p of shard i in the slice (possibly
// short or empty at the end of the slice).
func (l Layout) Piece(i, p int) Range {
	l.mustMember(i)
	if p < 0 || p >= l.m-l.k {
		panic(fmt.Sprintf("erasure: piece %d out of range 0..%d", p, l.m-l.k-1))
	}
	return l.clip(i*l.shard+p*l.piece, l.piece)
}

// PieceIn is the index of the piece shard i contributes to stripe s, or -1
// when member i holds one of stripe s's parity units instead.
func (l Layout) PieceIn(i, s int) int {
	l.mustMember(i)
	l.mustMember(s)
	d := ((s-i)%l.m+l.m)%l.m - 1 // stripes s = i+1 .. i+(m-K) take pieces 0 .. m-K-1
	if d < 0 || d >= l.m-l.k {
		return -1
	}
	return d
}

// StripeData lists the members whose pieces form stripe s, in the column
// order of the code: members s+K .. s+m-1 (mod m).
func (l Layout) StripeData(s int) []int {
	l.mustMember(s)
	out := make([]int, l.m-l.k)
	for c := range out {
		out[c] = (s + l.k + c) % l.m
	}
	return out
}

// StripeParity lists the members holding stripe s's parity units, in row
// order: members s .. s+K-1 (mod m).
func (l Layout) StripeParity(s int) []int {
	l.mustMember(s)
	out := make([]int, l.k)
	for t := range out {
		out[t] = (s + t) % l.m
	}
	return out
}

// UnitStripe is the stripe whose parity row t member j stores in unit t.
func (l Layout) UnitStripe(j, t int) int {
	l.mustMember(j)
	if t < 0 || t >= l.k {
		panic(fmt.Sprintf("erasure: parity unit %d out of range 0..%d", t, l.k-1))
	}
	return ((j-t)%l.m + l.m) % l.m
}

// Unit is the byte range of unit t inside a member's parity buffer.
func (l Layout) Unit(t int) Range {
	if t < 0 || t >= l.k {
		panic(fmt.Sprintf("erasure: parity unit %d out of range 0..%d", t, l.k-1))
	}
	return Range{Off: t * l.piece, Len: l.piece}
}

func (l Layout) mustMember(i int) {
	if i < 0 || i >= l.m {
		panic(fmt.Sprintf("erasure: member %d outside the sharding group 0..%d", i, l.m-1))
	}
}

// String is a one-line summary for logs.
func (l Layout) String() string {
	return fmt.Sprintf("m=%d K=%d W=%d shard=%d piece=%d parity/member=%d", l.m, l.k, l.w, l.shard, l.piece, l.ParitySize())
}
