package sg

import "fmt"

// Range is the byte range [Off, Off+Len) of a slice.
type Range struct {
	Off int64 `json:"off"`
	Len int64 `json:"len"`
}

// End is Off+Len.
func (r Range) End() int64 { return r.Off + r.Len }

// ShardRange is member i's shard of a w-byte slice split among m members
// (REFT Global Parameter Sharding): shards are contiguous, in member order,
// and balanced: the first w%m shards hold one byte more than the others, so
// sizes differ by at most one byte and a slice smaller than m leaves the
// last members empty shards.
func ShardRange(w int64, m, i int) Range {
	return ShardRangeAlign(w, m, i, 1)
}

// ShardRangeAlign is ShardRange in whole units of align bytes (an element
// size, or a page for direct I/O): shard boundaries fall on multiples of
// align, units are balanced as in ShardRange, and the w%align tail bytes go
// to the last member. align < 1 counts as 1.
func ShardRangeAlign(w int64, m, i int, align int64) Range {
	if align < 1 {
		align = 1
	}
	if m < 1 || i < 0 || i >= m || w <= 0 {
		return Range{}
	}
	units := w / align
	q, r := units/int64(m), units%int64(m)
	ii := int64(i)
	start := ii*q + min(ii, r)
	n := q
	if ii < r {
		n++
	}
	out := Range{Off: start * align, Len: n * align}
	if i == m-1 {
		out.Len += w % align
	}
	return out
}

// Shards returns every member's ShardRange.
func Shards(w int64, m int) []Range {
	out := make([]Range, m)
	for i := range out {
		out[i] = ShardRange(w, m, i)
	}
	return out
}

// EC is the AEC parity layout of one sharding group of M members (ring
// positions 0..M-1) with K parity pieces per stripe: K = 1 is REFT's rotated
// XOR parity (`aec`), K > 1 Reed-Solomon (`aec:K`). ARC says whether `arc`
// is on as well, which changes the layout so that the two together survive
// any K+1 failed members (REFT "collaborative protection"); see doc.go.
//
// There are M stripes, one per ring position a. Stripe a keeps its K parity
// pieces on positions a, a+1, ..., a+K-1 (mod M); piece j of member p's
// shard lies in stripe p+1+j. Alone, each shard is cut into D = M-K pieces,
// so stripe a takes data from positions a+K .. a-1: this is agent/erasure's
// rotated layout. With ARC, shards are cut into D = M-K-1 pieces and stripe
// a leaves out position a+K, the one right after its parity block.
type EC struct {
	M, K int
	ARC  bool
}

// NewEC checks that a group of m can carry the layout: D >= 1, that is
// m >= K+1, or m >= K+2 together with arc.
func NewEC(m, k int, arc bool) (EC, error) {
	e := EC{M: m, K: k, ARC: arc}
	if k < 1 {
		return EC{}, fmt.Errorf("aec needs K >= 1 parity pieces; got %d", k)
	}
	if e.DataPieces() < 1 {
		return EC{}, fmt.Errorf("%s needs at least %d members per sharding group (a group of m survives at most m-1 failed members); it has %d", e.mode(), e.minMembers(), m)
	}
	return e, nil
}

func (e EC) mode() string {
	s := "aec"
	if e.K > 1 {
		s = fmt.Sprintf("aec:%d", e.K)
	}
	if e.ARC {
		s = "arc+" + s
	}
	return s
}

func (e EC) arc() int {
	if e.ARC {
		return 1
	}
	return 0
}

func (e EC) minMembers() int { return e.K + 1 + e.arc() }

// DataPieces is D, the pieces each shard is split into (one per stripe it
// takes part in as data).
func (e EC) DataPieces() int { return e.M - e.K - e.arc() }

// Stripe describes stripe a.
type Stripe struct {
	Index  int     `json:"index"`
	Parity []int   `json:"parity"` // ring positions holding parity pieces 0..K-1
	Skip   int     `json:"skip"`   // ring position left out of the stripe (with ARC), else -1
	Data   []Piece `json:"data"`   // data pieces, nearest preceding position first
}

// Piece is piece Index of the shard of the member at ring position Member.
type Piece struct {
	Member int `json:"member"`
	Index  int `json:"index"`
}

func (e EC) mod(x int) int { return ((x % e.M) + e.M) % e.M }

// Stripe returns stripe a.
func (e EC) Stripe(a int) Stripe {
	s := Stripe{Index: a, Skip: -1}
	for i := 0; i < e.K; i++ {
		s.Parity = append(s.Parity, e.mod(a+i))
	}
	if e.ARC {
		s.Skip = e.mod(a + e.K)
	}
	// Piece j of member p lies in stripe p+1+j, so stripe a takes piece j
	// of member a-1-j.
	for j := 0; j < e.DataPieces(); j++ {
		s.Data = append(s.Data, Piece{Member: e.mod(a - 1 - j), Index: j})
	}
	return s
}

// PieceStripe is the stripe holding piece j of member p.
func (e EC) PieceStripe(p, j int) int { return e.mod(p + 1 + j) }

// ParityStripes lists the stripes whose parity member p holds, in order of
// parity index: p holds parity piece i of stripe p-i.
func (e EC) ParityStripes(p int) []int {
	out := make([]int, e.K)
	for i := range out {
		out[i] = e.mod(p - i)
	}
	return out
}

// PieceRange is piece j of member p's shard, as a range of the w-byte slice:
// the shard (ShardRange) split into DataPieces balanced parts.
func (e EC) PieceRange(w int64, p, j int) Range {
	sh := ShardRange(w, e.M, p)
	r := ShardRange(sh.Len, e.DataPieces(), j)
	r.Off += sh.Off
	return r
}

// ParityLen is the size of each parity piece of stripe a: the longest data
// piece in it (shorter pieces count as zero-padded).
func (e EC) ParityLen(w int64, a int) int64 {
	var n int64
	for _, d := range e.Stripe(a).Data {
		n = max(n, e.PieceRange(w, d.Member, d.Index).Len)
	}
	return n
}
