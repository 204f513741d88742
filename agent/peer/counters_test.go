package peer

import (
	"context"
	"testing"
	"time"
)

// TestCounters: each side counts the frames it writes and reads by type,
// the two sides' counts agree, and a connection counts as open from dial
// or accept until it closes, on both sides.
func TestCounters(t *testing.T) {
	const cs = 4 << 10
	src := newMemSource()
	src.add(key1, cs, map[string][]byte{"b": pattern(5*cs, "b")})
	for _, tc := range []struct {
		name string
		do   func(ctx context.Context, cl *Client, addr string) error
		// want: frames the dialer sends (by type) and receives; the
		// listener's are the mirror image. The handshake's four are in
		// every case.
		sent, recv map[Type]uint64
	}{
		{name: "watermarks", do: func(ctx context.Context, cl *Client, addr string) error {
			_, err := cl.Watermarks(ctx, addr, nil)
			return err
		}, sent: map[Type]uint64{TWatermarks: 1}, recv: map[Type]uint64{TWatermarksReply: 1}},
		{name: "two status calls", do: func(ctx context.Context, cl *Client, addr string) error {
			for range 2 {
				if _, _, err := cl.Status(ctx, addr); err != nil {
					return err
				}
			}
			return nil
		}, sent: map[Type]uint64{TStatus: 2}, recv: map[Type]uint64{TStatusReply: 2}},
		{name: "fetch of five chunks", do: func(ctx context.Context, cl *Client, addr string) error {
			_, err := cl.Fetch(ctx, FetchSpec{ChunkSize: cs, Size: 5 * cs, Dst: make([]byte, 5*cs),
				Sources: []Source{{Addr: addr, Key: ChunkKey{key1, "b"}}}})
			return err
		}, sent: map[Type]uint64{TFetch: 1}, recv: map[Type]uint64{TChunk: 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var lctr, dctr Counters
			lc, dc := baseConfig(t, "n1"), baseConfig(t, "n2")
			lc.Status = func() any { return "ok" }
			lc.Counters, dc.Counters = &lctr, &dctr
			srv := startServer(t, lc, src)
			cl := newClient(t, dc)
			if err := tc.do(testCtx(t, 10*time.Second), cl, srv.Addr().String()); err != nil {
				t.Fatal(err)
			}
			sent := map[Type]uint64{THello: 1, TAuth: 1}
			recv := map[Type]uint64{TChallenge: 1, TAuthReply: 1}
			for k, v := range tc.sent {
				sent[k] = v
			}
			for k, v := range tc.recv {
				recv[k] = v
			}
			d := dctr.Snapshot()
			waitFor(t, 5*time.Second, "the listener's counts", func() bool {
				l := lctr.Snapshot()
				for ty, n := range sent {
					if l.Recv[ty] != n {
						return false
					}
				}
				for ty, n := range recv { // counted after its write returned
					if l.Sent[ty] != n {
						return false
					}
				}
				return true
			})
			l := lctr.Snapshot()
			for ty, n := range sent {
				if d.Sent[ty] != n || l.Recv[ty] != n {
					t.Errorf("%s frames: dialer sent %d, listener received %d, want %d", ty, d.Sent[ty], l.Recv[ty], n)
				}
			}
			for ty, n := range recv {
				if d.Recv[ty] != n || l.Sent[ty] != n {
					t.Errorf("%s frames: listener sent %d, dialer received %d, want %d", ty, l.Sent[ty], d.Recv[ty], n)
				}
			}
			if s, r := d.Frames(nil); s < 3 || r < 3 || d.SentBytes < uint64(s)*HeaderSize || d.RecvBytes < uint64(r)*HeaderSize {
				t.Errorf("dialer totals: %d frames sent (%d bytes), %d received (%d bytes)", s, d.SentBytes, r, d.RecvBytes)
			}
			if d.Open != 1 || d.Opened != 1 || l.Open != 1 || l.Opened != 1 {
				t.Fatalf("open connections: dialer %d (%d opened), listener %d (%d opened), want 1 each", d.Open, d.Opened, l.Open, l.Opened)
			}
			cl.Close()
			waitFor(t, 5*time.Second, "both ends closed", func() bool {
				return dctr.Snapshot().Open == 0 && lctr.Snapshot().Open == 0
			})
			if diff := dctr.Snapshot().Sub(d); diff.Opened != 0 {
				t.Errorf("Sub: %d connections opened since, want 0", diff.Opened)
			}
		})
	}
}

// TestCountersNil: a nil *Counters counts nothing and snapshots as zero.
func TestCountersNil(t *testing.T) {
	var c *Counters
	c.sentFrame(TBeat, 10)
	c.recvFrame(Header{Type: TBeat})
	c.connOpened()
	c.connClosed()
	if s := c.Snapshot(); s != (CountersSnapshot{}) {
		t.Fatalf("nil counters: %+v", s)
	}
}

// TestReadBufferBulk: a connection reads through the small buffer until
// its first chunk frame arrives; a listener's, which never receives one,
// keeps it (docs/SCALE.md: every agent holds a connection to every other).
func TestReadBufferBulk(t *testing.T) {
	const cs = 4 << 10
	src := newMemSource()
	src.add(key1, cs, map[string][]byte{"b": pattern(3*cs, "b")})
	srv := startServer(t, baseConfig(t, "n1"), src)
	cl := newClient(t, baseConfig(t, "n2"))
	addr := srv.Addr().String()
	bulk := func() (dialer, listener []bool) {
		cl.mu.Lock()
		slots := cl.peers[addr]
		cl.mu.Unlock()
		for _, s := range slots {
			s.acquire(context.Background())
			if s.cc != nil {
				dialer = append(dialer, s.cc.c.bulkBuf.Load())
			}
			s.release()
		}
		srv.mu.Lock()
		for c := range srv.conns {
			listener = append(listener, c.bulkBuf.Load())
		}
		srv.mu.Unlock()
		return dialer, listener
	}
	ctx := testCtx(t, 10*time.Second)
	for _, tc := range []struct {
		name string
		do   func() error
		want bool // the dialer's connection has the large buffer after it
	}{
		{"watermarks", func() error { _, err := cl.Watermarks(ctx, addr, nil); return err }, false},
		{"fetch", func() error {
			_, err := cl.Fetch(ctx, FetchSpec{ChunkSize: cs, Size: 3 * cs, Dst: make([]byte, 3*cs),
				Sources: []Source{{Addr: addr, Key: ChunkKey{key1, "b"}}}})
			return err
		}, true},
		{"watermarks after a fetch", func() error { _, err := cl.Watermarks(ctx, addr, nil); return err }, true},
	} {
		if err := tc.do(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		d, l := bulk()
		if len(d) != 1 || d[0] != tc.want {
			t.Errorf("after %s: the dialer's connections' large buffers %v, want [%v]", tc.name, d, tc.want)
		}
		if len(l) != 1 || l[0] {
			t.Errorf("after %s: the listener's connections' large buffers %v, want [false]", tc.name, l)
		}
	}
}
