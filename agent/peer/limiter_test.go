package peer

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/reft-hpc/reft/agent/netsched"
)

func TestLimiterRate(t *testing.T) {
	for _, tc := range []struct {
		name       string
		rate, burs int64
		total, ea  int64
		lo, hi     time.Duration
	}{
		// (total - burst) / rate: 5 MB / 20 MB/s = 250 ms.
		// The upper bounds leave room for a loaded machine's late timers.
		{"small pieces", 20e6, 1e6, 6e6, 256 << 10, 200 * time.Millisecond, 1500 * time.Millisecond},
		// Pieces above the burst go into debt and still average the rate.
		{"pieces above the burst", 20e6, 1e6, 6e6, 2e6, 200 * time.Millisecond, 1500 * time.Millisecond},
		{"unlimited", 0, 0, 1e9, 1e6, 0, 500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLimiter(tc.rate, tc.burs)
			start := time.Now()
			for n := int64(0); n < tc.total; n += tc.ea {
				if err := l.Wait(context.Background(), netsched.Inbound, tc.ea); err != nil {
					t.Fatal(err)
				}
			}
			if took := time.Since(start); took < tc.lo || took > tc.hi {
				t.Fatalf("took %s, want %s to %s", took, tc.lo, tc.hi)
			}
		})
	}
	var nilL *Limiter
	if err := nilL.Wait(context.Background(), netsched.Inbound, 1<<40); err != nil {
		t.Fatal(err)
	}
}

func TestLimiterPause(t *testing.T) {
	l := NewLimiter(0, 0)
	l.Pause()
	l.Pause() // idempotent
	if !l.Paused() {
		t.Fatal("not paused")
	}
	done := make(chan error, 1)
	go func() { done <- l.Wait(context.Background(), netsched.Inbound, 1) }()
	select {
	case err := <-done:
		t.Fatalf("Wait returned while paused: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	l.Resume()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Second):
		t.Fatal("Wait still blocked after Resume")
	}
	l.Pause()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := l.Wait(ctx, netsched.Inbound, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait while paused with a deadline: %v", err)
	}
	l.Resume()
	l.SetRate(1e6, 1e5)
	if err := l.Wait(context.Background(), netsched.Inbound, 1e5); err != nil {
		t.Fatal(err)
	}
}

// TestBackgroundFetch: background fetches are paced by the limiter and
// stop while it is paused, with the connection kept alive by heartbeats
// for longer than the liveness timeout; a restore is not limited.
func TestBackgroundFetch(t *testing.T) {
	const cs = 64 << 10
	const n = 16 // 1 MiB
	data := pattern(n*cs, "bg")
	src := newMemSource()
	src.add(key1, cs, map[string][]byte{"b": data})
	lim := NewLimiter(4<<20, cs) // 1 MiB takes about 240 ms
	scfg := baseConfig(t, "n1")
	scfg.Background = lim
	scfg.Heartbeat, scfg.Timeout = 100*time.Millisecond, time.Second
	srv := startServer(t, scfg, src)
	ccfg := baseConfig(t, "n2")
	ccfg.Heartbeat, ccfg.Timeout = 100*time.Millisecond, time.Second
	cl := newClient(t, ccfg)
	fetch := func(bg bool) (time.Duration, error) {
		got := make([]byte, len(data))
		start := time.Now()
		_, err := cl.Fetch(testCtx(t, 20*time.Second), FetchSpec{ChunkSize: cs, Size: n * cs, Dst: got, Background: bg,
			Sources: []Source{{srv.Addr().String(), ChunkKey{key1, "b"}}}})
		if err == nil && string(got) != string(data) {
			err = errors.New("bytes differ")
		}
		return time.Since(start), err
	}
	if _, err := fetch(false); err != nil {
		t.Fatalf("foreground: %v", err)
	}
	lim.mu.Lock()
	full := lim.tokens == lim.burst
	lim.mu.Unlock()
	if !full {
		t.Fatal("a foreground fetch drew on the background limiter")
	}
	if took, err := fetch(true); err != nil || took < 180*time.Millisecond {
		t.Fatalf("background: %s, %v; want paced to about 240 ms", took, err)
	}
	lim.Pause()
	sent := srv.Stats().ChunksSent.Load()
	done := make(chan error, 1)
	go func() { _, err := fetch(true); done <- err }()
	time.Sleep(3 * scfg.Timeout / 2)
	if d := srv.Stats().ChunksSent.Load() - sent; d > 1 {
		t.Fatalf("%d chunks went out while paused", d)
	}
	lim.Resume()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if a := srv.Stats().Accepted.Load(); a != 1 {
		t.Fatalf("%d connections: the pause must not look like a dead peer", a)
	}
}

// TestBackgroundClientPause: the fetching agent's own pause holds back
// credit, so the serving agent stops after one window.
func TestBackgroundClientPause(t *testing.T) {
	const cs = 16 << 10
	src := newMemSource()
	src.add(key1, cs, map[string][]byte{"b": pattern(20*cs, "cp")})
	srv := startServer(t, baseConfig(t, "n1"), src)
	ccfg := baseConfig(t, "n2")
	ccfg.Background = NewLimiter(0, 0)
	ccfg.Background.Pause()
	cl := newClient(t, ccfg)
	done := make(chan error, 1)
	go func() {
		_, err := cl.Fetch(testCtx(t, 20*time.Second), FetchSpec{ChunkSize: cs, Size: 20 * cs, Dst: make([]byte, 20*cs), Background: true,
			Window: 2 * cs, Sources: []Source{{srv.Addr().String(), ChunkKey{key1, "b"}}}})
		done <- err
	}()
	time.Sleep(300 * time.Millisecond)
	if s := srv.Stats().ChunksSent.Load(); s > 2 {
		t.Fatalf("%d chunks sent with a paused receiver and a window of 2", s)
	}
	ccfg.Background.Resume()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

type countGate struct{ admitted, sent int64 }

func (g *countGate) Admit(_ context.Context, _ netsched.Direction, n int64) error {
	g.admitted += n
	return nil
}
func (g *countGate) Sent(n int64, _ time.Duration) { g.sent += n }

// TestLimiterGate: a Wait for bytes passes the gate after the bucket; a
// wait for the pause alone (n = 0) does not; Sent reaches the gate.
func TestLimiterGate(t *testing.T) {
	tests := []struct {
		name         string
		waits        []int64
		sent         int64
		wantAdmitted int64
	}{
		{"bytes", []int64{10, 20}, 5, 30},
		{"pause only", []int64{0, 0}, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := &countGate{}
			l := NewLimiter(0, 0)
			l.SetGate(g)
			for _, n := range tt.waits {
				if err := l.Wait(t.Context(), netsched.Outbound, n); err != nil {
					t.Fatal(err)
				}
			}
			l.Sent(tt.sent, time.Millisecond)
			if g.admitted != tt.wantAdmitted || g.sent != tt.sent {
				t.Errorf("gate admitted %d sent %d, want %d and %d", g.admitted, g.sent, tt.wantAdmitted, tt.sent)
			}
		})
	}
}

// TestDeliveryRate: a TCP connection that carried data has a rate; a
// pipe has none.
func TestDeliveryRate(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			io.Copy(io.Discard, c)
			c.Close()
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	var pm, m rateMeter
	if _, ok := pm.sample(a); ok {
		t.Error("a pipe has a delivery rate")
	}
	buf := make([]byte, 1<<20)
	for range 8 { // the rate is sampled as acknowledgements come back
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	for range 100 {
		if r, ok := m.sample(c); ok && r > 0 {
			return
		}
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	t.Error("no delivery rate after 108 MiB over loopback")
}
