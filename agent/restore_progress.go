package agent

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// restoreProgressEvery is how often a running sharded restore says how far
// it is (event restore_progress), so that a large one is visibly alive and
// a stalled one visibly stalled.
const restoreProgressEvery = time.Second

// restoreProgress counts the bytes of a restore as they land (local
// copies, peer chunks as each is verified, decoded shards) and logs them:
// at an arrival once every interval has passed since the last report, and,
// while nothing arrives for a whole interval, a stall report. With an
// interval of 0 every arrival is reported (tests).
type restoreProgress struct {
	log   zerolog.Logger
	rank  int
	step  int64
	total int64
	every time.Duration
	start time.Time
	now   func() time.Time

	done atomic.Int64

	mu          sync.Mutex
	lastReport  time.Time
	lastArrival time.Time
	reports     int
	stop        chan struct{}
	stopped     sync.WaitGroup
}

func newRestoreProgress(log zerolog.Logger, rank int, step, total int64, every time.Duration) *restoreProgress {
	p := &restoreProgress{log: log, rank: rank, step: step, total: total, every: every, now: time.Now, stop: make(chan struct{})}
	p.start = p.now()
	p.lastReport, p.lastArrival = p.start, p.start
	if every > 0 {
		p.stopped.Add(1)
		go p.watch()
	}
	return p
}

// add counts n bytes that landed.
func (p *restoreProgress) add(n int64) {
	if p == nil || n <= 0 {
		return
	}
	p.done.Add(n)
	now := p.now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lastArrival = now
	if now.Sub(p.lastReport) >= p.every {
		// Loaded under mu, so reports never go backwards.
		p.report(now, p.done.Load(), 0)
	}
}

// tick reports a stall: an interval and more with no byte landed.
func (p *restoreProgress) tick(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if idle := now.Sub(p.lastArrival); idle >= p.every && now.Sub(p.lastReport) >= p.every {
		p.report(now, p.done.Load(), idle)
	}
}

// watch calls tick every interval until close.
func (p *restoreProgress) watch() {
	defer p.stopped.Done()
	t := time.NewTicker(p.every)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			p.tick(p.now())
		}
	}
}

// report logs one restore_progress event; p.mu is held.
func (p *restoreProgress) report(now time.Time, done int64, stalled time.Duration) {
	p.lastReport = now
	p.reports++
	el := now.Sub(p.start)
	rate := float64(done) / max(el.Seconds(), 1e-9)
	ev := p.log.Info().Str("event", "restore_progress").Int("rank", p.rank).Int64("generation", p.step).
		Int64("bytes_done", done).Int64("bytes_total", p.total).
		Float64("percent", 100*float64(done)/float64(max(p.total, 1))).
		Float64("rate_mb_s", rate/1e6).Dur("elapsed", el)
	if rate > 0 && done < p.total {
		ev = ev.Dur("eta", time.Duration(float64(p.total-done)/rate*float64(time.Second)))
	}
	msg := "restore in progress"
	if stalled > 0 {
		ev = ev.Dur("stalled_for", stalled)
		msg = "restore in progress: no byte landed for a while (its peers are slow or gone; it fails over or times out)"
	}
	ev.Msg(msg)
}

// close stops the stall watch.
func (p *restoreProgress) close() {
	if p == nil {
		return
	}
	close(p.stop)
	p.stopped.Wait()
}
