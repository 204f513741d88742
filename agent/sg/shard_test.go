package sg

import (
	"bytes"
	"math/rand"
	"slices"
	"testing"

	"github.com/klauspost/reedsolomon"
)

func TestShardRangeBalanced(t *testing.T) {
	for w := int64(0); w <= 60; w++ {
		for m := 1; m <= 9; m++ {
			var off, lo, hi int64 = 0, w, 0
			for i, r := range Shards(w, m) {
				if r.Off != off {
					t.Fatalf("w=%d m=%d shard %d starts at %d, want %d (contiguous)", w, m, i, r.Off, off)
				}
				off = r.End()
				lo, hi = min(lo, r.Len), max(hi, r.Len)
				if want := w/int64(m) + map[bool]int64{true: 1}[int64(i) < w%int64(m)]; r.Len != want {
					t.Fatalf("w=%d m=%d shard %d has %d bytes, want %d", w, m, i, r.Len, want)
				}
			}
			if off != w || hi-lo > 1 {
				t.Fatalf("w=%d m=%d: shards end at %d, sizes %d..%d", w, m, off, lo, hi)
			}
		}
	}
	if r := ShardRange(10, 3, 3); r != (Range{}) {
		t.Errorf("member out of range: %+v", r)
	}
}

func TestShardRangeAlign(t *testing.T) {
	for _, align := range []int64{1, 4, 64} {
		for w := int64(0); w <= 300; w += 7 {
			for m := 1; m <= 6; m++ {
				var off int64
				for i := 0; i < m; i++ {
					r := ShardRangeAlign(w, m, i, align)
					if r.Off != off || r.Off%align != 0 {
						t.Fatalf("align %d w=%d m=%d shard %d = %+v, want start %d on a multiple of align", align, w, m, i, r, off)
					}
					if i < m-1 && r.Len%align != 0 {
						t.Fatalf("align %d w=%d m=%d shard %d length %d not whole units", align, w, m, i, r.Len)
					}
					off = r.End()
				}
				if off != w {
					t.Fatalf("align %d w=%d m=%d: shards end at %d", align, w, m, off)
				}
			}
		}
	}
	// 10 units of 4 bytes and 3 tail bytes over 3 members: 4,3,3 units.
	want := []Range{{0, 16}, {16, 12}, {28, 15}}
	for i, w := range want {
		if got := ShardRangeAlign(43, 3, i, 4); got != w {
			t.Errorf("ShardRangeAlign(43,3,%d,4) = %+v, want %+v", i, got, w)
		}
	}
}

func TestECStructure(t *testing.T) {
	for m := 2; m <= 9; m++ {
		for k := 1; k < m; k++ {
			for _, arc := range []bool{false, true} {
				e, err := NewEC(m, k, arc)
				if arc && k == m-1 {
					if err == nil {
						t.Fatalf("m=%d k=%d arc: no error, yet no data piece fits", m, k)
					}
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				if d := e.DataPieces(); d != m-k-map[bool]int{true: 1}[arc] {
					t.Fatalf("m=%d k=%d arc=%v: %d pieces", m, k, arc, d)
				}
				inStripe := map[Piece]int{}
				parityOf := make([]int, m)
				for a := 0; a < m; a++ {
					st := e.Stripe(a)
					used := map[int]bool{}
					for _, q := range st.Parity {
						used[q] = true
						parityOf[q]++
					}
					if arc {
						if used[st.Skip] || st.Skip != (a+k)%m {
							t.Fatalf("m=%d k=%d: stripe %d skips %d", m, k, a, st.Skip)
						}
						used[st.Skip] = true
					}
					for _, d := range st.Data {
						if used[d.Member] {
							t.Fatalf("m=%d k=%d arc=%v stripe %d: member %d appears twice", m, k, arc, a, d.Member)
						}
						used[d.Member] = true
						if _, dup := inStripe[d]; dup {
							t.Fatalf("piece %+v in two stripes", d)
						}
						inStripe[d] = a
						if e.PieceStripe(d.Member, d.Index) != a {
							t.Fatalf("PieceStripe(%+v) = %d, want %d", d, e.PieceStripe(d.Member, d.Index), a)
						}
					}
					if len(used) != m {
						t.Fatalf("m=%d k=%d arc=%v stripe %d spans %d members", m, k, arc, a, len(used))
					}
				}
				if len(inStripe) != m*e.DataPieces() {
					t.Fatalf("m=%d k=%d arc=%v: %d pieces placed", m, k, arc, len(inStripe))
				}
				for p := 0; p < m; p++ {
					if parityOf[p] != k {
						t.Fatalf("member %d holds %d parity pieces, want %d", p, parityOf[p], k)
					}
					for i, a := range e.ParityStripes(p) {
						if e.Stripe(a).Parity[i] != p {
							t.Fatalf("ParityStripes(%d)[%d] = %d, whose parity %d is on %d", p, i, a, i, e.Stripe(a).Parity[i])
						}
					}
					// pieces tile the shard
					sh := ShardRange(1001, m, p)
					off := sh.Off
					for j := 0; j < e.DataPieces(); j++ {
						r := e.PieceRange(1001, p, j)
						if r.Off != off {
							t.Fatalf("piece %d of %d starts at %d, want %d", j, p, r.Off, off)
						}
						off = r.End()
					}
					if off != sh.End() {
						t.Fatalf("pieces of %d end at %d, shard at %d", p, off, sh.End())
					}
				}
			}
		}
	}
	// Plain aec with K=1 is REFT's: parity of W/(m(m-1)) per member.
	e, _ := NewEC(4, 1, false)
	if n := e.ParityLen(1200, 0); n != 100 {
		t.Errorf("m=4 XOR parity piece = %d bytes, want 1200/12 = 100", n)
	}
}

// storage simulates what every member of one SG keeps under a mode, with
// real bytes: its shard, its ARC copy (shard p+1) and its parity pieces,
// encoded by klauspost/reedsolomon. rebuild then tries to restore every
// shard from the survivors' storage alone. It is the byte-level oracle that
// TestPlanMatchesBytes holds the analysis against.
type storage struct {
	e      *EC
	m      int
	arc    bool
	whole  bool // every member keeps the whole slice (aor without arc or aec)
	w      int64
	slice  []byte
	parity map[[2]int][]byte // (stripe, parity index) -> bytes, held by Stripe.Parity[i]
}

func newStorage(t *testing.T, m int, arc bool, e *EC, w int64, rng *rand.Rand) *storage {
	s := &storage{e: e, m: m, arc: arc, w: w, slice: make([]byte, w), parity: map[[2]int][]byte{}}
	rng.Read(s.slice)
	if e == nil {
		return s
	}
	enc, err := reedsolomon.New(e.DataPieces(), e.K)
	if err != nil {
		t.Fatal(err)
	}
	for a := 0; a < m; a++ {
		shards := s.stripeShards(a, nil)
		if err := enc.Encode(shards); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < e.K; i++ {
			s.parity[[2]int{a, i}] = shards[e.DataPieces()+i]
		}
	}
	return s
}

// stripeShards returns stripe a as reedsolomon shards: data pieces
// zero-padded to the parity length (nil where have says the piece is not
// known), then parity (nil; the caller fills what survives).
func (s *storage) stripeShards(a int, have func(member int) bool) [][]byte {
	st := s.e.Stripe(a)
	n := s.e.ParityLen(s.w, a)
	out := make([][]byte, s.e.DataPieces()+s.e.K)
	for i, d := range st.Data {
		if have != nil && !have(d.Member) {
			continue
		}
		r := s.e.PieceRange(s.w, d.Member, d.Index)
		buf := make([]byte, n)
		copy(buf, s.slice[r.Off:r.End()])
		out[i] = buf
	}
	if have == nil {
		for i := 0; i < s.e.K; i++ {
			out[s.e.DataPieces()+i] = make([]byte, n)
		}
	}
	return out
}

// rebuild returns, per ring position, whether its shard is back byte for
// byte, using only what the members outside failed keep.
func (s *storage) rebuild(t *testing.T, failed []bool) []bool {
	m := s.m
	out := make([]bool, m)
	plain := func(q int) bool {
		return !failed[q] || (s.arc && !failed[(q-1+m)%m]) || (s.whole && slices.Contains(failed, false))
	}
	got := make([][]byte, m)
	for q := 0; q < m; q++ {
		if plain(q) {
			r := ShardRange(s.w, m, q)
			got[q] = append([]byte(nil), s.slice[r.Off:r.End()]...)
		}
	}
	if s.e != nil {
		enc, _ := reedsolomon.New(s.e.DataPieces(), s.e.K)
		for q := 0; q < m; q++ {
			if got[q] != nil {
				continue
			}
			buf := make([]byte, 0, ShardRange(s.w, m, q).Len)
			ok := true
			for j := 0; j < s.e.DataPieces() && ok; j++ {
				a := s.e.PieceStripe(q, j)
				st := s.e.Stripe(a)
				shards := s.stripeShards(a, plain)
				for i, h := range st.Parity {
					if !failed[h] {
						shards[s.e.DataPieces()+i] = s.parity[[2]int{a, i}]
					}
				}
				if err := enc.ReconstructData(shards); err != nil {
					ok = false
					break
				}
				r := s.e.PieceRange(s.w, q, j)
				buf = append(buf, shards[j][:r.Len]...) // stripe a holds piece j of q at column j
			}
			if ok {
				got[q] = buf
			}
		}
	}
	for q := 0; q < m; q++ {
		r := ShardRange(s.w, m, q)
		out[q] = got[q] != nil && bytes.Equal(got[q], s.slice[r.Off:r.End()])
	}
	return out
}
