package netsched

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

const ms = time.Millisecond

// phase is one communication span and the idle span after it.
type phase struct{ comm, idle time.Duration }

type interval struct{ from, to time.Time }

func (a interval) overlaps(b interval) bool { return a.from.Before(b.to) && b.from.Before(a.to) }

// sim is the outcome of a simulated job.
type sim struct {
	comms   []interval
	chunks  []interval // every chunk's transmission
	events  []Event
	learned []time.Time // when each Learned event came
	planned []interval  // while a profile was in use
	stats   Stats
}

// simulate runs, in fake time, a trainer that goes through steps(i)'s
// phases for each step i, and a replicator that sends chunks of size
// bytes as fast as the Scheduler admits them over a link of bw bytes
// per second, each chunk taking size/bw.
func simulate(t *testing.T, cfg Config, nsteps int, steps func(i int) []phase, size int64, bw float64) sim {
	t.Helper()
	var out sim
	synctest.Test(t, func(t *testing.T) {
		s := New(cfg)
		ctx, cancel := context.WithCancel(t.Context())
		var mu sync.Mutex
		var wg sync.WaitGroup
		wg.Go(func() {
			d := time.Duration(float64(size) / bw * float64(time.Second))
			for {
				if err := s.Admit(ctx, Inbound, size); err != nil {
					return
				}
				start := time.Now()
				time.Sleep(d)
				s.Sent(size, d)
				mu.Lock()
				out.chunks = append(out.chunks, interval{start, start.Add(d)})
				mu.Unlock()
			}
		})
		for i := range nsteps {
			for _, p := range steps(i) {
				start := time.Now()
				if ev := s.Comm(start, true); ev.Kind != 0 {
					out.events = append(out.events, ev)
					switch ev.Kind {
					case Learned:
						out.learned = append(out.learned, start)
						out.planned = append(out.planned, interval{start, start.Add(time.Hour)})
					case Reprofiled:
						out.planned[len(out.planned)-1].to = start
					}
				}
				time.Sleep(p.comm)
				s.Comm(time.Now(), false)
				mu.Lock()
				out.comms = append(out.comms, interval{start, start.Add(p.comm)})
				mu.Unlock()
				time.Sleep(p.idle)
			}
		}
		cancel()
		wg.Wait()
		out.stats = s.Stats()
	})
	return out
}

// overruns counts the communication spans that the transmission of a
// chunk admitted under a profile overlapped.
func (r sim) overruns() int {
	n := 0
	for _, c := range r.comms {
		for _, ch := range r.chunks {
			if r.isPlanned(ch.from) && ch.overlaps(c) {
				n++
				break
			}
		}
	}
	return n
}

func (r sim) isPlanned(t time.Time) bool {
	for _, p := range r.planned {
		if t.After(p.from) && t.Before(p.to) { // a chunk at the instant of learning was admitted before it
			return true
		}
	}
	return false
}

func constant(ps ...phase) func(int) []phase { return func(int) []phase { return ps } }

func TestSchedule(t *testing.T) {
	const bw = 100 << 20 // 100 MiB/s: a 1 MiB chunk takes 10 ms
	tests := []struct {
		name   string
		cfg    Config
		steps  func(int) []phase
		nsteps int
		size   int64
		// want
		spans         int // comm spans per step in the profile
		minChunks     int64
		maxOverruns   int
		skipped       bool // some idle spans are skipped
		reprofiles    int64
		oversize      bool
		learnedAtMost int // the profile is learned within this many steps
	}{
		{name: "one all-reduce per step", cfg: Config{Bandwidth: bw}, steps: constant(phase{30 * ms, 70 * ms}), nsteps: 30, size: 1 << 20,
			spans: 1, minChunks: 25 * 5, learnedAtMost: 7},
		{name: "TP/PP: three spans per step, one too short", cfg: Config{Bandwidth: bw},
			steps: constant(phase{10 * ms, 5 * ms}, phase{10 * ms, 40 * ms}, phase{20 * ms, 15 * ms}), nsteps: 30, size: 1 << 20,
			spans: 3, minChunks: 25 * 4, skipped: true, learnedAtMost: 7},
		{name: "jitter: the shortest idle span is planned for", cfg: Config{Bandwidth: bw},
			steps: func(i int) []phase {
				j := time.Duration(i%3) * ms
				return []phase{{30*ms + j, 70*ms - 2*j}}
			}, nsteps: 30, size: 1 << 20, spans: 1, minChunks: 25 * 5, learnedAtMost: 7},
		{name: "idle spans shorter than a chunk", cfg: Config{Bandwidth: bw, MinChunk: 1 << 20},
			steps: constant(phase{10 * ms, 8 * ms}), nsteps: 30, size: 1 << 20,
			spans: 1, minChunks: 0, maxOverruns: 30, oversize: true, learnedAtMost: 7},
		{name: "bandwidth overestimated tenfold until measured", cfg: Config{Bandwidth: 10 * bw},
			steps: constant(phase{30 * ms, 70 * ms}), nsteps: 30, size: 1 << 20,
			spans: 1, minChunks: 25 * 5, maxOverruns: 1, learnedAtMost: 7},
		{name: "step time doubles: re-profiled", cfg: Config{Bandwidth: bw},
			steps: func(i int) []phase {
				if i < 15 {
					return []phase{{30 * ms, 70 * ms}}
				}
				return []phase{{60 * ms, 140 * ms}}
			}, nsteps: 40, size: 1 << 20, spans: 1, minChunks: 30 * 5, reprofiles: 1, learnedAtMost: 7},
		{name: "one slow step is no drift", cfg: Config{Bandwidth: bw},
			steps: func(i int) []phase {
				if i == 12 {
					return []phase{{30 * ms, 170 * ms}}
				}
				return []phase{{30 * ms, 70 * ms}}
			}, nsteps: 30, size: 1 << 20, spans: 1, minChunks: 25 * 5, learnedAtMost: 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := simulate(t, tt.cfg, tt.nsteps, tt.steps, tt.size, bw)
			if len(r.learned) == 0 {
				t.Fatalf("no profile learned in %d steps (events %v)", tt.nsteps, r.events)
			}
			if i := indexOf(r.comms, r.learned[0]); i > tt.learnedAtMost*tt.spans {
				t.Errorf("profile learned at span %d, want within %d steps", i, tt.learnedAtMost)
			}
			if k := len(r.events[0].Profile.Comm); k != tt.spans {
				t.Errorf("profile has %d spans per step, want %d: %v", k, tt.spans, r.events[0].Profile)
			}
			if n := r.overruns(); n > tt.maxOverruns {
				t.Errorf("%d communication spans overlapped a chunk after profiling, want at most %d", n, tt.maxOverruns)
			}
			if r.stats.Chunks < tt.minChunks {
				t.Errorf("%d chunks sent in idle spans, want at least %d (stats %+v)", r.stats.Chunks, tt.minChunks, r.stats)
			}
			if (r.stats.Skipped > 0) != tt.skipped && !tt.oversize {
				t.Errorf("skipped %d idle spans, want skipped=%v", r.stats.Skipped, tt.skipped)
			}
			if r.stats.Reprofiles != tt.reprofiles {
				t.Errorf("%d re-profiles, want %d (events %v)", r.stats.Reprofiles, tt.reprofiles, r.events)
			}
			if (r.stats.Oversize > 0) != tt.oversize {
				t.Errorf("%d oversize chunks, want oversize=%v", r.stats.Oversize, tt.oversize)
			}
			if tt.reprofiles > 0 {
				var re *Event
				for i := range r.events {
					if r.events[i].Kind == Reprofiled {
						re = &r.events[i]
					}
				}
				if re == nil || re.Change() < 0.9 || re.Change() > 1.1 {
					t.Errorf("re-profile event %+v: want the step time to have changed by about +100%%", re)
				}
				if len(r.learned) != 2 {
					t.Errorf("learned %d profiles, want 2", len(r.learned))
				}
			}
		})
	}
}

func indexOf(cs []interval, at time.Time) int {
	for i, c := range cs {
		if !c.from.Before(at) {
			return i
		}
	}
	return len(cs)
}

// TestBudget checks the size answered at points of a learned idle span.
func TestBudget(t *testing.T) {
	const bw = 100 << 20
	tests := []struct {
		name  string
		after time.Duration // since the phase ended
		comm  bool          // asked during a phase
		want  int64
	}{
		{"span start: 90% of 70 ms", 0, false, 63 * bw / 1000},
		{"half way", 35 * ms, false, 28 * bw / 1000},
		{"inside the guard", 65 * ms, false, 0},
		{"during a phase", 0, true, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := New(Config{Bandwidth: bw, MaxChunk: 1 << 30})
				if s.Budget(time.Now(), Inbound) != 1<<30 {
					t.Errorf("no profile, no phase: budget %d, want the ceiling", s.Budget(time.Now(), Inbound))
				}
				for range 7 {
					s.Comm(time.Now(), true)
					time.Sleep(30 * ms)
					s.Comm(time.Now(), false)
					time.Sleep(70 * ms)
				}
				if _, ok := s.Current(); !ok {
					t.Fatal("no profile after 7 steps")
				}
				s.Comm(time.Now(), true)
				if !tt.comm {
					time.Sleep(30 * ms)
					s.Comm(time.Now(), false)
					time.Sleep(tt.after)
				}
				got := s.Budget(time.Now(), Inbound)
				if d := got - tt.want; d < -1024 || d > 1024 {
					t.Errorf("budget %d, want %d", got, tt.want)
				}
			})
		})
	}
}

// TestDirections: a full-duplex link carries a span's worth of chunks each
// way; one direction's chunks do not take the other's room.
func TestDirections(t *testing.T) {
	const bw = 100 << 20
	span := int64(63 * bw / 1000) // 90% of a 70 ms idle span
	tests := []struct {
		name  string
		first Direction // a chunk that fills the span's room goes first
		then  Direction
		room  bool // whether then has room left
	}{
		{"in, then out", Inbound, Outbound, true},
		{"out, then in", Outbound, Inbound, true},
		{"in, then in", Inbound, Inbound, false},
		{"out, then out", Outbound, Outbound, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := New(Config{Bandwidth: bw, FixedBandwidth: true, MaxChunk: 1 << 30})
				for range 7 {
					s.Comm(time.Now(), true)
					time.Sleep(30 * ms)
					s.Comm(time.Now(), false)
					time.Sleep(70 * ms)
				}
				s.Comm(time.Now(), true)
				time.Sleep(30 * ms)
				s.Comm(time.Now(), false)
				if err := s.Admit(t.Context(), tt.first, span-1024); err != nil {
					t.Fatal(err)
				}
				got := s.Budget(time.Now(), tt.then)
				if tt.room && got < span-2048 {
					t.Errorf("%s budget %d after a full %s chunk, want about %d", tt.then, got, tt.first, span)
				}
				if !tt.room && got != 0 {
					t.Errorf("%s budget %d after a full %s chunk, want 0", tt.then, got, tt.first)
				}
				time.Sleep(70 * ms)
				s.Comm(time.Now(), true)
				if st := s.Stats(); st.Overran != 0 {
					t.Errorf("%d phases overrun by chunks that fit", st.Overran)
				}
			})
		})
	}
}

// TestNoPhases: a job that reports no communication phases is never
// held up (the agent logs that replication is unscheduled).
func TestNoPhases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Config{})
		for range 100 {
			if err := s.Admit(t.Context(), Inbound, 4<<20); err != nil {
				t.Fatal(err)
			}
		}
		if st := s.Stats(); st.Profiled || st.Unplanned != 100 {
			t.Errorf("stats %+v: want 100 unplanned chunks and no profile", st)
		}
	})
}

// TestAdmitCancelled: a chunk waiting through a long phase returns when
// its context ends.
func TestAdmitCancelled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Config{})
		s.Comm(time.Now(), true)
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if err := s.Admit(ctx, Inbound, 1); err != context.DeadlineExceeded {
			t.Errorf("Admit during an endless phase: %v, want the deadline", err)
		}
	})
}

// TestBandwidthEstimate: the best of the recent samples, so chunks slowed
// by the trainer's traffic do not shrink the plan, and a link that got
// slower for good shows after rateSamples samples.
func TestBandwidthEstimate(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		name  string
		fixed bool
		sents []time.Duration // each of 1 MiB
		want  float64
	}{
		{"none: the configured rate", false, nil, 7 * mib},
		{"one", false, []time.Duration{10 * ms}, 100 * mib},
		{"a slow one after a fast one", false, []time.Duration{10 * ms, 50 * ms}, 100 * mib},
		{"the fast one aged out", false, append([]time.Duration{10 * ms}, slicesRepeat(50*ms, rateSamples)...), 20 * mib},
		{"fixed: samples ignored", true, []time.Duration{10 * ms, 500 * ms}, 7 * mib},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := New(Config{Bandwidth: 7 * mib, FixedBandwidth: tt.fixed})
			for _, d := range tt.sents {
				s.Sent(mib, d)
			}
			if got := s.Stats().Bandwidth; got < tt.want*0.999 || got > tt.want*1.001 {
				t.Errorf("bandwidth %.0f, want %.0f", got, tt.want)
			}
		})
	}
}

func slicesRepeat(d time.Duration, n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = d
	}
	return out
}
