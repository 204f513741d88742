package peer

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/reft-hpc/reft/internal/crc32c"
	"io"
	"math"
	"net"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/logging/logtest"
	"github.com/reft-hpc/reft/tmpfs"
)

// A hostile dialer: it passes the real handshake and sends fetch
// requests no correct agent sends, to a Server over a real tmpfs store.
// The listener must answer each with one error frame naming the bad
// field and a log line, keep the connection unless the frame itself was
// bad, and keep serving everyone else.

// hostileStore is a store holding rank 3's step 1 (storeBuffers): params
// has 6 chunks of storeChunk, adam.m 2, empty none.
func hostileStore(t testing.TB) (*tmpfs.Store, GenKey) {
	st := openTestStore(t, "77")
	g := commit(t, st, tmpfs.Key{Rank: 3, Shard: "state"}, 1)
	return st, GenKey{Rank: 3, Shard: "state", Step: 1, Seq: g.Seq}
}

// fetchFrame is a fetch frame of header version v and request id.
func fetchFrame(v uint8, id uint32, payload []byte) []byte {
	b, err := AppendFrame(nil, TFetch, id, 0, payload)
	if err != nil {
		panic(err)
	}
	if v != Version {
		b[4] = v
		binary.BigEndian.PutUint32(b[28:32], crc32c.Checksum(b[:28]))
	}
	return b
}

func reqJSON(r FetchRequest) []byte {
	b, _ := json.Marshal(r)
	return b
}

// served is what the listener answered a fetch with.
type served struct {
	chunks []int  // chunk frames for the request, in order, each checked
	err    *Error // its error frame, if any
	errID  uint32 // the error frame's id
}

// readServed reads the listener's answer to request id until count
// chunks came, or an error frame, returning credit for each chunk. Each
// chunk must be the stored bytes of buffer under the stored CRC.
func (r *rawConn) readServed(t *testing.T, id uint32, buffer string, count int) served {
	t.Helper()
	s, hungUp := r.readServedOrHangup(t, id, buffer, count, false)
	if hungUp {
		t.Fatal("reading the answer: the listener hung up")
	}
	return s
}

// readServedOrHangup is readServed that, with mayHangUp, reports a
// connection the listener closed before its answer arrived (EOF, reset)
// instead of failing: after a frame it cannot parse, the listener sends
// its error and closes with the frame's remaining bytes unread, and TCP
// may then reset the connection before the error frame is read.
func (r *rawConn) readServedOrHangup(t *testing.T, id uint32, buffer string, count int, mayHangUp bool) (served, bool) {
	t.Helper()
	var s served
	data := stateFor(1)[buffer]
	for len(s.chunks) < count || count <= 0 {
		f, err := Decode(r)
		if mayHangUp && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
			return s, true
		}
		if err != nil {
			t.Fatalf("reading the answer: %v", err)
		}
		switch {
		case f.Type == TPing:
			continue
		case f.Type == TChunk && f.ID == id:
			if f.Arg >= uint64(numChunks(int64(len(data)), storeChunk)) {
				t.Fatalf("chunk %d of %s, which has %d bytes", f.Arg, buffer, len(data))
			}
			i := int(f.Arg)
			lo := int64(i) * storeChunk
			want := data[lo:min(lo+storeChunk, int64(len(data)))]
			if !bytes.Equal(f.Payload, want) || f.CRC != crc32c.Checksum(want) {
				t.Fatalf("chunk %d of %s: %d bytes under CRC 0x%08x, not the stored chunk", i, buffer, len(f.Payload), f.CRC)
			}
			s.chunks = append(s.chunks, i)
			b, _ := AppendFrame(nil, TCredit, id, uint64(len(f.Payload)), nil)
			r.Write(b)
		case f.Type == TError:
			s.err = &Error{}
			if err := json.Unmarshal(f.Payload, s.err); err != nil {
				t.Fatalf("error frame %q: %v", f.Payload, err)
			}
			s.errID = f.ID
			return s, false
		default:
			t.Fatalf("unexpected %s frame id %d", f.Type, f.ID)
		}
	}
	return s, false
}

// closed reports whether the listener hung up (pings aside).
func (r *rawConn) closed(t *testing.T) bool {
	t.Helper()
	r.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		f, err := Decode(r)
		switch {
		case errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET):
			// A reset is a hang-up too: the listener closed with the
			// frame's remaining bytes unread.
			return true
		case err != nil:
			t.Fatalf("reading: %v", err)
		case f.Type != TPing:
			t.Fatalf("got %s id %d (%s), want nothing more", f.Type, f.ID, f.Payload)
		}
	}
}

// stillServes checks that the connection answers a watermarks request.
func (r *rawConn) stillServes(t *testing.T, id uint32) {
	t.Helper()
	r.send(TWatermarks, id, &WatermarksRequest{Ranks: []int{3}})
	for {
		f := r.recv()
		if f.Type == TPing {
			continue
		}
		if f.Type != TWatermarksReply || f.ID != id {
			t.Fatalf("got %s id %d (%s), want the watermarks reply %d", f.Type, f.ID, f.Payload, id)
		}
		return
	}
}

func authed(t *testing.T, addr string) *rawConn {
	t.Helper()
	r := rawDial(t, addr)
	r.handshake(secretAuth(t, testSecret, 4242), "77", 4242, nil)
	if f := r.recv(); f.Type != TAuthReply {
		t.Fatalf("handshake: %s %s", f.Type, f.Payload)
	}
	return r
}

// TestHostileDialer: bad fetch requests get one error frame that names
// the bad field, and a log line; the connection stays unless the frame
// was bad, and the listener goes on serving its other connections.
func TestHostileDialer(t *testing.T) {
	st, k := hostileStore(t)
	var logs logtest.Buffer
	logs.CheckEvents(t)
	cfg := baseConfig(t, "n1")
	cfg.Log = zerolog.New(&logs)
	srv := startServer(t, cfg, StoreSource{st})
	addr := srv.Addr().String()
	// A correct agent, connected through it all.
	cl := newClient(t, baseConfig(t, "n2"))
	ctx := testCtx(t, 30*time.Second)
	if _, err := cl.Watermarks(ctx, addr, nil); err != nil {
		t.Fatal(err)
	}

	params := int64(len(stateFor(1)["params"]))
	good := FetchRequest{ChunkKey: ChunkKey{k, "params"}, First: 0, Count: 6, ChunkSize: storeChunk, Size: params}
	with := func(f func(*FetchRequest)) []byte {
		r := good
		f(&r)
		return reqJSON(r)
	}
	other := func(f func(*GenKey)) (GenKey, []byte) {
		r := good
		f(&r.GenKey)
		return r.GenKey, reqJSON(r)
	}
	notHere := func(g GenKey, _ []byte) string {
		return fmt.Sprintf("%s is not in this node's store (released, or never here): not found", g)
	}
	body := func(_ GenKey, b []byte) []byte { return b }
	past := func(count, first int) string {
		return fmt.Sprintf("%s: %d chunks from chunk %d run past the buffer's 6 chunks", good.ChunkKey, count, first)
	}
	k99, b99 := other(func(g *GenKey) { g.Rank = 99 })
	kNeg, bNeg := other(func(g *GenKey) { g.Rank = -1 })
	kShard, bShard := other(func(g *GenKey) { g.Shard = "../state" })
	kStep, bStep := other(func(g *GenKey) { g.Step = 2 })
	kSeq, bSeq := other(func(g *GenKey) { g.Seq++ })

	for _, tc := range []struct {
		name   string
		frame  []byte
		id     uint32
		buffer string
		chunks []int  // served; nil: refused
		code   string // the refusal's code
		msg    string // and its message, exactly
		closed bool   // the listener hangs up
	}{
		{name: "whole buffer", frame: fetchFrame(1, 1, reqJSON(good)), id: 1, buffer: "params", chunks: span(0, 6)},
		{name: "last chunk, unchecked sizes, one-byte window", id: 2, buffer: "params", chunks: []int{5},
			frame: fetchFrame(1, 2, with(func(r *FetchRequest) { r.First, r.Count, r.ChunkSize, r.Size, r.Window = 5, 1, 0, 0, 1 }))},
		{name: "first negative", id: 1, code: CodeInvalid, msg: "fetch: first chunk -1 is negative",
			frame: fetchFrame(1, 1, with(func(r *FetchRequest) { r.First = -1 }))},
		{name: "first the smallest int", id: 1, code: CodeInvalid, msg: "fetch: first chunk -9223372036854775808 is negative",
			frame: fetchFrame(1, 1, with(func(r *FetchRequest) { r.First = math.MinInt64 }))},
		{name: "count zero", id: 1, code: CodeInvalid, msg: "fetch: count 0; a fetch asks for at least one chunk",
			frame: fetchFrame(1, 1, with(func(r *FetchRequest) { r.Count = 0 }))},
		{name: "count negative", id: 1, code: CodeInvalid, msg: "fetch: count -5; a fetch asks for at least one chunk",
			frame: fetchFrame(1, 1, with(func(r *FetchRequest) { r.Count = -5 }))},
		{name: "empty payload", id: 1, code: CodeInvalid, msg: "fetch: count 0; a fetch asks for at least one chunk",
			frame: fetchFrame(1, 1, nil)},
		{name: "first past the end", id: 1, code: CodeInvalid, msg: past(1, 6),
			frame: fetchFrame(1, 1, with(func(r *FetchRequest) { r.First, r.Count = 6, 1 }))},
		{name: "count past the end", id: 1, code: CodeInvalid, msg: past(7, 0),
			frame: fetchFrame(1, 1, with(func(r *FetchRequest) { r.Count = 7 }))},
		{name: "huge count", id: 1, code: CodeInvalid, msg: past(math.MaxInt64, 1),
			frame: fetchFrame(1, 1, with(func(r *FetchRequest) { r.First, r.Count = 1, math.MaxInt64 }))},
		{name: "first+count overflows", id: 1, code: CodeInvalid, msg: past(math.MaxInt64, math.MaxInt64),
			frame: fetchFrame(1, 1, with(func(r *FetchRequest) { r.First, r.Count = math.MaxInt64, math.MaxInt64 }))},
		{name: "first 2^32 (inside if truncated)", id: 1, code: CodeInvalid, msg: past(1, 1<<32),
			frame: fetchFrame(1, 1, with(func(r *FetchRequest) { r.First, r.Count = 1<<32, 1 }))},
		{name: "number beyond int64", id: 1, code: CodeMalformed,
			msg:   "fetch payload: json: cannot unmarshal number 1e30 into Go struct field FetchRequest.first of type int",
			frame: fetchFrame(1, 1, []byte(`{"rank":3,"shard":"state","buffer":"params","first":1e30,"count":1}`))},
		{name: "first as a string", id: 1, code: CodeMalformed,
			msg:   "fetch payload: json: cannot unmarshal string into Go struct field FetchRequest.first of type int",
			frame: fetchFrame(1, 1, []byte(`{"first":"0","count":1}`))},
		{name: "not JSON", id: 1, code: CodeMalformed, msg: "fetch payload: unexpected end of JSON input",
			frame: fetchFrame(1, 1, []byte(`{`))},
		{name: "bytes after the object", id: 1, code: CodeMalformed, msg: "fetch payload: invalid character 'x' after top-level value",
			frame: fetchFrame(1, 1, append(reqJSON(good), 'x'))},
		{name: "chunk_size negative", id: 1, code: CodeInvalid, msg: "fetch: chunk_size -1 outside [0, 67108864] (0: not checked)",
			frame: fetchFrame(1, 1, with(func(r *FetchRequest) { r.ChunkSize = -1 }))},
		{name: "chunk_size over the payload limit", id: 1, code: CodeInvalid, msg: "fetch: chunk_size 1099511627776 outside [0, 67108864] (0: not checked)",
			frame: fetchFrame(1, 1, with(func(r *FetchRequest) { r.ChunkSize = 1 << 40 }))},
		{name: "size negative", id: 1, code: CodeInvalid, msg: "fetch: size -1 is negative (0: not checked)",
			frame: fetchFrame(1, 1, with(func(r *FetchRequest) { r.Size = -1 }))},
		{name: "window negative", id: 1, code: CodeInvalid, msg: "fetch: window -9223372036854775808 is negative (0: the listener's default)",
			frame: fetchFrame(1, 1, with(func(r *FetchRequest) { r.Window = math.MinInt64 }))},
		{name: "unknown rank", id: 1, code: CodeNotFound, msg: notHere(k99, b99), frame: fetchFrame(1, 1, body(k99, b99))},
		{name: "negative rank", id: 1, code: CodeNotFound, msg: notHere(kNeg, bNeg), frame: fetchFrame(1, 1, body(kNeg, bNeg))},
		{name: "unknown shard (a path)", id: 1, code: CodeNotFound, msg: notHere(kShard, bShard), frame: fetchFrame(1, 1, body(kShard, bShard))},
		{name: "unknown step", id: 1, code: CodeNotFound, msg: notHere(kStep, bStep), frame: fetchFrame(1, 1, body(kStep, bStep))},
		{name: "unknown seq", id: 1, code: CodeNotFound, msg: notHere(kSeq, bSeq), frame: fetchFrame(1, 1, body(kSeq, bSeq))},
		{name: "unknown buffer", id: 1, code: CodeNotFound, msg: fmt.Sprintf("%s has no buffer %q", k, "nope"),
			frame: fetchFrame(1, 1, with(func(r *FetchRequest) { r.Buffer = "nope" }))},
		{name: "a chunk of an empty buffer", id: 1, code: CodeInvalid,
			msg:   fmt.Sprintf("%s: 1 chunks from chunk 0 run past the buffer's 0 chunks", ChunkKey{k, "empty"}),
			frame: fetchFrame(1, 1, with(func(r *FetchRequest) { r.Buffer, r.Count, r.Size, r.ChunkSize = "empty", 1, 0, 0 }))},
		{name: "other chunk size", id: 1, code: CodeMismatch,
			msg:   fmt.Sprintf("%s: chunk size here is 65536, the request expects 4096", good.ChunkKey),
			frame: fetchFrame(1, 1, with(func(r *FetchRequest) { r.ChunkSize = 4096 }))},
		{name: "other buffer size", id: 1, code: CodeMismatch,
			msg:   fmt.Sprintf("%s: buffer size here is %d, the request expects 1", good.ChunkKey, params),
			frame: fetchFrame(1, 1, with(func(r *FetchRequest) { r.Size = 1 }))},
		{name: "request id 0", id: 0, code: CodeInvalid, msg: "fetch request with id 0 (0 is the connection's)",
			frame: fetchFrame(1, 0, reqJSON(good))},
		{name: "header version 2", id: 0, code: CodeVersion, msg: "unsupported peer protocol version 2 (this agent speaks 1)", closed: true,
			frame: fetchFrame(2, 1, reqJSON(good))},
		{name: "header version 0", id: 0, code: CodeVersion, msg: "unsupported peer protocol version 0 (this agent speaks 1)", closed: true,
			frame: fetchFrame(0, 1, reqJSON(good))},
		{name: "payload checksum", id: 1, code: CodeMalformed, closed: true,
			msg: fmt.Sprintf("payload checksum mismatch: fetch frame id 1: recorded 0x%08x, computed 0x%08x", crc32c.Checksum(reqJSON(good)), crc32c.Checksum(append([]byte{'['}, reqJSON(good)[1:]...))),
			frame: func() []byte {
				b := fetchFrame(1, 1, reqJSON(good))
				b[HeaderSize] = '['
				return b
			}()},
		{name: "reserved flags", id: 0, code: CodeMalformed, msg: "reserved flags are not zero: 0x0100", closed: true,
			frame: func() []byte {
				b := fetchFrame(1, 1, reqJSON(good))
				b[6] = 1
				binary.BigEndian.PutUint32(b[28:32], crc32c.Checksum(b[:28]))
				return b
			}()},
		{name: "a chunk frame sent to the listener", id: 4, code: CodeUnknownType, msg: "a listener does not take chunk frames",
			frame: func() []byte { b, _ := AppendFrame(nil, TChunk, 4, 0, []byte("abc")); return b }()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := authed(t, addr)
			before := len(logs.Events("peer_request_refused"))
			r.Write(tc.frame)
			s := r.readServed(t, tc.id, tc.buffer, len(tc.chunks))
			if tc.chunks != nil {
				if s.err != nil || !slices.Equal(s.chunks, tc.chunks) {
					t.Fatalf("served chunks %v and error %v, want chunks %v", s.chunks, s.err, tc.chunks)
				}
			} else {
				if s.err == nil || s.errID != tc.id || s.err.Code != tc.code || s.err.Message != tc.msg || len(s.chunks) != 0 {
					t.Fatalf("answered %v (id %d) after chunks %v, want error %s %q for id %d", s.err, s.errID, s.chunks, tc.code, tc.msg, tc.id)
				}
				ev := logs.Events("peer_request_refused")
				if len(ev) != before+1 {
					t.Fatalf("%d refusals logged, want 1", len(ev)-before)
				}
				if e := ev[len(ev)-1]; e["code"] != tc.code || e["message"] != tc.msg || e["id"] != float64(tc.id) || e["remote"] == nil {
					t.Fatalf("logged %v", e)
				}
			}
			if tc.closed {
				if !r.closed(t) {
					t.Fatal("the listener kept the connection")
				}
			} else {
				r.stillServes(t, 100)
			}
		})
	}
	// The correct agent's connection, open all along, still fetches.
	dst := make([]byte, params)
	if _, err := cl.Fetch(ctx, FetchSpec{ChunkSize: storeChunk, Size: params, Dst: dst, Sources: []Source{{addr, good.ChunkKey}}}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst, stateFor(1)["params"]) {
		t.Fatal("fetched bytes differ")
	}
}

// TestHostileDialerStreams: a request id that is streaming already is
// refused without disturbing the stream; credit and cancel for streams
// that do not exist are ignored.
func TestHostileDialerStreams(t *testing.T) {
	st, k := hostileStore(t)
	srv := startServer(t, baseConfig(t, "n1"), StoreSource{st})
	r := authed(t, srv.Addr().String())
	req := FetchRequest{ChunkKey: ChunkKey{k, "params"}, Count: 6, Window: 1}
	credit, _ := AppendFrame(nil, TCredit, 9, math.MaxUint64, nil)
	cancel, _ := AppendFrame(nil, TCancel, 10, 0, nil)
	r.Write(slices.Concat(credit, cancel, fetchFrame(1, 1, reqJSON(req)), fetchFrame(1, 1, reqJSON(req))))
	// Window 1: chunk 0 goes, then the stream waits for credit; the
	// duplicate is refused meanwhile.
	var chunk0, refused bool
	for !chunk0 || !refused {
		f := r.recv()
		switch {
		case f.Type == TPing:
		case f.Type == TChunk && f.ID == 1 && f.Arg == 0 && !chunk0:
			chunk0 = true
		case f.Type == TError && f.ID == 1 && !refused:
			var e Error
			json.Unmarshal(f.Payload, &e)
			if e.Code != CodeInvalid || e.Message != "request id 1 is already streaming" {
				t.Fatalf("refused with %v", e)
			}
			refused = true
		default:
			t.Fatalf("got %s id %d arg %d", f.Type, f.ID, f.Arg)
		}
	}
	b, _ := AppendFrame(nil, TCredit, 1, 1<<40, nil)
	r.Write(b)
	s := r.readServed(t, 1, "params", 5)
	if !slices.Equal(s.chunks, span(1, 6)) {
		t.Fatalf("the stream went on with %v", s.chunks)
	}
	r.stillServes(t, 2)
}

// TestHostileDialerFlood: a dialer that sends requests without reading
// the replies gets busy beyond maxCalls in progress, so the listener's
// goroutines stay bounded; the slots come back as replies go out.
func TestHostileDialerFlood(t *testing.T) {
	var logs logtest.Buffer
	logs.CheckEvents(t)
	cfg := baseConfig(t, "n1")
	cfg.Log = zerolog.New(&logs)
	srv := startServer(t, cfg, newMemSource())
	release := make(chan struct{})
	var running atomic.Int64
	srv.Handle(TBeat, func(ctx context.Context, from string, p []byte) (any, error) {
		running.Add(1)
		defer running.Add(-1)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return map[string]string{"node": "n1"}, nil
	})
	r := authed(t, srv.Addr().String())
	var flood []byte
	for id := uint32(1); id <= maxCalls+5; id++ {
		b, _ := AppendFrame(nil, TBeat, id, 0, []byte(`{"node":"x"}`))
		flood = append(flood, b...)
	}
	r.Write(flood)
	for id := uint32(maxCalls + 1); id <= maxCalls+5; id++ {
		f := r.recv()
		for f.Type == TPing {
			f = r.recv()
		}
		var e Error
		json.Unmarshal(f.Payload, &e)
		if f.Type != TError || f.ID != id || e.Code != CodeBusy ||
			e.Message != "64 requests of this connection are in progress; read their replies before sending more" {
			t.Fatalf("request %d: %s id %d %s, want busy", id, f.Type, f.ID, f.Payload)
		}
	}
	waitFor(t, 10*time.Second, "64 handlers running", func() bool { return running.Load() == maxCalls })
	if ev := logs.Events("peer_request_refused"); len(ev) != 5 || ev[0]["code"] != CodeBusy {
		t.Fatalf("logged %v, want 5 busy refusals", ev)
	}
	close(release)
	replies := 0
	for replies < maxCalls {
		if f := r.recv(); f.Type == TBeatReply {
			replies++
		}
	}
	r.stillServes(t, 1000)
}

// TestRefusalLogCap: a connection logs its first maxRefusalLogs
// refusals, then says once that it stops; every one is still answered.
func TestRefusalLogCap(t *testing.T) {
	var logs logtest.Buffer
	logs.CheckEvents(t)
	cfg := baseConfig(t, "n1")
	cfg.Log = zerolog.New(&logs)
	srv := startServer(t, cfg, newMemSource())
	r := authed(t, srv.Addr().String())
	const n = maxRefusalLogs + 10
	for id := uint32(1); id <= n; id++ {
		r.Write(fetchFrame(1, id, nil))
	}
	for got := 0; got < n; {
		if f := r.recv(); f.Type == TError {
			got++
		}
	}
	if ev := logs.Events("peer_request_refused"); len(ev) != maxRefusalLogs {
		t.Fatalf("%d refusals logged, want %d", len(ev), maxRefusalLogs)
	}
	if ev := logs.Events("peer_refusals_unlogged"); len(ev) != 1 {
		t.Fatalf("%d notes that refusals go unlogged, want 1", len(ev))
	}
}

// refusalCounter counts peer_request_refused log lines.
type refusalCounter struct{ n atomic.Int64 }

func (w *refusalCounter) Write(p []byte) (int, error) {
	w.n.Add(int64(bytes.Count(p, []byte(`"event":"peer_request_refused"`))))
	return len(p), nil
}

// FuzzHostileDialer sends one fetch frame built from the fuzzer's fields
// (or raw JSON) to a real listener over a real store. Oracle: the
// listener streams exactly [first, first+count) of the stored bytes when
// the request is valid, and otherwise answers one error frame with the
// code the first failed check gives, logs it, and keeps the connection
// unless the frame was bad; a correct agent's connection keeps working.
func FuzzHostileDialer(f *testing.F) {
	st, k := hostileStore(f)
	var logs refusalCounter
	cfg := baseConfig(f, "n1")
	cfg.Log = zerolog.New(&logs)
	srv := startServer(f, cfg, StoreSource{st})
	addr := srv.Addr().String()
	ccfg := baseConfig(f, "n2")
	ccfg.Log = zerolog.Nop()
	cl := newClient(f, ccfg)
	sizes := map[string]int64{}
	for _, b := range storeBuffers {
		sizes[b.Name] = b.Size
	}
	params := sizes["params"]
	type seed struct {
		version             uint8
		id                  uint32
		first, count        int
		chunkSize, size, wn int64
		buffer              string
		raw                 string
	}
	for _, s := range []seed{
		{1, 1, 0, 6, storeChunk, params, 0, "params", ""},
		{1, 7, 5, 1, 0, 0, 1, "params", ""},
		{1, 1, 1, 1, 0, 0, 0, "adam.m", ""},
		{1, 1, -1, 1, 0, 0, 0, "params", ""},
		{1, 1, 6, 1, 0, 0, 0, "params", ""},
		{1, 1, 0, 7, 0, 0, 0, "params", ""},
		{1, 1, 1, math.MaxInt64, 0, 0, 0, "params", ""},
		{1, 1, math.MaxInt64, math.MaxInt64, 0, 0, 0, "params", ""},
		{1, 1, 1 << 32, 1, 0, 0, 0, "params", ""},
		{1, 1, 0, 0, 0, 0, 0, "params", ""},
		{1, 1, 0, 1, -1, 0, 0, "params", ""},
		{1, 1, 0, 1, 0, -1, 0, "params", ""},
		{1, 1, 0, 1, 0, 0, -1, "params", ""},
		{1, 1, 0, 1, 4096, 0, 0, "params", ""},
		{1, 1, 0, 1, 0, 1, 0, "params", ""},
		{1, 1, 0, 1, 0, 0, 0, "nope", ""},
		{1, 1, 0, 1, 0, 0, 0, "empty", ""},
		{1, 0, 0, 1, 0, 0, 0, "params", ""},
		{2, 1, 0, 1, 0, 0, 0, "params", ""},
		{1, 1, 0, 0, 0, 0, 0, "", `{"first":1e30,"count":1}`},
		{1, 1, 0, 0, 0, 0, 0, "", `{`},
	} {
		f.Add(s.version, s.id, k.Rank, k.Shard, k.Step, k.Seq, s.buffer, s.first, s.count, s.chunkSize, s.size, s.wn, false, []byte(s.raw))
	}
	f.Add(uint8(1), uint32(1), 99, k.Shard, k.Step, k.Seq, "params", 0, 1, int64(0), int64(0), int64(0), true, []byte(nil))
	f.Add(uint8(1), uint32(1), k.Rank, "../x", k.Step, k.Seq, "params", 0, 1, int64(0), int64(0), int64(0), false, []byte(nil))
	f.Add(uint8(1), uint32(1), k.Rank, k.Shard, k.Step, k.Seq+1, "params", 0, 1, int64(0), int64(0), int64(0), false, []byte(nil))

	// One authenticated connection serves input after input (one each
	// would run the machine out of ephemeral ports); it is replaced when
	// the listener hangs up, or has stopped logging this connection's
	// refusals. Replaced, it is reset, leaving no TIME_WAIT behind.
	var live net.Conn
	var refused int
	drop := func() {
		if live != nil {
			live.(*net.TCPConn).SetLinger(0)
			live.Close()
			live = nil
		}
	}
	f.Cleanup(drop)
	dial := func(t *testing.T) *rawConn {
		if live != nil && refused < maxRefusalLogs {
			live.SetDeadline(time.Now().Add(10 * time.Second))
			return &rawConn{t, live}
		}
		drop()
		nc, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		nc.SetDeadline(time.Now().Add(10 * time.Second))
		live, refused = nc, 0
		r := &rawConn{t, nc}
		r.handshake(secretAuth(t, testSecret, 4242), "77", 4242, nil)
		if f := r.recv(); f.Type != TAuthReply {
			t.Fatalf("handshake: %s %s", f.Type, f.Payload)
		}
		return r
	}
	f.Fuzz(func(t *testing.T, version uint8, id uint32, rank int, shard string, step int64, seq uint64, buffer string,
		first, count int, chunkSize, size, window int64, background bool, raw []byte) {
		payload := raw
		if len(raw) == 0 {
			payload = reqJSON(FetchRequest{ChunkKey: ChunkKey{GenKey{rank, shard, step, seq}, buffer}, First: first, Count: count,
				ChunkSize: chunkSize, Size: size, Window: window, Background: background})
		}
		if len(payload) > MaxControl {
			t.Skip("payload over the control limit")
		}
		// The oracle: the listener's checks, in its order.
		var req FetchRequest
		code := ""
		switch {
		case version != Version:
			code = CodeVersion
		case id == 0:
			code = CodeInvalid
		case len(payload) > 0 && json.Unmarshal(payload, &req) != nil:
			code = CodeMalformed
		case req.First < 0 || req.Count < 1 || req.ChunkSize < 0 || req.ChunkSize > MaxPayload || req.Size < 0 || req.Window < 0:
			code = CodeInvalid
		case req.GenKey != k || sizes[req.Buffer] == 0 && req.Buffer != "empty":
			code = CodeNotFound
		case req.ChunkSize != 0 && req.ChunkSize != storeChunk || req.Size != 0 && req.Size != sizes[req.Buffer]:
			code = CodeMismatch
		case req.First > int(numChunks(sizes[req.Buffer], storeChunk))-req.Count:
			code = CodeInvalid
		}
		r := dial(t)
		before := logs.n.Load()
		r.Write(fetchFrame(version, id, payload))
		n := 0
		if code == "" {
			n = req.Count
		}
		s, hungUp := r.readServedOrHangup(t, id, req.Buffer, n, code == CodeVersion)
		if hungUp {
			// A frame of another version: closed, its refusal possibly
			// lost with the connection (readServedOrHangup), and its log
			// line possibly not written yet; the listener must still
			// serve a correct agent (below).
			if n := logs.n.Load() - before; n > 1 {
				t.Fatalf("%d refusals logged, want at most 1", n)
			}
		} else if code == "" {
			if s.err != nil || !slices.Equal(s.chunks, span(req.First, req.First+req.Count)) {
				t.Fatalf("valid request %+v: chunks %v, error %v", req, s.chunks, s.err)
			}
		} else {
			if s.err == nil || s.err.Code != code || s.err.Message == "" || len(s.chunks) != 0 {
				t.Fatalf("request %+v (version %d, id %d): chunks %v, error %v; want code %s", req, version, id, s.chunks, s.err, code)
			}
			if logs.n.Load() != before+1 {
				t.Fatalf("%d refusals logged, want 1", logs.n.Load()-before)
			}
			refused++
		}
		if code == CodeVersion { // the frame itself is bad
			if !hungUp && !r.closed(t) {
				t.Fatal("the listener kept the connection after a frame of another version")
			}
			drop()
		} else {
			r.stillServes(t, max(id+1, 1))
		}
		// The next input may reuse this id: let the stream end first.
		waitFor(t, 5*time.Second, "the listener's streams to end", func() bool { return len(srv.streams) == 0 })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := cl.Watermarks(ctx, addr, []int{3}); err != nil {
			t.Fatalf("a correct agent's connection: %v", err)
		}
	})
}
