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
	Align   int // piece boundaries (and the default shard cut) are multiples of Align; 0 means DefaultAlign

	// ARC selects the layout for arc+aec (ARC copies on the predecessor,
	// member i-1 holding shard i): every stripe also leaves out the member
	// right after its parity block, so shards are cut into m-K-1 pieces.
	// Then any K+1 lost members leave every lost shard either a surviving
	// ARC copy or decodable stripes. With the plain layout two adjacent
	// losses can take a shard, its copy and a parity of one of its stripes
	// at once, so arc+aec would survive only one loss.
	ARC bool

	// Shards, when set, is the shard cut the snapshot store uses: m ranges
	// tiling [0, W) in member order (agent/sg's balanced cut, say). Nil
	// means the default cut described on Layout.
	Shards []Range
}

// Range is a byte range [Off, Off+Len) of the slice.
type Range struct{ Off, Len int }

// End is the first byte after the range.
func (r Range) End() int { return r.Off + r.Len }

// Layout is the exact geometry of a group's shards, pieces and parity units
// (see the package comment for the rotation). It is a value: compute it
// once per slice with [NewLayout] and share it freely. With D = m-K pieces
// per shard (m-K-1 with Params.ARC):
//
//   - Shard i covers [i·S, (i+1)·S) of the slice, clipped to W, where the
//     shard size S is ceil(W/m) rounded up to a multiple of D·Align, so the
//     tail shard is short, or empty when W is small. Params.Shards replaces
//     this cut; S is then its longest shard.
//   - Each shard is cut into D pieces of P bytes from its start, the last
//     ones short or empty: P = S/D by default, ceil(S/D) rounded up to
//     Align with a given cut. P is a multiple of Align.
//   - Stripe s (0 <= s < m) has parity units on members s .. s+K-1, leaves
//     out member s+K with ARC, and takes one data piece from each other
//     member i: piece (s-i-1) mod m of shard i.
//   - Member j stores K parity units of P bytes: unit t (at [t·P, (t+1)·P)
//     of its parity buffer) is parity row t of stripe j-t.
//
// Missing bytes of a short piece count as zeros in the arithmetic. The
// member and stripe arithmetic (the last two points) is the embedded
// [Rotation]'s; Layout adds the byte ranges.
type Layout struct {
	Rotation             // who holds what in each stripe
	w, align     int     // slice size, boundary
	cut          []Range // the caller's shard cut, or nil for the default
	shard, piece int
}

// NewLayout checks p and computes the layout.
func NewLayout(p Params) (Layout, error) {
	m, k, w, a, gap, err := checkParams(p)
	if err != nil {
		return Layout{}, err
	}
	d := m - k - gap
	l := Layout{Rotation: Rotation{m: m, k: k, gap: gap}, w: w, align: a}
	if p.Shards == nil {
		unit := d * a
		l.shard = ceilDiv(ceilDiv(w, m), unit) * unit
		l.piece = l.shard / d
		return l, nil
	}
	if l.shard, err = checkCut(p.Shards, m, w); err != nil {
		return Layout{}, err
	}
	l.cut = append([]Range(nil), p.Shards...)
	l.piece = ceilDiv(ceilDiv(l.shard, d), a) * a
	return l, nil
}

// checkParams fills p's defaults (K 1, DefaultAlign) and checks the group
// size, K, the slice size and the alignment; gap is 1 with ARC.
func checkParams(p Params) (m, k, w, a, gap int, err error) {
	m, k, w, a = p.Members, p.Parity, p.Size, p.Align
	if k == 0 {
		k = 1
	}
	if a == 0 {
		a = DefaultAlign
	}
	mode := "aec"
	if k > 1 {
		mode = fmt.Sprintf("aec:%d", k)
	}
	if p.ARC {
		gap, mode = 1, "arc+"+mode
	}
	switch {
	case m < 2:
		err = fmt.Errorf("%w: a sharding group of %d member(s) cannot protect itself; AEC needs m >= 2 members on different nodes", ErrParams, m)
	case k < 1 || k+gap >= m:
		err = fmt.Errorf("%w: %s in a group of %d: the parity count must be 1..%d (m-%d), since every stripe keeps at least one data piece; raise the group size or lower K", ErrParams, mode, m, m-1-gap, 1+gap)
	case k > 1 && m > 256:
		err = fmt.Errorf("%w: %s needs a group of at most 256 members (GF(2^8) Reed-Solomon); got %d: use aec (XOR) or smaller groups", ErrParams, mode, m)
	case w < 0 || w > maxSize:
		err = fmt.Errorf("%w: slice size %d bytes is outside 0..%d", ErrParams, w, maxSize)
	case a < 1 || a > 1<<20:
		err = fmt.Errorf("%w: alignment %d must be 1..%d bytes", ErrParams, a, 1<<20)
	}
	return m, k, w, a, gap, err
}

// checkCut checks the caller's shard cut: one range per member, tiling
// the w-byte slice in member order. It returns the longest shard.
func checkCut(cut []Range, m, w int) (longest int, err error) {
	if len(cut) != m {
		return 0, fmt.Errorf("%w: the shard cut has %d ranges for a group of %d members; pass one per member", ErrParams, len(cut), m)
	}
	next := 0
	for i, r := range cut {
		if r.Off != next || r.Len < 0 || r.End() > w {
			return 0, fmt.Errorf("%w: shard %d of the cut is [%d, %d) but must start at %d and end by %d: shards must tile the %d-byte slice in member order", ErrParams, i, r.Off, r.End(), next, w, w)
		}
		next = r.End()
		longest = max(longest, r.Len)
	}
	if next != w {
		return 0, fmt.Errorf("%w: the shard cut ends at %d but the slice has %d bytes: shards must tile it", ErrParams, next, w)
	}
	return longest, nil
}

// XORLayout is the layout of REFT's AEC (K = 1) for m members and a slice of
// w bytes, with the default alignment.
func XORLayout(m, w int) (Layout, error) {
	return NewLayout(Params{Members: m, Parity: 1, Size: w})
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// Size is W, the slice's length in bytes.
func (l Layout) Size() int { return l.w }

// Align is the boundary shards and pieces start on.
func (l Layout) Align() int { return l.align }

// ShardSize is S, the nominal (longest) shard size.
func (l Layout) ShardSize() int { return l.shard }

// PieceSize is P = S/(m-K), the nominal piece size and the size of one
// parity unit.
func (l Layout) PieceSize() int { return l.piece }

// ParitySize is the bytes of parity each member stores, K·P: about
// K·W/(m·D), REFT's W/(m(m-1)) for plain aec.
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
	if l.cut != nil {
		return l.cut[i]
	}
	return l.clip(i*l.shard, l.shard)
}

// Piece is the byte range of piece p of shard i in the slice (possibly
// short or empty at the end of the shard).
func (l Layout) Piece(i, p int) Range {
	if p < 0 || p >= l.DataPieces() {
		panic(fmt.Sprintf("erasure: piece %d out of range 0..%d", p, l.DataPieces()-1))
	}
	r := l.Shard(i)
	lo := min(r.Off+p*l.piece, r.End())
	return Range{Off: lo, Len: min(lo+l.piece, r.End()) - lo}
}

// Unit is the byte range of unit t inside a member's parity buffer.
func (l Layout) Unit(t int) Range {
	l.mustUnit(t)
	return Range{Off: t * l.piece, Len: l.piece}
}

// String is a one-line summary for logs.
func (l Layout) String() string {
	arc := ""
	if l.gap == 1 {
		arc = " arc"
	}
	return fmt.Sprintf("m=%d K=%d%s W=%d shard=%d piece=%d parity/member=%d", l.m, l.k, arc, l.w, l.shard, l.piece, l.ParitySize())
}
