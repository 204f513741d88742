package agent

import (
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// TestRestoreProgress drives the reporter with a fake clock: a report at
// an arrival once an interval has passed, a stall report when nothing
// lands for an interval, none otherwise.
func TestRestoreProgress(t *testing.T) {
	t0 := time.Unix(1000, 0)
	type step struct {
		at      time.Duration // since the start
		add     int64         // > 0: bytes land; 0: a tick of the stall watch
		want    bool          // a report
		stalled bool          // ... saying it is stalled
	}
	cases := []struct {
		name  string
		steps []step
		// the last report's fields
		done, eta int64
	}{
		{"arrivals within an interval are not reported", []step{{at: 100 * time.Millisecond, add: 10}, {at: 900 * time.Millisecond, add: 10}}, 0, 0},
		{"an arrival after an interval is", []step{{at: 500 * time.Millisecond, add: 100}, {at: 1000 * time.Millisecond, add: 100, want: true}}, 200, 4},
		{"a tick while bytes arrive is quiet", []step{{at: 1100 * time.Millisecond, add: 100, want: true}, {at: 1500 * time.Millisecond}}, 100, 0},
		{"a tick after an idle interval is a stall", []step{{at: 1100 * time.Millisecond, add: 100, want: true}, {at: 2200 * time.Millisecond, want: true, stalled: true}}, 100, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var buf syncBuf
			now := t0
			p := &restoreProgress{log: zerolog.New(&buf), rank: 3, step: 7, total: 1000, every: time.Second,
				now: func() time.Time { return now }, stop: make(chan struct{})}
			p.start, p.lastReport, p.lastArrival = t0, t0, t0
			reports := 0
			for i, s := range tc.steps {
				now = t0.Add(s.at)
				if s.add > 0 {
					p.add(s.add)
				} else {
					p.tick(now)
				}
				evs := buf.Events("restore_progress")
				if got := len(evs) > reports; got != s.want {
					t.Fatalf("step %d: reported %v, want %v", i, got, s.want)
				}
				if s.want {
					e := evs[len(evs)-1]
					if _, ok := e["stalled_for"]; ok != s.stalled {
						t.Errorf("step %d: stalled_for present %v, want %v (%v)", i, ok, s.stalled, e)
					}
					if e["rank"] != 3.0 || e["generation"] != 7.0 || e["bytes_total"] != 1000.0 {
						t.Errorf("step %d: event %v lacks rank 3, generation 7, total 1000", i, e)
					}
				}
				reports = len(evs)
			}
			evs := buf.Events("restore_progress")
			if len(evs) == 0 {
				return
			}
			e := evs[len(evs)-1]
			if e["bytes_done"] != float64(tc.done) {
				t.Errorf("last report: bytes_done %v, want %d", e["bytes_done"], tc.done)
			}
			// eta (zerolog's milliseconds): 200 bytes in 1 s leave 800 at
			// 200 B/s: 4 s.
			if eta, ok := e["eta"].(float64); tc.eta > 0 && (!ok || int64(eta) != tc.eta*1000) {
				t.Errorf("last report: eta %v, want %d s", e["eta"], tc.eta)
			}
		})
	}
}
