package erasure

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/klauspost/reedsolomon"
)

// group is one encoded sharding group: the slice, each member's shard (a
// copy, as it sits in that member's store) and parity.
type group struct {
	l        Layout
	c        *Codec
	slice    []byte
	shards   [][]byte
	parities [][]byte
}

func newGroup(t testing.TB, p Params, seed uint64, workers int) *group {
	t.Helper()
	l, err := NewLayout(p)
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewCodec(l, workers)
	if err != nil {
		t.Fatal(err)
	}
	g := &group{l: l, c: c, slice: randBytes(seed, p.Size)}
	for j := range l.Members() {
		r := l.Shard(j)
		g.shards = append(g.shards, clone(g.slice[r.Off:r.End()]))
		par := make([]byte, l.ParitySize())
		if err := c.Encode(j, g.slice, par); err != nil {
			t.Fatalf("%v: Encode(%d): %v", l, j, err)
		}
		g.parities = append(g.parities, par)
	}
	return g
}

// survivors hands out copies of what the members outside lost hold.
func (g *group) survivors(lost []int) (shards, parities [][]byte) {
	for i := range g.l.Members() {
		if slices.Contains(lost, i) {
			shards, parities = append(shards, nil), append(parities, nil)
		} else {
			shards, parities = append(shards, clone(g.shards[i])), append(parities, clone(g.parities[i]))
		}
	}
	return shards, parities
}

func (g *group) check(t testing.TB, lost []int, shards [][]byte) {
	t.Helper()
	for i := range g.l.Members() {
		if !bytes.Equal(shards[i], g.shards[i]) {
			t.Fatalf("%v lost %v: shard %d differs after Reconstruct", g.l, lost, i)
		}
	}
}

var xorSizes = func(m int) []int {
	return []int{0, 1, 2, 3, m - 1, m, m + 1, 63, 64, 65, 191, 1000, 4097, 65537, 1<<20 + 13}
}

// REFT's AEC: every single member loss is rebuilt bit-exactly, for m =
// 2..8, odd sizes and W < m, both alignments, into new and given buffers.
func TestXORSingleLoss(t *testing.T) {
	for m := 2; m <= 8; m++ {
		for _, a := range []int{1, 64} {
			for _, w := range xorSizes(m) {
				g := newGroup(t, Params{Members: m, Size: w, Align: a}, uint64(m*w+a), 2)
				for i := range m {
					shards, parities := g.survivors([]int{i})
					if i%2 == 1 { // into a caller's buffer (an arena)
						shards[i] = make([]byte, g.l.Shard(i).Len)
					}
					if err := g.c.Reconstruct([]int{i}, shards, parities); err != nil {
						t.Fatalf("%v lost %d: %v", g.l, i, err)
					}
					g.check(t, []int{i}, shards)
				}
			}
		}
	}
}

// Member j's parity never depends on its own shard: changing shard j in
// the slice leaves parity j unchanged and changes the others (when the
// slice is big enough that every shard has bytes in every stripe).
func TestParityExcludesOwnShard(t *testing.T) {
	for _, p := range []Params{{Members: 4, Size: 10000}, {Members: 6, Parity: 3, Size: 50000}} {
		g := newGroup(t, p, 7, 1)
		for j := range p.Members {
			s := clone(g.slice)
			r := g.l.Shard(j)
			for x := r.Off; x < r.End(); x++ {
				s[x] ^= 0xa5
			}
			par := make([]byte, g.l.ParitySize())
			if err := g.c.Encode(j, s, par); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(par, g.parities[j]) {
				t.Fatalf("%v: parity of member %d depends on its own shard", g.l, j)
			}
			other := (j + 1) % p.Members
			if err := g.c.Encode(other, s, par); err != nil {
				t.Fatal(err)
			}
			if bytes.Equal(par, g.parities[other]) {
				t.Fatalf("%v: parity of member %d does not cover shard %d", g.l, other, j)
			}
		}
	}
}

// With m = 2 the XOR parity is a copy of the peer's shard: ARC.
func TestTwoMembersIsARC(t *testing.T) {
	g := newGroup(t, Params{Members: 2, Size: 1001, Align: 1}, 3, 1)
	for j := range 2 {
		peer := g.shards[1-j]
		if !bytes.Equal(g.parities[j][:len(peer)], peer) || bytes.ContainsFunc(g.parities[j][len(peer):], func(r rune) bool { return r != 0 }) {
			t.Fatalf("member %d parity is not shard %d", j, 1-j)
		}
	}
}

// aec:K: every loss set up to K members is rebuilt; K+1 members fail with an
// error that names the missing shards and the tolerance.
func TestRSLayoutLosses(t *testing.T) {
	for m := 3; m <= 8; m++ {
		for k := 2; k < m; k++ {
			// Big enough that every piece has bytes: then K+1 losses always fail.
			d := m - k
			for _, w := range []int{m*d*64*2 + 17, 1 << 16} {
				g := newGroup(t, Params{Members: m, Parity: k, Size: w}, uint64(100*m+k), 2)
				subsets(m, k, func(lost []int) {
					shards, parities := g.survivors(lost)
					if err := g.c.Reconstruct(lost, shards, parities); err != nil {
						t.Fatalf("%v lost %v: %v", g.l, lost, err)
					}
					g.check(t, lost, shards)
				})
				subsetsOfSize(m, k+1, func(lost []int) {
					shards, parities := g.survivors(lost)
					err := g.c.Reconstruct(lost, shards, parities)
					want := fmt.Sprintf("shards %v", lost)
					if !errors.Is(err, ErrTooManyLosses) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), fmt.Sprintf("tolerates %d lost", k)) {
						t.Fatalf("%v lost %v: err = %v, want ErrTooManyLosses naming %q and the tolerance %d", g.l, lost, err, want, k)
					}
					for _, i := range lost {
						if shards[i] != nil {
							t.Fatalf("shard %d was written although Reconstruct failed", i)
						}
					}
				})
			}
		}
	}
}

// Odd sizes and W < m for aec:K, every loss set up to K.
func TestRSLayoutOddSizes(t *testing.T) {
	for _, m := range []int{3, 5, 8} {
		for _, k := range []int{2, m - 1} {
			for _, w := range []int{0, 1, m - 1, m + 1, 1000, 4099} {
				for _, a := range []int{1, 64} {
					g := newGroup(t, Params{Members: m, Parity: k, Size: w, Align: a}, uint64(w+a), 1)
					subsets(m, k, func(lost []int) {
						shards, parities := g.survivors(lost)
						if err := g.c.Reconstruct(lost, shards, parities); err != nil {
							t.Fatalf("%v lost %v: %v", g.l, lost, err)
						}
						g.check(t, lost, shards)
					})
				}
			}
		}
	}
}

// Our per-row encoders produce exactly the parity klauspost's own Cauchy
// code computes for the whole stripe, zero-padded: with equal pieces,
// pieces whose last one is a few bytes short (encoded in two spans),
// empty pieces, and the arc+aec layout.
func TestRSRowsMatchKlauspostCauchy(t *testing.T) {
	for _, p := range []Params{
		{Members: 5, Parity: 2, Size: 10000},
		{Members: 8, Parity: 3, Size: 77777, Align: 1},
		{Members: 4, Parity: 2, Size: 4 * 2 * 4096}, // equal pieces
		{Members: 8, Parity: 2, Size: 1<<20 + 12345, Align: 4096},
		{Members: 6, Parity: 3, Size: 7, Align: 1}, // empty pieces
		{Members: 8, Parity: 2, Size: 99991, ARC: true},
	} {
		g := newGroup(t, p, 11, 1)
		d := g.l.DataPieces()
		enc, err := reedsolomon.New(d, p.Parity, reedsolomon.WithCauchyMatrix())
		if err != nil {
			t.Fatal(err)
		}
		for s := range p.Members {
			units := make([][]byte, d+p.Parity)
			for col, i := range g.l.StripeData(s) {
				r := g.l.Piece(i, g.l.PieceIn(i, s))
				units[col] = make([]byte, g.l.PieceSize())
				copy(units[col], g.slice[r.Off:r.End()])
			}
			for t := range p.Parity {
				units[d+t] = make([]byte, g.l.PieceSize())
			}
			if err := enc.Encode(units); err != nil {
				t.Fatal(err)
			}
			for row, h := range g.l.StripeParity(s) {
				u := g.l.Unit(row)
				if !bytes.Equal(g.parities[h][u.Off:u.End()], units[d+row]) {
					t.Fatalf("%v stripe %d row %d (member %d) differs from klauspost Cauchy", g.l, s, row, h)
				}
			}
		}
	}
}

// An unavailable parity or shard of a survivor counts as a lost unit.
func TestReconstructUnavailableUnits(t *testing.T) {
	tests := []struct {
		p          Params
		lost       []int
		noParity   []int
		noShard    []int
		ok         bool
		errContain string
	}{
		{Params{Members: 4, Size: 9999}, []int{0}, nil, nil, true, ""},
		{Params{Members: 4, Size: 9999}, []int{0}, []int{2}, nil, false, "parities [0 2]"},
		{Params{Members: 4, Size: 9999}, []int{0}, nil, []int{3}, false, "shards [0 3]"},
		{Params{Members: 4, Size: 9999}, []int{0}, []int{0}, nil, true, ""}, // its own parity is not needed
		{Params{Members: 5, Parity: 2, Size: 9999}, []int{1}, []int{3}, nil, true, ""},
		{Params{Members: 5, Parity: 2, Size: 9999}, []int{1}, []int{2, 3}, nil, false, "tolerates 2"},
		{Params{Members: 5, Parity: 2, Size: 9999}, []int{1}, nil, []int{3}, true, ""}, // found by FuzzReconstruct
		{Params{Members: 8, Parity: 3, Size: 9999}, []int{1, 6}, []int{4}, nil, true, ""},
		{Params{Members: 8, Parity: 3, Size: 9999}, []int{1, 6}, []int{4}, []int{0}, false, "shards [0 1 6]"},
		// W < m: shards 1..3 are empty, so not passing them costs nothing.
		{Params{Members: 4, Size: 3, Align: 1}, []int{0}, nil, []int{1, 2}, true, ""},
	}
	for n, tc := range tests {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			g := newGroup(t, tc.p, uint64(n), 1)
			shards, parities := g.survivors(tc.lost)
			for _, i := range tc.noParity {
				parities[i] = nil
			}
			for _, i := range tc.noShard {
				shards[i] = nil
			}
			err := g.c.Reconstruct(tc.lost, shards, parities)
			if tc.ok {
				if err != nil {
					t.Fatal(err)
				}
				for _, i := range tc.lost {
					if !bytes.Equal(shards[i], g.shards[i]) {
						t.Fatalf("shard %d differs", i)
					}
				}
				return
			}
			if !errors.Is(err, ErrTooManyLosses) || !strings.Contains(err.Error(), tc.errContain) {
				t.Fatalf("err = %v, want ErrTooManyLosses containing %q", err, tc.errContain)
			}
		})
	}
}

// Lengths are checked before anything is read or written.
func TestCodecRejectsBadLengths(t *testing.T) {
	g := newGroup(t, Params{Members: 4, Size: 1000}, 5, 1)
	ps := g.l.ParitySize()
	tests := []struct {
		name string
		run  func() error
		want error
		msg  string
	}{
		{"encode member", func() error { return g.c.Encode(4, g.slice, make([]byte, ps)) }, ErrParams, "outside"},
		{"encode slice", func() error { return g.c.Encode(0, g.slice[:999], make([]byte, ps)) }, ErrSize, "slice has 999"},
		{"encode parity", func() error { return g.c.Encode(0, g.slice, make([]byte, ps+1)) }, ErrSize, "needs exactly"},
		{"count", func() error { return g.c.Reconstruct([]int{0}, make([][]byte, 3), make([][]byte, 4)) }, ErrSize, "3 shards"},
		{"lost index", func() error {
			s, p := g.survivors(nil)
			return g.c.Reconstruct([]int{9}, s, p)
		}, ErrParams, "outside"},
		{"short shard", func() error {
			s, p := g.survivors([]int{0})
			s[2] = s[2][:10]
			return g.c.Reconstruct([]int{0}, s, p)
		}, ErrSize, "shard 2 has 10 bytes"},
		{"long parity", func() error {
			s, p := g.survivors([]int{0})
			p[1] = append(p[1], 0)
			return g.c.Reconstruct([]int{0}, s, p)
		}, ErrSize, "parity of member 1"},
		{"output buffer", func() error {
			s, p := g.survivors([]int{0})
			s[0] = make([]byte, 5)
			return g.c.Reconstruct([]int{0}, s, p)
		}, ErrSize, "output buffer for lost shard 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run()
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err = %v, want %v containing %q", err, tc.want, tc.msg)
			}
		})
	}
}

// Nothing lost: nothing to do, nothing touched.
func TestReconstructNothingLost(t *testing.T) {
	g := newGroup(t, Params{Members: 3, Parity: 2, Size: 500}, 9, 1)
	s, p := g.survivors(nil)
	if err := g.c.Reconstruct(nil, s, p); err != nil {
		t.Fatal(err)
	}
	g.check(t, nil, s)
}

// arc+aec: any K+1 lost members are survived when the surviving ARC copies
// (on each lost shard's predecessor) are passed as shards and the codec
// rebuilds the rest.
func TestARCPlusAECSurvivesKPlus1(t *testing.T) {
	for m := 3; m <= 8; m++ {
		for k := 1; k+1 < m; k++ {
			d := m - k - 1
			for _, cut := range []bool{false, true} {
				w := m*d*64*2 + 17 // every piece has bytes
				p := Params{Members: m, Parity: k, Size: w, ARC: true}
				if cut {
					p.Shards = balancedCut(w, m, 4)
				}
				g := newGroup(t, p, uint64(10*m+k), 1)
				subsets(m, k+1, func(lost []int) {
					shards, parities := g.survivors(lost)
					var rebuild []int
					for _, i := range lost {
						holder := (i - 1 + m) % m
						if slices.Contains(lost, holder) {
							rebuild = append(rebuild, i)
						} else {
							shards[i] = clone(g.shards[i]) // the ARC copy
						}
					}
					if err := g.c.Reconstruct(rebuild, shards, parities); err != nil {
						t.Fatalf("%v lost %v (rebuild %v): %v", g.l, lost, rebuild, err)
					}
					g.check(t, lost, shards)
				})
			}
		}
	}
}

// Why the ARC variant exists: with the plain layout, losing members 1 and 2
// takes shard 2, its ARC copy (on 1) and the parity of stripe 1, which
// holds a piece of shard 2.
func TestPlainLayoutLosesArcAecPair(t *testing.T) {
	g := newGroup(t, Params{Members: 4, Size: 4096}, 1, 1)
	shards, parities := g.survivors([]int{1, 2})
	shards[1] = clone(g.shards[1]) // its copy on member 0 survives
	err := g.c.Reconstruct([]int{2}, shards, parities)
	if !errors.Is(err, ErrTooManyLosses) || !strings.Contains(err.Error(), "stripe 1 has 2 of the 3 units") {
		t.Fatalf("err = %v, want ErrTooManyLosses for stripe 1", err)
	}
	g2 := newGroup(t, Params{Members: 4, Size: 4096, ARC: true}, 1, 1)
	shards, parities = g2.survivors([]int{1, 2})
	shards[1] = clone(g2.shards[1])
	if err := g2.c.Reconstruct([]int{2}, shards, parities); err != nil {
		t.Fatalf("ARC layout: %v", err)
	}
	g2.check(t, []int{1, 2}, shards)
}

// A cut given by the store (agent/sg's balanced one): every loss set up to
// K, odd sizes, both codes.
func TestGivenShardCut(t *testing.T) {
	for m := 2; m <= 7; m++ {
		for _, k := range []int{1, 2} {
			if k >= m {
				continue
			}
			for _, w := range []int{0, 1, m - 1, m + 1, 1001, 65537} {
				for _, unit := range []int{1, 4} {
					g := newGroup(t, Params{Members: m, Parity: k, Size: w, Shards: balancedCut(w, m, unit)}, uint64(w+m), 1)
					subsets(m, k, func(lost []int) {
						shards, parities := g.survivors(lost)
						if err := g.c.Reconstruct(lost, shards, parities); err != nil {
							t.Fatalf("%v lost %v: %v", g.l, lost, err)
						}
						g.check(t, lost, shards)
					})
				}
			}
		}
	}
}
