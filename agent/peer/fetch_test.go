package peer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var key1 = GenKey{Rank: 3, Shard: "state", Step: 10, Seq: 4}

func TestFetchWhole(t *testing.T) {
	const cs = 64 << 10
	src := newMemSource()
	sizes := map[string]int64{"one-byte": 1, "one-chunk": cs, "chunk-plus-one": cs + 1, "many": 37*cs + 1234, "empty": 0}
	bufs := map[string][]byte{}
	for name, n := range sizes {
		bufs[name] = pattern(n, name)
	}
	src.add(key1, cs, bufs)
	srv := startServer(t, baseConfig(t, "n1"), src)
	cl := newClient(t, baseConfig(t, "n2"))
	addr := srv.Addr().String()

	for _, tc := range []struct {
		buffer  string
		window  int64
		deliver bool
		chunks  []int
		withCRC bool
	}{
		{buffer: "one-byte"},
		{buffer: "one-chunk", deliver: true},
		{buffer: "chunk-plus-one", withCRC: true},
		{buffer: "many"},
		{buffer: "many", window: 1}, // below one chunk: one chunk at a time
		{buffer: "many", window: 3 * cs, deliver: true},
		{buffer: "many", chunks: []int{0, 5, 6, 7, 36, 37}, withCRC: true},
		{buffer: "empty"},
	} {
		t.Run(fmt.Sprintf("%s/window=%d/deliver=%v/chunks=%v", tc.buffer, tc.window, tc.deliver, tc.chunks), func(t *testing.T) {
			want := bufs[tc.buffer]
			spec := FetchSpec{ChunkSize: cs, Size: int64(len(want)), Chunks: tc.chunks, Window: tc.window,
				Sources: []Source{{Addr: addr, Key: ChunkKey{key1, tc.buffer}}}}
			if tc.withCRC {
				spec.CRC = src.gens[key1].info.Buffer(tc.buffer).CRC32C
			}
			got := make([]byte, len(want))
			var mu sync.Mutex
			seen := map[int]bool{}
			if tc.deliver {
				spec.Deliver = func(i int, data []byte) error {
					mu.Lock()
					defer mu.Unlock()
					if seen[i] {
						return fmt.Errorf("chunk %d delivered twice", i)
					}
					seen[i] = true
					copy(got[int64(i)*cs:], data)
					return nil
				}
			} else {
				spec.Dst = got
			}
			st, err := cl.Fetch(testCtx(t, 10*time.Second), spec)
			if err != nil {
				t.Fatal(err)
			}
			n := numChunks(int64(len(want)), cs)
			if tc.chunks != nil {
				n = int64(len(tc.chunks))
				for _, c := range tc.chunks {
					lo := int64(c) * cs
					hi := min(lo+cs, int64(len(want)))
					if !bytes.Equal(got[lo:hi], want[lo:hi]) {
						t.Fatalf("chunk %d differs", c)
					}
				}
			} else if !bytes.Equal(got, want) {
				t.Fatal("fetched bytes differ")
			}
			if int64(st.Chunks) != n || st.Failovers != 0 {
				t.Fatalf("stats %+v, want %d chunks and no failover", st, n)
			}
		})
	}
	waitFor(t, time.Second, "every generation unpinned", func() bool { return src.pins.Load() == 0 })
}

func TestFetchRefusals(t *testing.T) {
	const cs = 4096
	src := newMemSource()
	src.add(key1, cs, map[string][]byte{"b": pattern(10*cs, "b")})
	srv := startServer(t, baseConfig(t, "n1"), src)
	cl := newClient(t, baseConfig(t, "n2"))
	addr := srv.Addr().String()
	other := key1
	other.Seq = 99
	for _, tc := range []struct {
		name string
		spec FetchSpec
		code string
	}{
		{"generation not here", FetchSpec{ChunkSize: cs, Size: 10 * cs, Sources: []Source{{addr, ChunkKey{other, "b"}}}}, CodeNotFound},
		{"buffer not here", FetchSpec{ChunkSize: cs, Size: 10 * cs, Sources: []Source{{addr, ChunkKey{key1, "nope"}}}}, CodeNotFound},
		{"other chunk size", FetchSpec{ChunkSize: 2 * cs, Size: 10 * cs, Sources: []Source{{addr, ChunkKey{key1, "b"}}}}, CodeMismatch},
		{"other buffer size", FetchSpec{ChunkSize: cs, Size: 11 * cs, Sources: []Source{{addr, ChunkKey{key1, "b"}}}}, CodeMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.spec.Dst = make([]byte, tc.spec.Size)
			_, err := cl.Fetch(testCtx(t, 5*time.Second), tc.spec)
			var fe *FetchError
			if !errors.As(err, &fe) {
				t.Fatalf("got %v, want a FetchError", err)
			}
			if len(fe.Failed) != int(numChunks(tc.spec.Size, tc.spec.ChunkSize)) {
				t.Fatalf("%d chunks failed: %v", len(fe.Failed), err)
			}
			if a := fe.Failed[0].Attempts; len(a) != 1 || !IsCode(a[0].Err, tc.code) {
				t.Fatalf("attempts %v, want one with code %s", a, tc.code)
			}
		})
	}
	// Bad specs are refused before anything is sent.
	for _, spec := range []FetchSpec{
		{ChunkSize: 0, Size: 1, Dst: make([]byte, 1), Sources: []Source{{}}},
		{ChunkSize: cs, Size: 1, Sources: []Source{{}}},
		{ChunkSize: cs, Size: 2, Dst: make([]byte, 1), Sources: []Source{{}}},
		{ChunkSize: cs, Size: 1, Dst: make([]byte, 1)},
		{ChunkSize: cs, Size: 1, Dst: make([]byte, 1), Sources: []Source{{}}, Chunks: []int{1}},
		{ChunkSize: cs, Size: 1, Dst: make([]byte, 1), Sources: []Source{{}}, CRC: []uint32{1, 2}},
	} {
		if _, err := cl.Fetch(context.Background(), spec); err == nil {
			t.Errorf("spec %+v accepted", spec)
		}
	}
}

// TestFetchFallback: a corrupt chunk on one peer, a generation missing on
// another, a peer that is not there at all: every chunk still arrives,
// from the next candidate.
func TestFetchFallback(t *testing.T) {
	const cs = 32 << 10
	data := pattern(20*cs+100, "fallback")
	corrupt, good, missing := newMemSource(), newMemSource(), newMemSource()
	for _, s := range []*memSource{corrupt, good} {
		s.add(key1, cs, map[string][]byte{"b": data})
	}
	corrupt.corrupt(key1, "b", 3)
	corrupt.corrupt(key1, "b", 17)
	sCorrupt := startServer(t, baseConfig(t, "corrupt"), corrupt)
	sGood := startServer(t, baseConfig(t, "good"), good)
	sMissing := startServer(t, baseConfig(t, "missing"), missing)
	// A port nobody listens on: dialing it is refused at once.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	nobody := ln.Addr().String()
	ln.Close()

	src := func(addr string) Source { return Source{addr, ChunkKey{key1, "b"}} }
	for _, tc := range []struct {
		name      string
		sources   []Source
		failovers int
	}{
		{"corrupt first", []Source{src(sCorrupt.Addr().String()), src(sGood.Addr().String())}, 2},
		{"missing then corrupt then good", []Source{src(sMissing.Addr().String()), src(sCorrupt.Addr().String()), src(sGood.Addr().String())}, 21 + 2},
		{"dead peer first", []Source{src(nobody), src(sGood.Addr().String())}, 21},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := newClient(t, baseConfig(t, "fetcher"))
			got := make([]byte, len(data))
			st, err := cl.Fetch(testCtx(t, 10*time.Second), FetchSpec{ChunkSize: cs, Size: int64(len(data)), Dst: got, Sources: tc.sources})
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data) {
				t.Fatal("fetched bytes differ")
			}
			if st.Failovers != tc.failovers {
				t.Fatalf("%d failovers, want %d", st.Failovers, tc.failovers)
			}
			// Every failover is reported with the chunk, the failed
			// attempts and the source that delivered it.
			var n int
			for _, rc := range st.Recovered {
				n += len(rc.Attempts)
				for _, a := range rc.Attempts {
					if a.Source == rc.From {
						t.Errorf("chunk %d recovered from %s, which failed it", rc.Chunk, rc.From.Addr)
					}
				}
				if (rc.Chunk == 3 || rc.Chunk == 17) && rc.From.Addr != sGood.Addr().String() {
					t.Errorf("corrupt chunk %d recovered from %s, want the good peer", rc.Chunk, rc.From.Addr)
				}
				if tc.name == "corrupt first" && (!errors.Is(rc.Attempts[0].Err, ErrChecksum) || rc.Chunk != 3 && rc.Chunk != 17) {
					t.Errorf("chunk %d recovered after %v; want chunks 3 and 17 after a checksum error", rc.Chunk, rc.Attempts)
				}
			}
			if n != tc.failovers {
				t.Errorf("recovered chunks report %d failed attempts, want %d (%+v)", n, tc.failovers, st.Recovered)
			}
		})
	}

	t.Run("corrupt only", func(t *testing.T) {
		cl := newClient(t, baseConfig(t, "fetcher"))
		_, err := cl.Fetch(testCtx(t, 10*time.Second), FetchSpec{ChunkSize: cs, Size: int64(len(data)), Dst: make([]byte, len(data)),
			Sources: []Source{src(sCorrupt.Addr().String())}})
		var fe *FetchError
		if !errors.As(err, &fe) || len(fe.Failed) != 2 || fe.Failed[0].Chunk != 3 || fe.Failed[1].Chunk != 17 {
			t.Fatalf("got %v, want chunks 3 and 17 failed", err)
		}
		if !errors.Is(fe.Failed[0].Attempts[0].Err, ErrChecksum) {
			t.Fatalf("attempt error %v is not a checksum error", fe.Failed[0].Attempts[0].Err)
		}
	})

	t.Run("expected CRC catches consistent but wrong data", func(t *testing.T) {
		// A peer holding another step's bytes under this key has matching
		// stored checksums; the manifest's list catches it.
		stale := newMemSource()
		staleData := bytes.Clone(data)
		staleData[5*cs+1] ^= 1
		stale.add(key1, cs, map[string][]byte{"b": staleData})
		sStale := startServer(t, baseConfig(t, "stale"), stale)
		cl := newClient(t, baseConfig(t, "fetcher"))
		got := make([]byte, len(data))
		st, err := cl.Fetch(testCtx(t, 10*time.Second), FetchSpec{ChunkSize: cs, Size: int64(len(data)), Dst: got,
			CRC: good.gens[key1].info.Buffer("b").CRC32C, Sources: []Source{src(sStale.Addr().String()), src(sGood.Addr().String())}})
		if err != nil || !bytes.Equal(got, data) || st.Failovers != 1 {
			t.Fatalf("err %v, equal %v, stats %+v", err, bytes.Equal(got, data), st)
		}
	})
}

// TestFetchPeerDies: the serving agent goes away mid-stream, by closing
// (listener and connections, as a killed process does) or by falling
// silent (a node that lost power: no FIN ever comes). The fetch finishes
// from the other copy, and quickly.
func TestFetchPeerDies(t *testing.T) {
	const cs = 64 << 10
	const n = 40
	data := pattern(n*cs, "dies")
	for _, tc := range []struct {
		name   string
		silent bool
	}{
		{"closed", false},
		{"silent", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dying, good := newMemSource(), newMemSource()
			dying.add(key1, cs, map[string][]byte{"b": data})
			good.add(key1, cs, map[string][]byte{"b": data})
			var sent atomic.Int64
			reached := make(chan struct{})
			dying.setBefore(func(_ GenKey, _ string, i int) error {
				if sent.Add(1) == 10 {
					close(reached)
				}
				time.Sleep(2 * time.Millisecond) // keep the stream going while it dies
				return nil
			})
			sDying := startServer(t, baseConfig(t, "dying"), dying)
			sGood := startServer(t, baseConfig(t, "good"), good)
			addr := sDying.Addr().String()
			var px *proxy
			if tc.silent {
				px = newProxy(t, addr)
				addr = px.addr()
			}
			go func() {
				<-reached
				if tc.silent {
					px.freeze()
				} else {
					sDying.Close()
				}
			}()
			cfg := baseConfig(t, "fetcher")
			cfg.Heartbeat, cfg.Timeout = 100*time.Millisecond, 600*time.Millisecond
			cl := newClient(t, cfg)
			got := make([]byte, len(data))
			start := time.Now()
			st, err := cl.Fetch(testCtx(t, 20*time.Second), FetchSpec{ChunkSize: cs, Size: int64(len(data)), Dst: got, Window: 2 * cs,
				Sources: []Source{{addr, ChunkKey{key1, "b"}}, {sGood.Addr().String(), ChunkKey{key1, "b"}}}})
			took := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data) {
				t.Fatal("fetched bytes differ")
			}
			if st.Failovers == 0 || st.Failovers == n {
				t.Fatalf("stats %+v: want some chunks from each peer", st)
			}
			// Closed: at once. Silent: within the liveness timeout.
			if limit := 2 * cfg.Timeout; took > limit+time.Second {
				t.Fatalf("fetch took %s; a dead peer must be noticed within %s", took, cfg.Timeout)
			}
			t.Logf("%d chunks moved to the good peer; fetch took %s", st.Failovers, took)
		})
	}

	t.Run("no other copy", func(t *testing.T) {
		dying := newMemSource()
		dying.add(key1, cs, map[string][]byte{"b": data})
		reached := make(chan struct{})
		var sent atomic.Int64
		dying.setBefore(func(GenKey, string, int) error {
			if sent.Add(1) == 5 {
				close(reached)
			}
			time.Sleep(2 * time.Millisecond)
			return nil
		})
		s := startServer(t, baseConfig(t, "dying"), dying)
		go func() { <-reached; s.Close() }()
		cl := newClient(t, baseConfig(t, "fetcher"))
		st, err := cl.Fetch(testCtx(t, 10*time.Second), FetchSpec{ChunkSize: cs, Size: int64(len(data)), Dst: make([]byte, len(data)), Window: cs,
			Sources: []Source{{s.Addr().String(), ChunkKey{key1, "b"}}}})
		var fe *FetchError
		if !errors.As(err, &fe) || len(fe.Failed)+st.Chunks != n || len(fe.Failed) == 0 {
			t.Fatalf("got %v with %+v, want some chunks failed", err, st)
		}
		var ce *ConnError
		if !errors.As(fe.Failed[0].Attempts[0].Err, &ce) {
			t.Fatalf("failure %v is not a connection error", fe.Failed[0].Attempts[0].Err)
		}
		t.Log(err)
	})
}

// proxy forwards TCP to a target until frozen; then it holds both
// connections open and forwards nothing, as a dead node's would look.
type proxy struct {
	ln     net.Listener
	target string
	frozen atomic.Bool
	budget atomic.Int64 // > 0: freeze once this many bytes went to the dialer
	mu     sync.Mutex
	conns  []net.Conn
}

func newProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	})
	go func() {
		for {
			a, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", target)
			if err != nil {
				a.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, a, b)
			p.mu.Unlock()
			go p.pipe(b, a, false)
			go p.pipe(a, b, true)
		}
	}()
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }
func (p *proxy) freeze()      { p.frozen.Store(true) }

func (p *proxy) pipe(dst, src net.Conn, toDialer bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if p.frozen.Load() {
			io.Copy(io.Discard, src) // swallow, forward nothing, close nothing
			return
		}
		if b := p.budget.Load(); b > 0 && toDialer {
			if int64(n) >= b {
				dst.Write(buf[:b])
				p.frozen.Store(true)
				io.Copy(io.Discard, src)
				return
			}
			p.budget.Add(-int64(n))
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// TestFetchWindow: with a slow consumer, the listener never runs more than
// the window ahead of what was delivered, so a Deliver fetch's memory is
// bounded by the window.
func TestFetchWindow(t *testing.T) {
	const cs = 16 << 10
	const n = 64
	src := newMemSource()
	src.add(key1, cs, map[string][]byte{"b": pattern(n*cs, "w")})
	srv := startServer(t, baseConfig(t, "n1"), src)
	cl := newClient(t, baseConfig(t, "n2"))
	for _, window := range []int64{cs, 4 * cs, 4*cs + 100} {
		t.Run(fmt.Sprint(window), func(t *testing.T) {
			before := srv.Stats().ChunksSent.Load()
			var delivered, worst int64
			_, err := cl.Fetch(testCtx(t, 10*time.Second), FetchSpec{ChunkSize: cs, Size: n * cs, Window: window,
				Sources: []Source{{srv.Addr().String(), ChunkKey{key1, "b"}}},
				Deliver: func(int, []byte) error {
					time.Sleep(time.Millisecond)
					ahead := int64(srv.Stats().ChunksSent.Load()-before) - delivered
					worst = max(worst, ahead)
					delivered++
					return nil
				}})
			if err != nil {
				t.Fatal(err)
			}
			if limit := max(window/cs, 1); worst > limit {
				t.Fatalf("the listener ran %d chunks ahead with a window of %d chunks", worst, limit)
			}
		})
	}
}

// TestFetchConcurrent: many fetches at once from several peers over
// several connections each; every byte arrives where it belongs.
func TestFetchConcurrent(t *testing.T) {
	const cs = 32 << 10
	var servers []*Server
	bufs := map[string][]byte{}
	src := newMemSource()
	for i := range 6 {
		name := fmt.Sprintf("buf%d", i)
		bufs[name] = pattern(int64(50*cs+i*777), name)
	}
	src.add(key1, cs, bufs)
	for i := range 3 {
		servers = append(servers, startServer(t, baseConfig(t, fmt.Sprint("n", i)), src))
	}
	cfg := baseConfig(t, "fetcher")
	cfg.ConnsPerPeer = 2
	cl := newClient(t, cfg)
	var wg sync.WaitGroup
	errs := make(chan error, 12)
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("buf%d", i%6)
			want := bufs[name]
			got := make([]byte, len(want))
			s := servers[i%3]
			spec := FetchSpec{ChunkSize: cs, Size: int64(len(want)), Window: 2 * cs,
				Sources: []Source{{s.Addr().String(), ChunkKey{key1, name}}}}
			if i%2 == 0 {
				spec.Dst = got
			} else {
				spec.Deliver = func(c int, d []byte) error { copy(got[int64(c)*cs:], d); return nil }
			}
			if _, err := cl.Fetch(testCtx(t, 20*time.Second), spec); err != nil {
				errs <- err
				return
			}
			if !bytes.Equal(got, want) {
				errs <- fmt.Errorf("fetch %d: bytes differ", i)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	var accepted uint64
	for _, s := range servers {
		accepted += s.Stats().Accepted.Load()
	}
	if accepted != 6 {
		t.Errorf("%d connections accepted, want 2 per peer", accepted)
	}
}

// TestFetchBusy: a listener at its stream limit answers busy, and the
// fetch retries until a stream frees up.
func TestFetchBusy(t *testing.T) {
	const cs = 16 << 10
	src := newMemSource()
	src.add(key1, cs, map[string][]byte{"b": pattern(20*cs, "busy")})
	src.setBefore(func(GenKey, string, int) error { time.Sleep(3 * time.Millisecond); return nil })
	cfg := baseConfig(t, "n1")
	cfg.MaxStreams = 1
	srv := startServer(t, cfg, src)
	cl := newClient(t, baseConfig(t, "n2"))
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got := make([]byte, 20*cs)
			if _, err := cl.Fetch(testCtx(t, 10*time.Second), FetchSpec{ChunkSize: cs, Size: 20 * cs, Dst: got,
				Sources: []Source{{srv.Addr().String(), ChunkKey{key1, "b"}}}}); err != nil {
				t.Errorf("fetch %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if srv.Stats().Busy.Load() == 0 {
		t.Error("no fetch was refused busy; the test did not exercise the retry")
	}
}

func TestFetchCancel(t *testing.T) {
	const cs = 16 << 10
	src := newMemSource()
	src.add(key1, cs, map[string][]byte{"b": pattern(200*cs, "c")})
	src.setBefore(func(GenKey, string, int) error { time.Sleep(2 * time.Millisecond); return nil })
	srv := startServer(t, baseConfig(t, "n1"), src)
	cl := newClient(t, baseConfig(t, "n2"))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := cl.Fetch(ctx, FetchSpec{ChunkSize: cs, Size: 200 * cs, Dst: make([]byte, 200*cs),
		Sources: []Source{{srv.Addr().String(), ChunkKey{key1, "b"}}}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want the context's error", err)
	}
	// The listener stops streaming and unpins; the connection stays usable.
	waitFor(t, 5*time.Second, "the stream to stop", func() bool { return src.pins.Load() == 0 })
	src.setBefore(nil)
	got := make([]byte, 200*cs)
	if _, err := cl.Fetch(testCtx(t, 5*time.Second), FetchSpec{ChunkSize: cs, Size: 200 * cs, Dst: got,
		Sources: []Source{{srv.Addr().String(), ChunkKey{key1, "b"}}}}); err != nil || !bytes.Equal(got, src.gens[key1].data["b"]) {
		t.Fatalf("fetch after a cancel: %v", err)
	}
	if a := srv.Stats().Accepted.Load(); a != 1 {
		t.Fatalf("%d connections, want the first one reused", a)
	}
}

func TestDeliverError(t *testing.T) {
	const cs = 4096
	src := newMemSource()
	src.add(key1, cs, map[string][]byte{"b": pattern(10*cs, "d")})
	srv := startServer(t, baseConfig(t, "n1"), src)
	cl := newClient(t, baseConfig(t, "n2"))
	boom := errors.New("boom")
	_, err := cl.Fetch(testCtx(t, 5*time.Second), FetchSpec{ChunkSize: cs, Size: 10 * cs,
		Sources: []Source{{srv.Addr().String(), ChunkKey{key1, "b"}}},
		Deliver: func(c int, _ []byte) error {
			if c == 4 {
				return boom
			}
			return nil
		}})
	if !errors.Is(err, boom) {
		t.Fatalf("got %v, want the Deliver error", err)
	}
}

func TestWatermarksAndManifest(t *testing.T) {
	const cs = 4096
	src := newMemSource()
	src.add(key1, cs, map[string][]byte{"a": pattern(3*cs+1, "a"), "b": pattern(5, "b")})
	k2 := GenKey{Rank: 5, Shard: "arc-r3", Step: 9, Seq: 1}
	src.add(k2, cs, map[string][]byte{"a": pattern(cs, "a2")})
	srv := startServer(t, baseConfig(t, "n1"), src)
	cl := newClient(t, baseConfig(t, "n2"))
	ctx := testCtx(t, 5*time.Second)
	for _, tc := range []struct {
		ranks []int
		want  int
	}{{nil, 2}, {[]int{3}, 1}, {[]int{5, 3}, 2}, {[]int{7}, 0}} {
		wm, err := cl.Watermarks(ctx, srv.Addr().String(), tc.ranks)
		if err != nil {
			t.Fatal(err)
		}
		if len(wm.Generations) != tc.want || wm.Node != "n1" {
			t.Fatalf("ranks %v: %+v", tc.ranks, wm)
		}
	}
	info, err := cl.Manifest(ctx, srv.Addr().String(), key1)
	if err != nil {
		t.Fatal(err)
	}
	if info.ChunkSize != cs || info.Buffer("a") == nil || len(info.Buffer("a").CRC32C) != 4 || info.Buffer("b").Size != 5 {
		t.Fatalf("manifest %+v", info)
	}
	if _, err := cl.Manifest(ctx, srv.Addr().String(), GenKey{Rank: 1, Shard: "x"}); !IsCode(err, CodeNotFound) {
		t.Fatalf("manifest of a missing generation: %v", err)
	}
}

func TestGenInfoCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		g    GenInfo
		ok   bool
	}{
		{"good", GenInfo{ChunkSize: 10, Buffers: []BufferInfo{{"a", 21, []uint32{1, 2, 3}}, {"e", 0, nil}}}, true},
		{"zero chunk size", GenInfo{ChunkSize: 0}, false},
		{"huge chunk size", GenInfo{ChunkSize: MaxPayload + 1}, false},
		{"negative size", GenInfo{ChunkSize: 10, Buffers: []BufferInfo{{"a", -1, nil}}}, false},
		{"too few checksums", GenInfo{ChunkSize: 10, Buffers: []BufferInfo{{"a", 21, []uint32{1, 2}}}}, false},
	} {
		if err := tc.g.check(); (err == nil) != tc.ok {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

func TestSplitRuns(t *testing.T) {
	for _, tc := range []struct {
		in    []int
		parts int
		want  string
	}{
		{[]int{0, 1, 2, 3}, 1, "[[0 1 2 3]]"},
		{[]int{3, 1, 2, 0}, 2, "[[0 1] [2 3]]"},
		{[]int{0, 1, 5, 6, 7}, 1, "[[0 1] [5 6 7]]"},
		{[]int{0, 1, 5, 6, 7, 8}, 3, "[[0 1] [5 6] [7 8]]"},
		{[]int{4}, 4, "[[4]]"},
	} {
		if got := fmt.Sprint(splitRuns(tc.in, tc.parts)); got != tc.want {
			t.Errorf("splitRuns(%v, %d) = %s, want %s", tc.in, tc.parts, got, tc.want)
		}
	}
}

// TestFetchAbandonMidChunk: a fetch whose context ends while a chunk is
// half-way in returns at once, and nothing lands in Dst after it returned:
// the stuck connection is cut.
func TestFetchAbandonMidChunk(t *testing.T) {
	const cs = 1 << 20
	src := newMemSource()
	src.add(key1, cs, map[string][]byte{"b": pattern(4*cs, "m")})
	srv := startServer(t, baseConfig(t, "n1"), src)
	px := newProxy(t, srv.Addr().String())
	cfg := baseConfig(t, "n2")
	cfg.Heartbeat, cfg.Timeout = time.Second, 10*time.Second // silence alone would take 10 s
	cl := newClient(t, cfg)
	// Let the handshake through, then freeze half-way into chunk 1.
	if _, err := cl.Watermarks(testCtx(t, 5*time.Second), px.addr(), nil); err != nil {
		t.Fatal(err)
	}
	px.budget.Store(cs + cs/2)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	dst := make([]byte, 4*cs)
	start := time.Now()
	_, err := cl.Fetch(ctx, FetchSpec{ChunkSize: cs, Size: 4 * cs, Dst: dst, Window: 4 * cs,
		Sources: []Source{{px.addr(), ChunkKey{key1, "b"}}}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want the context's error", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("took %s to give up", took)
	}
	snap := bytes.Clone(dst)
	time.Sleep(100 * time.Millisecond)
	if !bytes.Equal(snap, dst) {
		t.Fatal("Dst changed after Fetch returned")
	}
}
