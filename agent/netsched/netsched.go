// Package netsched schedules background replication into the idle spans
// of a training job's network (GEMINI, section 5).
//
// A synchronous training job uses the network in a pattern that repeats
// every step: one or more communication spans (all-reduce, TP/PP
// exchanges), separated by spans of computation in which the network is
// idle. The Scheduler learns that pattern from the node's communication
// phase reports (Comm: the agent's ranks' comm messages, merged so that
// the node is "in a phase" while any rank is), over the first steps:
// the cycle of K spans that repeats, each span's length and the idle
// span after it. After that, when a phase ends it predicts how long the
// network stays idle, and admits a chunk of replication only if, at the
// measured bandwidth, the chunk is done before the next phase is due
// (with a guard). A chunk is never started if it would overrun the span;
// a span too short for one chunk is skipped.
//
// When the step time drifts (the cycle measured over Config.DriftSteps
// successive steps differs from the profile by more than Config.Drift),
// the profile is dropped and learned again; Comm returns an Event saying
// so, and by how much, for the caller to log.
//
// Until a profile is learned (the first steps, after a re-profile, or a
// job that reports no phases) the Scheduler behaves as the agent's
// "paused" policy: it admits whatever is asked while no phase is active.
// Stats says which state it is in.
//
// Memory: the Scheduler keeps the last (ProfileSteps+1)*MaxSpans+1 spans
// (two time.Time each, 48 bytes), two durations per cycle position and 8
// bandwidth samples: with the defaults (5 steps, 8 spans) under 3 KiB per
// Scheduler. The
// data it admits is not buffered here: the caller's window (the peer
// fetch's in-flight chunks) is the pipeline's buffer.
//
// Direction: a node's link carries its chunks out (the copies of its own
// ranks' state that its peers fetch) and in (the copies it fetches) at
// once; a full-duplex link, and a shaper, cap each direction on its own.
// The Scheduler keeps one timeline per Direction, so that a span holds
// what each direction can carry in it, not their sum.
//
// Concurrency: every method is safe for concurrent use. Comm calls must
// be made in the order the phases changed (one goroutine, or under the
// caller's lock); Admit may block in many goroutines at once, and a
// chunk admitted to one of them is charged to the link before any other
// is considered.
package netsched

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Config tunes a Scheduler; zero fields take the defaults (Default).
type Config struct {
	// ProfileSteps is how many repetitions of the cycle a profile needs.
	ProfileSteps int
	// MaxSpans is the most communication spans per step the profile
	// looks for (TP/PP jobs have several).
	MaxSpans int
	// Drift is the relative change of the step time (and of a span's
	// length, within the profile) that counts as a different pattern.
	Drift float64
	// DriftSteps is how many successive drifted steps drop the profile:
	// one slow step (an evaluation, a save) must not.
	DriftSteps int
	// Guard is the fraction of each predicted idle span kept free before
	// the next phase is due (jitter, the bandwidth estimate's error);
	// MinGuard is its floor.
	Guard    float64
	MinGuard time.Duration
	// MinChunk is the floor of a grant: a span with less room is skipped.
	// MaxChunk is the ceiling Budget answers.
	MinChunk, MaxChunk int64
	// Bandwidth is the link's bytes per second before any is measured
	// (Sent); the caller's configured cap is a good start.
	Bandwidth float64
	// FixedBandwidth makes Bandwidth the link's rate for good: Sent's
	// samples are ignored (the site knows its links, and a shaper's
	// bucket or a link shared with the trainer makes samples misread it).
	FixedBandwidth bool
}

// Default is the configuration zero fields take.
var Default = Config{ProfileSteps: 5, MaxSpans: 8, Drift: 0.25, DriftSteps: 3,
	Guard: 0.1, MinGuard: 500 * time.Microsecond, MinChunk: 64 << 10, MaxChunk: 64 << 20,
	Bandwidth: 100 << 20}

func (c Config) withDefaults() Config {
	d := Default
	if c.ProfileSteps <= 0 {
		c.ProfileSteps = d.ProfileSteps
	}
	if c.MaxSpans <= 0 {
		c.MaxSpans = d.MaxSpans
	}
	if c.Drift <= 0 {
		c.Drift = d.Drift
	}
	if c.DriftSteps <= 0 {
		c.DriftSteps = d.DriftSteps
	}
	if c.Guard <= 0 {
		c.Guard = d.Guard
	}
	if c.MinGuard <= 0 {
		c.MinGuard = d.MinGuard
	}
	if c.MinChunk <= 0 {
		c.MinChunk = d.MinChunk
	}
	if c.MaxChunk < c.MinChunk {
		c.MaxChunk = max(d.MaxChunk, c.MinChunk)
	}
	if c.Bandwidth <= 0 {
		c.Bandwidth = d.Bandwidth
	}
	return c
}

// Profile is a learned communication timeline.
type Profile struct {
	// Step is the median time from one cycle's first span to the next's.
	Step time.Duration
	// Comm[j] is the longest span at position j of the cycle, Idle[j]
	// the shortest idle span after it (what the schedule plans for).
	Comm, Idle []time.Duration
}

func (p Profile) String() string {
	return fmt.Sprintf("step %s, %d communication span(s) per step %v, idle spans %v", p.Step, len(p.Comm), p.Comm, p.Idle)
}

// EventKind says what an Event reports.
type EventKind int

const (
	// Learned: a profile was learned.
	Learned EventKind = iota + 1
	// Reprofiled: the step time drifted; the profile was dropped.
	Reprofiled
)

// Event is a change of the Scheduler's profile, for the caller to log.
type Event struct {
	Kind    EventKind
	Profile Profile // Learned: the new one; Reprofiled: the dropped one
	// Measured is the step time that drifted (Reprofiled).
	Measured time.Duration
}

// Change is the relative drift of a Reprofiled event.
func (e Event) Change() float64 {
	if e.Profile.Step <= 0 {
		return 0
	}
	return float64(e.Measured-e.Profile.Step) / float64(e.Profile.Step)
}

// Stats is what the Scheduler did.
type Stats struct {
	Profiled   bool    // a profile is in use
	Bandwidth  float64 // the estimate in use, bytes per second
	Chunks     int64   // chunks admitted into predicted idle spans
	Bytes      int64   // their bytes
	Unplanned  int64   // chunks admitted with no profile (paused-like)
	Skipped    int64   // idle spans that ended with a chunk waiting and none admitted
	Overran    int64   // phases that began before the admitted chunks were done (at the estimated bandwidth)
	Oversize   int64   // chunks larger than any idle span, each started alone at a span's beginning
	Reprofiles int64
}

type span struct{ begin, end time.Time } // end zero: in progress

// Direction is which way a chunk crosses the node's link.
type Direction int

const (
	// Inbound: a chunk this node fetches (its copy of a peer's state).
	Inbound Direction = iota
	// Outbound: a chunk this node serves to a peer.
	Outbound
)

func (d Direction) String() string {
	if d == Outbound {
		return "outbound"
	}
	return "inbound"
}

// Scheduler is one node's schedule; see the package doc.
type Scheduler struct {
	cfg Config

	mu      sync.Mutex
	spans   []span // the recent spans, oldest first (bounded)
	n       int64  // index of spans[len(spans)-1] among all spans seen
	inComm  bool
	changed chan struct{} // closed and replaced on every Comm change

	prof    *Profile
	base    int64     // a span index at cycle position 0
	idleEnd time.Time // predicted start of the next phase; zero: none
	idleLen time.Duration
	busy    [2]time.Time // per Direction: when the chunks admitted so far are done, at bw
	drifted int          // successive drifted steps
	bw      float64
	meas    bool      // bw is measured
	rates   []float64 // the last rateSamples measurements

	waiting  int  // Admit calls blocked
	sentSpan bool // a chunk was admitted in the current idle span
	wantSpan bool // an Admit waited during the current idle span
	st       Stats
}

// New returns a Scheduler with no profile.
func New(cfg Config) *Scheduler {
	cfg = cfg.withDefaults()
	return &Scheduler{cfg: cfg, n: -1, bw: cfg.Bandwidth, changed: make(chan struct{})}
}

func (s *Scheduler) wake() {
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *Scheduler) keep() int { return (s.cfg.ProfileSteps+1)*s.cfg.MaxSpans + 1 }

// at returns the span with index i, if still kept.
func (s *Scheduler) at(i int64) (span, bool) {
	k := int64(len(s.spans)) - 1 - (s.n - i)
	if i > s.n || k < 0 {
		return span{}, false
	}
	return s.spans[k], true
}

// Comm records that the node entered (active) or left a communication
// phase at now. It returns a non-zero Event when the profile changed.
func (s *Scheduler) Comm(now time.Time, active bool) Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	if active == s.inComm {
		return Event{}
	}
	s.inComm = active
	defer s.wake()
	if !active {
		if s.n >= 0 {
			s.spans[len(s.spans)-1].end = now
		}
		s.sentSpan, s.wantSpan = false, s.waiting > 0
		s.idleEnd = time.Time{}
		if s.prof != nil {
			k := len(s.prof.Idle)
			pos := int(((s.n-s.base)%int64(k) + int64(k)) % int64(k))
			s.idleLen = s.prof.Idle[pos]
			s.idleEnd = now.Add(s.idleLen)
		}
		return Event{}
	}
	// A phase begins: close the idle span, record the span.
	if s.prof != nil && (s.busy[Inbound].After(now) || s.busy[Outbound].After(now)) {
		s.st.Overran++
	}
	if s.prof != nil && s.n >= 0 && s.wantSpan && !s.sentSpan {
		s.st.Skipped++
	}
	s.idleEnd, s.busy = time.Time{}, [2]time.Time{}
	s.n++
	s.spans = append(s.spans, span{begin: now})
	if len(s.spans) > s.keep() {
		s.spans = append(s.spans[:0], s.spans[1:]...)
	}
	if s.prof != nil {
		return s.checkDrift(now)
	}
	if p, base, ok := s.learn(); ok {
		s.prof, s.base, s.drifted = &p, base, 0
		return Event{Kind: Learned, Profile: p}
	}
	return Event{}
}

// checkDrift compares the cycle that ended at now with the profile's.
func (s *Scheduler) checkDrift(now time.Time) Event {
	prev, ok := s.at(s.n - int64(len(s.prof.Comm)))
	if !ok {
		return Event{}
	}
	cyc := now.Sub(prev.begin)
	if rel(cyc, s.prof.Step) <= s.cfg.Drift {
		s.drifted = 0
		return Event{}
	}
	if s.drifted++; s.drifted < s.cfg.DriftSteps {
		return Event{}
	}
	ev := Event{Kind: Reprofiled, Profile: *s.prof, Measured: cyc}
	s.prof, s.drifted = nil, 0
	s.st.Reprofiles++
	// Learn the new pattern from spans of the new regime only.
	s.spans = append(s.spans[:0], s.spans[len(s.spans)-1])
	return ev
}

func rel(a, b time.Duration) float64 {
	if b <= 0 {
		return 1
	}
	d := float64(a - b)
	if d < 0 {
		d = -d
	}
	return d / float64(b)
}

// learn looks for the shortest cycle of K spans that repeats over the
// last ProfileSteps*K complete spans (each span with the idle span after
// it, which the newest span's begin closes). It returns the profile and
// the index of a span at position 0.
func (s *Scheduler) learn() (Profile, int64, bool) {
	complete := len(s.spans) - 1 // the newest has no idle span after it yet
	for k := 1; k <= s.cfg.MaxSpans; k++ {
		w := s.cfg.ProfileSteps * k
		if complete < w {
			return Profile{}, 0, false // a longer cycle needs even more spans
		}
		win := s.spans[complete-w : complete+1] // w spans and the next begin
		if p, ok := fit(win, k, s.cfg.Drift); ok {
			return p, s.n - int64(w), true
		}
	}
	return Profile{}, 0, false
}

// fit checks that win (w = len(win)-1 complete spans, then a begin)
// repeats with period k, and returns its profile.
func fit(win []span, k int, tol float64) (Profile, bool) {
	w := len(win) - 1
	var cycles []time.Duration
	for i := 0; i+k <= w; i++ {
		cycles = append(cycles, win[i+k].begin.Sub(win[i].begin))
	}
	slices.Sort(cycles)
	step := cycles[len(cycles)/2]
	if step <= 0 {
		return Profile{}, false
	}
	p := Profile{Step: step, Comm: make([]time.Duration, k), Idle: make([]time.Duration, k)}
	for j := range k {
		p.Idle[j] = -1
	}
	for i := range w {
		c, idle := win[i].end.Sub(win[i].begin), win[i+1].begin.Sub(win[i].end)
		if i+k < w {
			c2, idle2 := win[i+k].end.Sub(win[i+k].begin), win[i+k+1].begin.Sub(win[i+k].end)
			if rel(c2, c)*float64(max(c, c2)) > tol*float64(step) || rel(idle2, idle)*float64(max(idle, idle2)) > tol*float64(step) {
				return Profile{}, false
			}
		}
		j := i % k
		p.Comm[j] = max(p.Comm[j], c)
		if p.Idle[j] < 0 || idle < p.Idle[j] {
			p.Idle[j] = idle
		}
	}
	return p, true
}

// rateSamples is how many recent Sent samples the bandwidth estimate is
// the best of.
const rateSamples = 8

// Sent records that n bytes took d to send. The bandwidth estimate is the
// best of the last rateSamples: a chunk that shared the link with the
// trainer's traffic got through slower than the link can carry, and one
// that had it to itself shows what an idle span holds.
func (s *Scheduler) Sent(n int64, d time.Duration) {
	if n <= 0 || d <= 0 {
		return
	}
	r := float64(n) / d.Seconds()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cfg.FixedBandwidth {
		return
	}
	if len(s.rates) == rateSamples {
		s.rates = append(s.rates[:0], s.rates[1:]...)
	}
	s.rates = append(s.rates, r)
	s.bw, s.meas = slices.Max(s.rates), true
}

// fitBytes is how many bytes can start at now in direction dir and be
// done, at the bandwidth, before the guard ahead of the predicted next
// phase.
func (s *Scheduler) fitBytes(now time.Time, dir Direction) int64 {
	if s.inComm || s.idleEnd.IsZero() {
		return 0
	}
	end := s.idleEnd.Add(-s.guard(s.idleLen))
	start := now
	if s.busy[dir].After(start) {
		start = s.busy[dir]
	}
	if !end.After(start) {
		return 0
	}
	b := int64(end.Sub(start).Seconds() * s.bw)
	if b < s.cfg.MinChunk {
		return 0
	}
	return b
}

func (s *Scheduler) guard(idle time.Duration) time.Duration {
	return max(s.cfg.MinGuard, time.Duration(s.cfg.Guard*float64(idle)))
}

// largest is the most bytes any idle span of the profile holds.
func (s *Scheduler) largest() int64 {
	var b int64
	for _, idle := range s.prof.Idle {
		b = max(b, int64((idle-s.guard(idle)).Seconds()*s.bw))
	}
	return b
}

// Budget is the size of the chunk to start at now in direction dir: the
// room left in the current idle span at the bandwidth, cut to
// Config.MaxChunk; 0 when none may start (a phase, no room). With no
// profile it is MaxChunk outside phases.
func (s *Scheduler) Budget(now time.Time, dir Direction) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.prof == nil {
		if s.inComm {
			return 0
		}
		return s.cfg.MaxChunk
	}
	return min(s.fitBytes(now, dir), s.cfg.MaxChunk)
}

// take admits n bytes at now if they fit, charging them to the link's
// direction dir.
func (s *Scheduler) take(now time.Time, dir Direction, n int64) bool {
	if s.prof == nil {
		if s.inComm {
			return false
		}
		s.st.Unplanned++
		s.sentSpan = true
		return true
	}
	if n > s.fitBytes(now, dir) {
		// A chunk no idle span holds would wait forever: it starts
		// alone at the beginning of the longest idle span, and is
		// counted.
		if n <= s.largest() || s.inComm || s.idleEnd.IsZero() || s.busy[dir].After(now) || s.sentSpan ||
			s.idleLen < slices.Max(s.prof.Idle) {
			return false
		}
		s.st.Oversize++
	}
	start := now
	if s.busy[dir].After(start) {
		start = s.busy[dir]
	}
	s.busy[dir] = start.Add(time.Duration(float64(n) / s.bw * float64(time.Second)))
	s.sentSpan = true
	s.st.Chunks++
	s.st.Bytes += n
	return true
}

// Admit blocks until a chunk of n bytes may start in direction dir: at
// once if it fits the current idle span, else at a later one (the first
// that has room for it; the waits are woken by Comm). With no profile it
// waits only while a phase is active. It returns ctx's error if ctx ends
// first.
func (s *Scheduler) Admit(ctx context.Context, dir Direction, n int64) error {
	s.mu.Lock()
	for {
		if s.take(time.Now(), dir, n) {
			s.mu.Unlock()
			return nil
		}
		if !s.inComm {
			s.wantSpan = true
		}
		ch := s.changed
		s.waiting++
		s.mu.Unlock()
		var err error
		select {
		case <-ch:
		case <-ctx.Done():
			err = ctx.Err()
		}
		s.mu.Lock()
		s.waiting--
		if err != nil {
			s.mu.Unlock()
			return err
		}
	}
}

// Stats returns what the Scheduler did so far.
func (s *Scheduler) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.st
	st.Profiled, st.Bandwidth = s.prof != nil, s.bw
	return st
}

// Current returns the profile in use, if any.
func (s *Scheduler) Current() (Profile, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.prof == nil {
		return Profile{}, false
	}
	return *s.prof, true
}
