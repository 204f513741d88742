package peer

import (
	"context"
	"sync"
	"time"

	"github.com/reft-hpc/reft/agent/netsched"
)

// Limiter is a token bucket for background (replication) bytes. Pause
// stops it outright while the trainer reports a communication phase, so
// that replication only uses the network in the gaps (GEMINI's
// interleaving); Resume lets it go on. Foreground traffic never touches it.
//
// A Wait for more than the burst is allowed: it takes the bucket into debt
// and sleeps it off, so chunks larger than the burst still pass, at rate.
type Limiter struct {
	mu     sync.Mutex
	rate   float64 // bytes per second; <= 0: unlimited
	burst  float64
	tokens float64
	last   time.Time
	paused bool
	resume chan struct{} // closed by Resume
	gate   Gate          // nil: none
}

// Gate decides when a background chunk may start after the token bucket
// has passed it (agent/netsched's idle-span schedule). Admit blocks until
// n bytes may start in direction dir (fetched: netsched.Inbound; served:
// netsched.Outbound); Sent reports that n bytes took d to write.
type Gate interface {
	Admit(ctx context.Context, dir netsched.Direction, n int64) error
	Sent(n int64, d time.Duration)
}

// SetGate makes every later Wait also pass g (nil: none). Set it before
// traffic starts.
func (l *Limiter) SetGate(g Gate) {
	l.mu.Lock()
	l.gate = g
	l.mu.Unlock()
}

// Sent tells the gate, if any, that n background bytes took d to write.
func (l *Limiter) Sent(n int64, d time.Duration) {
	if l == nil {
		return
	}
	l.mu.Lock()
	g := l.gate
	l.mu.Unlock()
	if g != nil {
		g.Sent(n, d)
	}
}

// NewLimiter allows rate bytes per second with bursts of burst bytes;
// rate <= 0 means unlimited (Pause still works).
func NewLimiter(rate, burst int64) *Limiter {
	if burst <= 0 {
		burst = max(rate/10, 1<<20)
	}
	return &Limiter{rate: float64(rate), burst: float64(burst), tokens: float64(burst), last: time.Now()}
}

// SetRate changes the rate and burst, keeping accrued tokens up to burst.
func (l *Limiter) SetRate(rate, burst int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refill(time.Now())
	if burst <= 0 {
		burst = max(rate/10, 1<<20)
	}
	l.rate, l.burst = float64(rate), float64(burst)
	l.tokens = min(l.tokens, l.burst)
}

// Pause blocks every Wait until Resume. A Wait already past its sleep
// completes; one still sleeping finishes its sleep, then waits for Resume.
func (l *Limiter) Pause() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.paused {
		l.refill(time.Now())
		l.paused = true
		l.resume = make(chan struct{})
	}
}

// Resume ends a Pause. Tokens do not accrue while paused.
func (l *Limiter) Resume() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.paused {
		l.paused = false
		l.last = time.Now()
		close(l.resume)
	}
}

// Paused reports whether the limiter is paused.
func (l *Limiter) Paused() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.paused
}

func (l *Limiter) refill(now time.Time) {
	if !l.paused && l.rate > 0 {
		l.tokens = min(l.burst, l.tokens+now.Sub(l.last).Seconds()*l.rate)
	}
	l.last = now
}

// waitResume blocks while paused.
func (l *Limiter) waitResume(ctx context.Context) error {
	for {
		l.mu.Lock()
		if !l.paused {
			l.mu.Unlock()
			return nil
		}
		ch := l.resume
		l.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Wait takes n bytes' worth of tokens, blocking while paused and until the
// bucket has them, then until the gate (if any) admits them in direction
// dir (n > 0: a wait for the pause alone does not ask the gate). The
// bucket is shared by both directions. A nil Limiter never blocks.
func (l *Limiter) Wait(ctx context.Context, dir netsched.Direction, n int64) error {
	if l == nil {
		return nil
	}
	if err := l.wait(ctx, n); err != nil {
		return err
	}
	l.mu.Lock()
	g := l.gate
	l.mu.Unlock()
	if g == nil || n <= 0 {
		return nil
	}
	return g.Admit(ctx, dir, n)
}

func (l *Limiter) wait(ctx context.Context, n int64) error {
	if err := l.waitResume(ctx); err != nil {
		return err
	}
	l.mu.Lock()
	if l.paused { // paused between the check and the lock: start over
		l.mu.Unlock()
		return l.wait(ctx, n)
	}
	now := time.Now()
	l.refill(now)
	if l.rate <= 0 {
		l.mu.Unlock()
		return nil
	}
	l.tokens -= float64(n)
	debt := -l.tokens
	rate := l.rate
	l.mu.Unlock()
	if debt > 0 {
		t := time.NewTimer(time.Duration(debt / rate * float64(time.Second)))
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			l.mu.Lock()
			l.tokens += float64(n) // give back what was not used
			l.mu.Unlock()
			return ctx.Err()
		}
	}
	return l.waitResume(ctx)
}
