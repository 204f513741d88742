package erasure

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestNewLayoutParams(t *testing.T) {
	tests := []struct {
		name string
		p    Params
		err  string
	}{
		{"one member", Params{Members: 1, Size: 10}, "m >= 2"},
		{"K equals m", Params{Members: 3, Parity: 3, Size: 10}, "1..2"},
		{"negative K", Params{Members: 3, Parity: -1, Size: 10}, "1..2"},
		{"negative size", Params{Members: 3, Size: -1}, "outside"},
		{"huge size", Params{Members: 3, Size: maxSize + 1}, "outside"},
		{"bad align", Params{Members: 3, Size: 10, Align: -4}, "alignment"},
		{"RS over 256", Params{Members: 300, Parity: 2, Size: 10}, "at most 256"},
		{"arc+aec needs K+2", Params{Members: 3, Parity: 2, Size: 10, ARC: true}, "arc+aec:2 in a group of 3"},
		{"cut count", Params{Members: 3, Size: 10, Shards: []Range{{0, 5}, {5, 5}}}, "2 ranges"},
		{"cut gap", Params{Members: 3, Size: 10, Shards: []Range{{0, 4}, {5, 3}, {8, 2}}}, "shard 1 of the cut is [5, 8) but must start at 4"},
		{"cut past W", Params{Members: 2, Size: 10, Shards: []Range{{0, 4}, {4, 7}}}, "end by 10"},
		{"cut short of W", Params{Members: 2, Size: 10, Shards: []Range{{0, 4}, {4, 5}}}, "ends at 9"},
		{"cut negative", Params{Members: 2, Size: 10, Shards: []Range{{0, 11}, {11, -1}}}, "end by 10"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewLayout(tc.p)
			if !errors.Is(err, ErrParams) || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("err = %v, want ErrParams containing %q", err, tc.err)
			}
		})
	}
	if _, err := XORLayout(300, 1<<20); err != nil {
		t.Fatalf("XOR has no 256-member limit: %v", err)
	}
	if _, err := NewCodec(Layout{}, 1); !errors.Is(err, ErrParams) {
		t.Fatalf("NewCodec(zero Layout) err = %v", err)
	}
}

// Exact geometry for a few hand-checked cases.
func TestLayoutExamples(t *testing.T) {
	tests := []struct {
		p             Params
		shard, piece  int
		shards        []Range
		stripe0Data   []int
		stripe0Parity []int
	}{
		// ceil(100/4) = 25 rounded up to 3·1: S = 27, P = 9; the tail shard is short.
		{Params{Members: 4, Size: 100, Align: 1}, 27, 9,
			[]Range{{0, 27}, {27, 27}, {54, 27}, {81, 19}}, []int{1, 2, 3}, []int{0}},
		// W < m with a cache-line alignment: everything sits in shard 0.
		{Params{Members: 4, Size: 3}, 192, 64,
			[]Range{{0, 3}, {3, 0}, {3, 0}, {3, 0}}, []int{1, 2, 3}, []int{0}},
		// aec:2 over 5 members: 3 pieces per shard, stripe 0's parity on 0 and 1.
		{Params{Members: 5, Parity: 2, Size: 1000, Align: 8}, 216, 72,
			[]Range{{0, 216}, {216, 216}, {432, 216}, {648, 216}, {864, 136}}, []int{2, 3, 4}, []int{0, 1}},
		{Params{Members: 2, Size: 0}, 0, 0, []Range{{0, 0}, {0, 0}}, []int{1}, []int{0}},
	}
	for _, tc := range tests {
		l, err := NewLayout(tc.p)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(l.String(), func(t *testing.T) {
			if l.ShardSize() != tc.shard || l.PieceSize() != tc.piece {
				t.Fatalf("shard %d piece %d, want %d %d", l.ShardSize(), l.PieceSize(), tc.shard, tc.piece)
			}
			for i, want := range tc.shards {
				if got := l.Shard(i); got != want {
					t.Fatalf("Shard(%d) = %v, want %v", i, got, want)
				}
			}
			if got := l.StripeData(0); !slices.Equal(got, tc.stripe0Data) {
				t.Fatalf("StripeData(0) = %v, want %v", got, tc.stripe0Data)
			}
			if got := l.StripeParity(0); !slices.Equal(got, tc.stripe0Parity) {
				t.Fatalf("StripeParity(0) = %v, want %v", got, tc.stripe0Parity)
			}
		})
	}
}

// balancedCut is agent/sg's cut: whole units of align, balanced, the
// w%align tail bytes to the last member.
func balancedCut(w, m, align int) []Range {
	units := w / align
	q, r := units/m, units%m
	out := make([]Range, m)
	for i := range out {
		n := q
		if i < r {
			n++
		}
		out[i] = Range{Off: (i*q + min(i, r)) * align, Len: n * align}
	}
	out[m-1].Len += w % align
	return out
}

// The invariants the codes rest on, over many shapes, default and given
// cuts, with and without the ARC variant.
func TestLayoutInvariants(t *testing.T) {
	for m := 2; m <= 9; m++ {
		for k := 1; k < m; k++ {
			for _, arc := range []bool{false, true} {
				if arc && k+1 >= m {
					continue
				}
				for _, a := range []int{1, 3, 64} {
					for _, w := range []int{0, 1, m - 1, m, m + 1, 97, 4096, 4099, 1 << 20, 3<<20 + 7} {
						for _, cut := range [][]Range{nil, balancedCut(w, m, 1), balancedCut(w, m, 8)} {
							l, err := NewLayout(Params{Members: m, Parity: k, Size: w, Align: a, ARC: arc, Shards: cut})
							if err != nil {
								t.Fatal(err)
							}
							if err := checkInvariants(l); err != nil {
								t.Fatalf("%v align %d cut %v: %v", l, a, cut, err)
							}
						}
					}
				}
			}
		}
	}
}

func checkInvariants(l Layout) error {
	m, k, d, w, p := l.Members(), l.Parity(), l.DataPieces(), l.Size(), l.PieceSize()
	if want := m - k; l.ARC() {
		want--
		if d != want {
			return fmt.Errorf("%d data pieces, want %d", d, want)
		}
	} else if d != want {
		return fmt.Errorf("%d data pieces, want %d", d, want)
	}
	if p%l.Align() != 0 || l.ShardSize() > d*p || d*p-l.ShardSize() >= d*l.Align() {
		return fmt.Errorf("piece %d not a multiple of align %d or not the least that covers shard %d in %d pieces", p, l.Align(), l.ShardSize(), d)
	}
	// Shards tile [0, W) in order; pieces tile their shard in order.
	next := 0
	for i := range m {
		s := l.Shard(i)
		if s.Off != next || s.Len < 0 || s.End() > w || s.Len > l.ShardSize() {
			return fmt.Errorf("shard %d = %v after %d", i, s, next)
		}
		for q := range d {
			r := l.Piece(i, q)
			if r.Off != next || r.Len < 0 || r.Len > p || r.End() > s.End() {
				return fmt.Errorf("piece %d of shard %d = %v after %d", q, i, r, next)
			}
			next = r.End()
		}
		if next != s.End() {
			return fmt.Errorf("pieces of shard %d end at %d, shard ends at %d", i, next, s.End())
		}
	}
	if next != w {
		return fmt.Errorf("shards end at %d, slice at %d", next, w)
	}
	// Redundancy per member: K·W/(m·D) up to the alignment (and, for a
	// given cut, its imbalance).
	lo := k * w / (m * d)
	hi := k * (ceilDiv(l.ShardSize(), d) + l.Align())
	if ps := l.ParitySize(); ps < lo || ps > hi {
		return fmt.Errorf("parity per member %d, want %d .. %d", ps, lo, hi)
	}
	// Each stripe: K parity holders and m-K data members, disjoint; each
	// shard gives every piece to exactly one stripe.
	used := make(map[[2]int]int)
	for s := range m {
		data, par, skip := l.StripeData(s), l.StripeParity(s), l.StripeSkip(s)
		all := append(slices.Clone(data), par...)
		if l.ARC() {
			if skip != (s+k)%m || l.PieceIn(skip, s) != -1 {
				return fmt.Errorf("stripe %d: skip %d", s, skip)
			}
			all = append(all, skip)
		} else if skip != -1 {
			return fmt.Errorf("stripe %d: skip %d without ARC", s, skip)
		}
		slices.Sort(all)
		if len(data) != d || len(par) != k || len(slices.Compact(all)) != m {
			return fmt.Errorf("stripe %d: data %v parity %v skip %d", s, data, par, skip)
		}
		for _, h := range par {
			if l.PieceIn(h, s) != -1 {
				return fmt.Errorf("stripe %d: parity holder %d also gives a piece", s, h)
			}
		}
		for _, i := range data {
			q := l.PieceIn(i, s)
			if q < 0 {
				return fmt.Errorf("stripe %d: data member %d has no piece", s, i)
			}
			used[[2]int{i, q}]++
		}
	}
	for i := range m {
		for q := range d {
			if used[[2]int{i, q}] != 1 {
				return fmt.Errorf("piece %d of shard %d used %d times", q, i, used[[2]int{i, q}])
			}
		}
	}
	// Member j's units are rows of stripes it is a parity holder of, and
	// its K units cover K distinct stripes.
	for j := range m {
		seen := map[int]bool{}
		for t := range k {
			s := l.UnitStripe(j, t)
			if l.StripeParity(s)[t] != j || seen[s] {
				return fmt.Errorf("member %d unit %d: stripe %d parity %v", j, t, s, l.StripeParity(s))
			}
			seen[s] = true
			if u := l.Unit(t); u.Off != t*p || u.Len != p {
				return fmt.Errorf("Unit(%d) = %v", t, u)
			}
		}
	}
	return nil
}

func TestLayoutPanicsOnBadIndex(t *testing.T) {
	l, _ := XORLayout(4, 1000)
	for name, f := range map[string]func(){
		"shard":  func() { l.Shard(4) },
		"piece":  func() { l.Piece(0, 3) },
		"stripe": func() { l.StripeData(-1) },
		"unit":   func() { l.Unit(1) },
		"ustrp":  func() { l.UnitStripe(0, 1) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			f()
		})
	}
}
