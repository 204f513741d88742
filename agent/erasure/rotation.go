package erasure

import "fmt"

// Rotation is the index arithmetic of a group's code: which members hold
// stripe s's parity units, which sit it out (with ARC), and which piece of
// which shard each data column is. It depends only on m, K and ARC, never
// on byte sizes, so two slices of one group share it; the byte geometry
// (shard, piece and unit ranges) is Layout's, which embeds a Rotation. It
// is an immutable value, safe for concurrent use. Its methods panic on a
// member or stripe outside 0..m-1, like an index out of range.
type Rotation struct {
	m, k int
	gap  int // 1 with ARC: the member after the parity block sits out
}

// Members is m, the size of the sharding group.
func (r Rotation) Members() int { return r.m }

// Parity is K, the parity units per stripe and the member losses tolerated.
func (r Rotation) Parity() int { return r.k }

// DataPieces is D, the pieces every shard is cut into: m-K, or m-K-1 with
// ARC.
func (r Rotation) DataPieces() int { return r.m - r.k - r.gap }

// ARC tells whether this is the arc+aec layout (Params.ARC).
func (r Rotation) ARC() bool { return r.gap == 1 }

// PieceIn is the index of the piece shard i contributes to stripe s, or -1
// when member i holds one of stripe s's parity units or sits it out.
func (r Rotation) PieceIn(i, s int) int {
	r.mustMember(i)
	r.mustMember(s)
	d := ((s-i)%r.m+r.m)%r.m - 1 // stripes s = i+1 .. i+D take pieces 0 .. D-1
	if d < 0 || d >= r.DataPieces() {
		return -1
	}
	return d
}

// StripeData lists the members whose pieces form stripe s, in the column
// order of the code: members s+K .. s+m-1 (mod m), from s+K+1 with ARC.
func (r Rotation) StripeData(s int) []int {
	r.mustMember(s)
	out := make([]int, r.DataPieces())
	for c := range out {
		out[c] = (s + r.k + r.gap + c) % r.m
	}
	return out
}

// StripeSkip is the member that sits stripe s out with ARC (s+K), else -1.
func (r Rotation) StripeSkip(s int) int {
	r.mustMember(s)
	if r.gap == 0 {
		return -1
	}
	return (s + r.k) % r.m
}

// StripeParity lists the members holding stripe s's parity units, in row
// order: members s .. s+K-1 (mod m).
func (r Rotation) StripeParity(s int) []int {
	r.mustMember(s)
	out := make([]int, r.k)
	for t := range out {
		out[t] = (s + t) % r.m
	}
	return out
}

// UnitStripe is the stripe whose parity row t member j stores in unit t.
func (r Rotation) UnitStripe(j, t int) int {
	r.mustMember(j)
	r.mustUnit(t)
	return ((j-t)%r.m + r.m) % r.m
}

func (r Rotation) mustMember(i int) {
	if i < 0 || i >= r.m {
		panic(fmt.Sprintf("erasure: member %d outside the sharding group 0..%d", i, r.m-1))
	}
}

func (r Rotation) mustUnit(t int) {
	if t < 0 || t >= r.k {
		panic(fmt.Sprintf("erasure: parity unit %d out of range 0..%d", t, r.k-1))
	}
}
