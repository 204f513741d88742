package erasure

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestARCShardsAndHolders(t *testing.T) {
	tests := []struct {
		m, r, j     int
		shards      []int
		holdersOfJ  []int
		wantErr     error
		errContains string
	}{
		{m: 2, r: 1, j: 0, shards: []int{1}, holdersOfJ: []int{1}},
		{m: 4, r: 1, j: 3, shards: []int{0}, holdersOfJ: []int{2}},
		{m: 4, r: 2, j: 3, shards: []int{0, 1}, holdersOfJ: []int{2, 1}},
		{m: 5, r: 4, j: 0, shards: []int{1, 2, 3, 4}, holdersOfJ: []int{4, 3, 2, 1}},
		{m: 1, r: 1, j: 0, wantErr: ErrParams, errContains: "m >= 2"},
		{m: 4, r: 4, j: 0, wantErr: ErrParams, errContains: "1..3"},
		{m: 4, r: 0, j: 0, wantErr: ErrParams, errContains: "1..3"},
		{m: 4, r: 1, j: 4, wantErr: ErrParams, errContains: "outside"},
		{m: 4, r: 1, j: -1, wantErr: ErrParams, errContains: "outside"},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("m%d_r%d_j%d", tc.m, tc.r, tc.j), func(t *testing.T) {
			got, err := ARCShards(tc.m, tc.r, tc.j)
			got2, err2 := ARCHolders(tc.m, tc.r, tc.j)
			if tc.wantErr != nil {
				for _, e := range []error{err, err2} {
					if !errors.Is(e, tc.wantErr) || !strings.Contains(e.Error(), tc.errContains) {
						t.Fatalf("err = %v, want %v containing %q", e, tc.wantErr, tc.errContains)
					}
				}
				return
			}
			if err != nil || err2 != nil {
				t.Fatal(err, err2)
			}
			if !slices.Equal(got, tc.shards) || !slices.Equal(got2, tc.holdersOfJ) {
				t.Fatalf("ARCShards = %v, ARCHolders = %v; want %v, %v", got, got2, tc.shards, tc.holdersOfJ)
			}
		})
	}
}

// Holders and shards are inverse relations, and no member copies its own.
func TestARCRelationsAgree(t *testing.T) {
	for m := 2; m <= 8; m++ {
		for r := 1; r < m; r++ {
			for j := range m {
				sh, _ := ARCShards(m, r, j)
				for i := range m {
					h, _ := ARCHolders(m, r, i)
					if slices.Contains(sh, i) != slices.Contains(h, j) {
						t.Fatalf("m=%d r=%d: member %d copies %v but holders of %d are %v", m, r, j, sh, i, h)
					}
				}
				if slices.Contains(sh, j) {
					t.Fatalf("m=%d r=%d: member %d copies its own shard", m, r, j)
				}
			}
		}
	}
}

// Every loss set up to r has a surviving source for every lost shard; a
// larger set fails exactly when some lost shard's r holders are all lost.
func TestARCSources(t *testing.T) {
	for m := 2; m <= 8; m++ {
		for r := 1; r < m; r++ {
			subsets(m, m, func(lost []int) {
				src, err := ARCSources(m, r, lost)
				orphan := false
				for _, i := range lost {
					h, _ := ARCHolders(m, r, i)
					all := true
					for _, x := range h {
						all = all && slices.Contains(lost, x)
					}
					orphan = orphan || all
				}
				if len(lost) <= r && err != nil {
					t.Fatalf("m=%d r=%d lost %v: %v", m, r, lost, err)
				}
				if orphan {
					if !errors.Is(err, ErrTooManyLosses) || !strings.Contains(err.Error(), fmt.Sprintf("tolerates %d", r)) {
						t.Fatalf("m=%d r=%d lost %v: err = %v, want ErrTooManyLosses naming the tolerance", m, r, lost, err)
					}
					return
				}
				if err != nil {
					t.Fatalf("m=%d r=%d lost %v: %v", m, r, lost, err)
				}
				for _, i := range lost {
					h, _ := ARCHolders(m, r, i)
					s, ok := src[i]
					if !ok || slices.Contains(lost, s) || !slices.Contains(h, s) {
						t.Fatalf("m=%d r=%d lost %v: source of %d is %d (ok %v), holders %v", m, r, lost, i, s, ok, h)
					}
				}
				if len(src) != len(sortedCopy(lost)) {
					t.Fatalf("m=%d r=%d lost %v: sources %v", m, r, lost, src)
				}
			})
		}
	}
	if _, err := ARCSources(4, 1, []int{7}); !errors.Is(err, ErrParams) {
		t.Fatalf("lost member out of range: err = %v", err)
	}
}
