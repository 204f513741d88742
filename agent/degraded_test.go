package agent

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/reft-hpc/reft/spank/spec"
)

// TestDegradedState: commit replies say the node's reasons only once they
// have held for the grace, the same reasons; a change starts the grace
// again; the status is computed at most once a second.
func TestDegradedState(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 15, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	peering, lost := []string{"peering"}, []string{"peer_lost"}
	type ask struct {
		at     float64  // seconds after t0
		status []string // what the status says if asked
		want   []string
	}
	for _, tc := range []struct {
		name  string
		asks  []ask
		calls int // status computations
	}{
		{"healthy", []ask{{0, nil, nil}, {20, nil, nil}}, 2},
		{"within the grace, then said", []ask{{0, peering, nil}, {5, peering, nil}, {10, peering, peering}, {30, peering, peering}}, 4},
		{"a blip inside the grace is never said", []ask{{0, peering, nil}, {3, nil, nil}, {15, nil, nil}}, 3},
		{"a change starts the grace again", []ask{{0, peering, nil}, {12, peering, peering}, {13, lost, nil}, {22, lost, nil}, {23, lost, lost}}, 5},
		{"at most one status a second", []ask{{0, nil, nil}, {0.5, peering, nil}, {0.9, peering, nil}, {1, peering, nil}, {11, peering, peering}}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			var now []string
			d := degradedState{status: func() []string { calls++; return now }}
			for i, a := range tc.asks {
				now = a.status
				got := d.reasons(at(a.at), DegradedGrace)
				if !slices.Equal(got, a.want) {
					t.Errorf("ask %d at +%gs: %q, want %q", i, a.at, got, a.want)
				}
			}
			if calls != tc.calls {
				t.Errorf("status computed %d times, want %d", calls, tc.calls)
			}
		})
	}
}

// TestStrictRefusal: only a strict SPEC with reasons refuses, and the
// refusal names the reasons, the grace and the way out.
func TestStrictRefusal(t *testing.T) {
	for _, tc := range []struct {
		spec string
		why  []string
		want string // "" no refusal
	}{
		{"arc", []string{"peering"}, ""},
		{"arc,strict", nil, ""},
		{"arc,strict", []string{"peering", "rank_local"}, "for 10s or more (peering, rank_local)"},
		{"arc+aec,dp=2,strict", []string{"save_failures"}, "leave strict out of --reft"},
		{"not a spec", []string{"peering"}, ""},
	} {
		sp, _ := spec.Parse(tc.spec) // not a spec: the zero Spec, not strict
		err := strictRefusal(sp.Strict, 0, tc.why)
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("strictRefusal(%q, %q) = %v, want %q", tc.spec, tc.why, err, tc.want)
		}
	}
}
