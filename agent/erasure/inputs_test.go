package erasure

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/reft-hpc/reft/agent/sg"
)

// sgCut is agent/sg's balanced shard cut (what the sharded snapshot
// copies) as erasure Ranges.
func sgCut(w, m int) []Range {
	var out []Range
	for _, r := range sg.Shards(int64(w), m) {
		out = append(out, Range{Off: int(r.Off), Len: int(r.Len)})
	}
	return out
}

// gather builds member j's scratch section as the client does: the slice
// bytes at every Input's Range, concatenated, with exact capacity.
func gather(l Layout, j int, slice []byte) []byte {
	var b []byte
	for _, in := range l.Inputs(j) {
		b = append(b, slice[in.Range.Off:in.Range.End()]...)
	}
	return clone(b)
}

type inputsCase struct {
	m, k int
	arc  bool
	cut  string // "default", "default/a=1", "sg"
	w    int
}

func (c inputsCase) params() Params {
	p := Params{Members: c.m, Parity: c.k, Size: c.w, ARC: c.arc}
	switch c.cut {
	case "default/a=1":
		p.Align = 1
	case "sg":
		p.Shards = sgCut(c.w, c.m)
	}
	return p
}

func (c inputsCase) String() string {
	return fmt.Sprintf("m=%d/K=%d/arc=%v/%s/W=%d", c.m, c.k, c.arc, c.cut, c.w)
}

func inputsCases() []inputsCase {
	var out []inputsCase
	for _, m := range []int{2, 3, 4, 5, 8} {
		for _, k := range []int{1, 2} {
			for _, arc := range []bool{false, true} {
				gap := 0
				if arc {
					gap = 1
				}
				if k+gap >= m {
					continue // no valid layout
				}
				ws := []int{0, 1, 2, m - 1, m + 1, 63, 64, 65, 1000, 4096, 4097, 65537, 1<<20 + 13}
				if m <= 3 {
					ws = append(ws, 5<<20+7) // pieces over 2·minSpan: XOR runs on several workers
				}
				for _, cut := range []string{"default", "default/a=1", "sg"} {
					for _, w := range ws {
						out = append(out, inputsCase{m, k, arc, cut, w})
					}
				}
			}
		}
	}
	return out
}

// The sharded snapshot path: scratch gathered per Inputs, EncodeInputs
// equals Encode byte for byte for every member; the parities it writes
// rebuild any K lost members (and, with arc+aec, any K+1 with the
// surviving ARC copies passed as shards).
func TestEncodeInputsMatchesEncode(t *testing.T) {
	for _, tc := range inputsCases() {
		t.Run(tc.String(), func(t *testing.T) {
			l, err := NewLayout(tc.params())
			if err != nil {
				t.Fatal(err)
			}
			c, err := NewCodec(l, 4)
			if err != nil {
				t.Fatal(err)
			}
			slice := randBytes(uint64(tc.w*31+tc.m*7+tc.k), tc.w)
			shards := make([][]byte, tc.m)
			parities := make([][]byte, tc.m)
			for j := range tc.m {
				r := l.Shard(j)
				shards[j] = clone(slice[r.Off:r.End()])
				want := make([]byte, l.ParitySize())
				if err := c.Encode(j, slice, want); err != nil {
					t.Fatalf("Encode(%d): %v", j, err)
				}
				scratch := gather(l, j, slice)
				if len(scratch) != l.InputSize(j) {
					t.Fatalf("member %d: gathered %d bytes, InputSize %d", j, len(scratch), l.InputSize(j))
				}
				keep := clone(scratch)
				got := bytes.Repeat([]byte{0xa5}, l.ParitySize()) // stale arena bytes must be overwritten
				if err := c.EncodeInputs(j, scratch, got); err != nil {
					t.Fatalf("EncodeInputs(%d): %v", j, err)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("member %d: EncodeInputs differs from Encode (first at byte %d of %d)", j, firstDiff(got, want), len(want))
				}
				if !bytes.Equal(scratch, keep) {
					t.Fatalf("member %d: EncodeInputs wrote into scratch", j)
				}
				parities[j] = got
			}
			check := func(lost []int, got [][]byte) {
				t.Helper()
				for i := range tc.m {
					if !bytes.Equal(got[i], shards[i]) {
						t.Fatalf("lost %v: shard %d differs after Reconstruct from EncodeInputs parities", lost, i)
					}
				}
			}
			survivors := func(lost []int) (sh, par [][]byte) {
				for i := range tc.m {
					if slices.Contains(lost, i) {
						sh, par = append(sh, nil), append(par, nil)
					} else {
						sh, par = append(sh, clone(shards[i])), append(par, clone(parities[i]))
					}
				}
				return sh, par
			}
			subsets(tc.m, tc.k, func(lost []int) {
				if len(lost) == 0 {
					return
				}
				sh, par := survivors(lost)
				if err := c.Reconstruct(lost, sh, par); err != nil {
					t.Fatalf("lost %v: %v", lost, err)
				}
				check(lost, sh)
			})
			if !tc.arc || tc.w < 1<<16 {
				return
			}
			subsetsOfSize(tc.m, tc.k+1, func(lost []int) {
				sh, par := survivors(lost)
				var rebuild []int
				for _, i := range lost {
					if slices.Contains(lost, (i-1+tc.m)%tc.m) {
						rebuild = append(rebuild, i)
					} else {
						sh[i] = clone(shards[i]) // the ARC copy on i-1
					}
				}
				if err := c.Reconstruct(rebuild, sh, par); err != nil {
					t.Fatalf("lost %v (rebuild %v): %v", lost, rebuild, err)
				}
				check(lost, sh)
			})
		})
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// Inputs lists K·D pieces per member in unit and StripeData order, never
// one twice and never one of the member's own shard; over the group every
// piece is read by exactly K members, so the InputSizes sum to K·W; and
// each member's InputSize stays within the documented bound.
func TestInputsShapeAndBound(t *testing.T) {
	for _, tc := range inputsCases() {
		if tc.w > 1<<20 {
			tc.w = tc.w*3 + 1 // the geometry only: larger sizes cost nothing
		}
		l, err := NewLayout(tc.params())
		if err != nil {
			t.Fatal(err)
		}
		d := l.DataPieces()
		readers := map[[2]int]int{}
		total := 0
		for j := range tc.m {
			ins := l.Inputs(j)
			if len(ins) != tc.k*d {
				t.Fatalf("%v member %d: %d inputs, want K·D = %d", tc, j, len(ins), tc.k*d)
			}
			seen := map[[2]int]bool{}
			size := 0
			for n, in := range ins {
				unit, col := n/d, n%d
				s := l.UnitStripe(j, unit)
				if in.Unit != unit || in.Shard != l.StripeData(s)[col] || in.Piece != l.PieceIn(in.Shard, s) || in.Range != l.Piece(in.Shard, in.Piece) {
					t.Fatalf("%v member %d: input %d is %+v; want unit %d, column %d of stripe %d", tc, j, n, in, unit, col, s)
				}
				if in.Shard == j {
					t.Fatalf("%v member %d: input %d is in its own shard", tc, j, n)
				}
				key := [2]int{in.Shard, in.Piece}
				if seen[key] {
					t.Fatalf("%v member %d: piece %v listed twice", tc, j, key)
				}
				seen[key] = true
				readers[key]++
				size += in.Range.Len
			}
			if size != l.InputSize(j) {
				t.Fatalf("%v member %d: inputs sum to %d, InputSize %d", tc, j, size, l.InputSize(j))
			}
			// The documented bound: K·D·P <= K·(S + D·Align - 1).
			if bound := d * l.ParitySize(); size > bound {
				t.Fatalf("%v member %d: InputSize %d > D·ParitySize %d", tc, j, size, bound)
			}
			if bound := tc.k * (l.ShardSize() + d*l.Align() - 1); d*l.ParitySize() > bound {
				t.Fatalf("%v: D·ParitySize %d > K·(S + D·Align - 1) = %d", tc, d*l.ParitySize(), bound)
			}
			if tc.cut == "sg" {
				if bound := tc.k * (ceilDiv(tc.w, tc.m) + d*l.Align()); size > bound {
					t.Fatalf("%v member %d: InputSize %d > K·(ceil(W/m) + D·Align) = %d", tc, j, size, bound)
				}
			}
			total += size
		}
		if total != tc.k*tc.w {
			t.Fatalf("%v: InputSizes sum to %d, want K·W = %d", tc, total, tc.k*tc.w)
		}
		for i := range tc.m {
			for p := range d {
				if got := readers[[2]int{i, p}]; got != tc.k {
					t.Fatalf("%v: piece %d of shard %d read by %d members, want K = %d", tc, p, i, got, tc.k)
				}
			}
		}
	}
}

func TestEncodeInputsRejectsBadLengths(t *testing.T) {
	l, err := NewLayout(Params{Members: 4, Parity: 2, Size: 10000})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewCodec(l, 1)
	if err != nil {
		t.Fatal(err)
	}
	n := l.InputSize(1)
	for _, tc := range []struct {
		name            string
		j               int
		scratch, parity int
		wantErr         error
		wantText        string
	}{
		{"member", 4, n, l.ParitySize(), ErrParams, "member 4 is outside the sharding group 0..3"},
		{"negative member", -1, n, l.ParitySize(), ErrParams, "member -1"},
		{"short scratch", 1, n - 1, l.ParitySize(), ErrSize, fmt.Sprintf("scratch has %d bytes but the layout", n-1)},
		{"long scratch", 1, n + 1, l.ParitySize(), ErrSize, fmt.Sprintf("needs exactly %d", n)},
		{"whole slice", 1, l.Size(), l.ParitySize(), ErrSize, "Layout.Inputs(1)"},
		{"parity", 1, n, l.ParitySize() - 1, ErrSize, "parity buffer has"},
	} {
		err := c.EncodeInputs(tc.j, make([]byte, tc.scratch), make([]byte, tc.parity))
		if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.wantText) {
			t.Errorf("%s: err = %v; want %v mentioning %q", tc.name, err, tc.wantErr, tc.wantText)
		}
	}
}
