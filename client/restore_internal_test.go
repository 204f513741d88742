package client

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
)

// roundsAgree is an Agree over an in-process all-gather of world ranks:
// each rank's n-th call joins round n and gets the values every rank
// passed, computed once per round (as Gather computes them on each rank).
type roundsAgree struct {
	mu     sync.Mutex
	world  int
	rounds []*agreeRound
	next   []int
	calls  int // the most calls any rank made
}

type agreeRound struct {
	count map[int64]int // value -> ranks that passed it
	n     int
	out   []int64
	done  chan struct{}
}

func (g *roundsAgree) agree(rank int) func(context.Context, []int64) ([]int64, error) {
	return func(ctx context.Context, mine []int64) ([]int64, error) {
		g.mu.Lock()
		i := g.next[rank]
		g.next[rank]++
		g.calls = max(g.calls, g.next[rank])
		for len(g.rounds) <= i {
			g.rounds = append(g.rounds, &agreeRound{count: map[int64]int{}, done: make(chan struct{})})
		}
		rd := g.rounds[i]
		for _, v := range slices.Compact(slices.Sorted(slices.Values(mine))) {
			rd.count[v]++
		}
		if rd.n++; rd.n == g.world {
			for v, c := range rd.count {
				if c == g.world {
					rd.out = append(rd.out, v)
				}
			}
			close(rd.done)
		}
		g.mu.Unlock()
		select {
		case <-rd.done:
			return rd.out, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// TestAgreeFailed: every rank learns exactly which ranks failed (the
// lowest maxNamedRanks of them, and that there are more), from Agree's
// intersections alone, in 1 + ceil(log_64 W) rounds.
func TestAgreeFailed(t *testing.T) {
	many := make([]int, 20)
	for i := range many {
		many[i] = 7 * i
	}
	cases := []struct {
		world  int
		failed []int
		rounds int
	}{
		{1, nil, 1},
		{4, nil, 1},
		{4, []int{2}, 2},
		{64, []int{0, 63}, 2},
		{65, []int{64}, 3},
		{1000, []int{0, 517, 999}, 3},
		{5000, []int{4999}, 4},
		{200, many, 3},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("world=%d/failed=%v", tc.world, tc.failed), func(t *testing.T) {
			g := &roundsAgree{world: tc.world, next: make([]int, tc.world)}
			got := make([][]int, tc.world)
			more := make([]bool, tc.world)
			errs := make([]error, tc.world)
			var wg sync.WaitGroup
			for r := range tc.world {
				wg.Add(1)
				go func() {
					defer wg.Done()
					got[r], more[r], errs[r] = agreeFailed(context.Background(), g.agree(r), r, tc.world, slices.Contains(tc.failed, r))
				}()
			}
			wg.Wait()
			want, wantMore := tc.failed, len(tc.failed) > maxNamedRanks
			if wantMore {
				want = tc.failed[:maxNamedRanks]
			}
			for r := range tc.world {
				if errs[r] != nil || !slices.Equal(got[r], want) || more[r] != wantMore {
					t.Fatalf("rank %d: failed ranks %v (more %v), %v; want %v (more %v)", r, got[r], more[r], errs[r], want, wantMore)
				}
			}
			if g.calls != tc.rounds {
				t.Errorf("%d rounds of Agree, want %d", g.calls, tc.rounds)
			}
		})
	}
}
