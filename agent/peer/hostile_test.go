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
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// A hostile listener (issue #6, "a receiver never trusts a length or an
// offset without checking it"): hostilePeer passes the real handshake
// with the job's secret, then answers the first fetch of the first
// connection with a script instead of the store. Later requests and
// connections are served by the real Server code over the same data, so
// the dialer's retries behave as against a real agent.
//
// A script is a list of 8-byte records, so that a fuzzer's mutations stay
// meaningful: record[0] % numOps is the op, the rest its operands.
const (
	opChunk byte = iota // [idx, id, length, crc, corrupt, header]: one chunk frame
	opError             // [id, code, chunk, payload]: an error frame
	opPing              // [length]: a ping with a payload
	opReply             // [id, type, payload]: a control reply nobody asked for
	opType              // [type, id, length]: a frame of any type
	opRaw               // [n] and n bytes after the record, written as they are
	opRest              // the request's chunks not sent yet, correct, in order
	opServe             // the connection is served honestly from here on
	numOps

	recSize = 8
)

// Operand values. An index operand below idxSpecial is first+v-2 (rel).
const (
	idReq   = iota // the request's id
	idZero         // the connection's
	idNever        // an id the dialer never used
	idMax          // 0xffffffff
)

const (
	lenExact     = iota // the chunk's length
	lenShort            // one byte less
	lenLong             // one byte more
	lenZero             // empty
	lenFull             // the chunk size (wrong for the last chunk only)
	lenHuge             // a header claiming MaxPayload+1 bytes
	lenTruncated        // the right length in the header, half the bytes, then FIN
	numLens
)

const (
	crcSent  = iota // the CRC of the bytes sent
	crcTrue         // the true chunk's (wrong if the bytes were changed)
	crcWrong        // the CRC of the bytes sent, off by one bit
)

const (
	hdrOK      = iota
	hdrCRC     // a bit flipped after the header CRC was computed
	hdrVersion // version 2, resealed
	hdrFlags   // a reserved flag, resealed
	hdrMagic   // not "RFTP", resealed
	numHdrs
)

const (
	idxSpecial = 0xF0
	idxMaxU64  = 0xF0 // 2^64-1
	idxTop     = 0xF1 // 2^63
	idxHigh    = 0xF2 // first + 2^32: lands inside if truncated to 32 bits
)

// rel encodes chunk first+i as an index operand.
func rel(i int) byte { return byte(i + 2) }

var hostileCodes = []string{CodeNotFound, CodeCorrupt, CodeMismatch, CodeBusy, CodeInternal, CodeInvalid, CodeCancelled, "bogus"}

var hostileReplies = []Type{TWatermarksReply, TManifestReply, TStatusReply, TReplicateReply, TBeatReply}

type script []byte

func (s script) op(op byte, args ...byte) script {
	r := make([]byte, recSize)
	r[0] = op
	copy(r[1:], args)
	return append(s, r...)
}

type co struct{ id, length, crc, corrupt, header byte }

func (s script) chunk(idx byte, o co) script {
	return s.op(opChunk, idx, o.id, o.length, o.crc, o.corrupt, o.header)
}
func (s script) errFrame(id, code, chunk, payload byte) script {
	return s.op(opError, id, code, chunk, payload)
}
func (s script) raw(b []byte) script { return append(s.op(opRaw, byte(len(b))), b...) }
func (s script) rest() script        { return s.op(opRest) }
func (s script) serve() script       { return s.op(opServe) }

func code(c string) byte { return byte(slices.Index(hostileCodes, c)) }

// The hostile tests' buffer: ten chunks, the last of 300 bytes.
const hcs = 1024

var (
	hostileData = pattern(9*hcs+300, "hostile")
	hostileKey  = ChunkKey{key1, "b"}
	hostileN    = int(numChunks(int64(len(hostileData)), hcs))
)

func hostileChunk(i uint64) []byte {
	if i >= uint64(hostileN) {
		return nil
	}
	lo := int64(i) * hcs
	return hostileData[lo:min(lo+hcs, int64(len(hostileData)))]
}

func hostileCRCs() []uint32 {
	out := make([]uint32, hostileN)
	for i := range out {
		out[i] = crc32c.Checksum(hostileChunk(uint64(i)))
	}
	return out
}

// scriptRun plays a script on the connection of request id.
type scriptRun struct {
	c    *conn
	id   uint32
	req  FetchRequest
	sent map[uint64]bool
	eof  bool // the script cut a frame short: FIN now
	// wrote: the script answered (a frame, bytes); until then, opServe
	// leaves the request to the real server.
	wrote bool
}

func (r *scriptRun) write(b []byte) error {
	r.wrote = true
	r.c.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err := r.c.nc.Write(b)
	return err
}

func (r *scriptRun) frame(t Type, id uint32, arg uint64, crc uint32, p []byte) error {
	var hb [HeaderSize]byte
	Header{Version: Version, Type: t, ID: id, Length: uint32(len(p)), Arg: arg, CRC: crc}.Put(hb[:])
	return r.write(append(hb[:], p...))
}

func (r *scriptRun) pickID(v byte) uint32 {
	switch v % 4 {
	case idZero:
		return 0
	case idNever:
		return r.id + 1
	case idMax:
		return math.MaxUint32
	}
	return r.id
}

func (r *scriptRun) pickIdx(v byte) uint64 {
	first := uint64(r.req.First)
	switch {
	case v < idxSpecial:
		return first + uint64(v) - 2 // below 0 wraps to near 2^64: as hostile
	case v == idxMaxU64:
		return math.MaxUint64
	case v == idxTop:
		return 1 << 63
	case v == idxHigh:
		return first + 1<<32
	}
	return first + uint64(r.req.Count)
}

// exec plays sc; serve says the connection is to be served honestly after.
func (r *scriptRun) exec(sc []byte) (serve bool) {
	for len(sc) > 0 && !r.eof {
		var a [recSize]byte
		n := copy(a[:], sc)
		sc = sc[n:]
		var err error
		switch a[0] % numOps {
		case opChunk:
			err = r.chunk(a)
		case opError:
			e := Error{Code: hostileCodes[int(a[2])%len(hostileCodes)], Message: "hostile"}
			if a[3] != 0 {
				c := int(r.pickIdx(a[3]))
				e.Chunk = &c
			}
			p, _ := json.Marshal(e)
			switch a[4] % 3 {
			case 1:
				p = []byte("{")
			case 2:
				p = nil
			}
			err = r.frame(TError, r.pickID(a[1]), 0, crc32c.Checksum(p), p)
		case opPing:
			p := bytes.Repeat([]byte{'p'}, int(a[1]))
			err = r.frame(TPing, 0, 0, crc32c.Checksum(p), p)
		case opReply:
			p := []byte("{}")
			switch a[3] % 3 {
			case 1:
				p = []byte("{")
			case 2:
				p = bytes.Repeat([]byte{' '}, MaxControl)
			}
			err = r.frame(hostileReplies[int(a[2])%len(hostileReplies)], r.pickID(a[1]), 0, crc32c.Checksum(p), p)
		case opType:
			p := bytes.Repeat([]byte{'t'}, int(a[3]))
			err = r.frame(Type(a[1]), r.pickID(a[2]), 0, crc32c.Checksum(p), p)
		case opRaw:
			k := min(int(a[1]), len(sc))
			err = r.write(sc[:k])
			sc = sc[k:]
		case opRest:
			for i := uint64(r.req.First); i < uint64(r.req.First+r.req.Count) && err == nil; i++ {
				if !r.sent[i] {
					d := hostileChunk(i)
					err = r.frame(TChunk, r.id, i, crc32c.Checksum(d), d)
					r.sent[i] = true
				}
			}
		case opServe:
			return true
		}
		if err != nil { // the dialer hung up
			return false
		}
	}
	return false
}

func (r *scriptRun) chunk(a [recSize]byte) error {
	idx := r.pickIdx(a[1])
	id := r.pickID(a[2])
	data := hostileChunk(idx)
	p := slices.Clone(data)
	if data == nil {
		p = bytes.Repeat([]byte{0xee}, hcs)
	}
	lenMode := a[3] % numLens
	switch lenMode {
	case lenShort:
		p = p[:max(len(p)-1, 0)]
	case lenLong:
		p = append(p, 0xee)
	case lenZero:
		p = nil
	case lenFull:
		p = append(p, bytes.Repeat([]byte{0xee}, hcs-len(p))...)
	}
	if a[5] != 0 && len(p) > 0 {
		p[(int(a[5])-1)%len(p)] ^= 0x40
	}
	var crc uint32
	switch a[4] % 3 {
	case crcSent:
		crc = crc32c.Checksum(p)
	case crcTrue:
		crc = crc32c.Checksum(data)
	case crcWrong:
		crc = crc32c.Checksum(p) ^ 1
	}
	length := uint32(len(p))
	if lenMode == lenHuge {
		length, p = MaxPayload+1, nil
	}
	var hb [HeaderSize]byte
	Header{Version: Version, Type: TChunk, ID: id, Length: length, Arg: idx, CRC: crc}.Put(hb[:])
	reseal := func() { binary.BigEndian.PutUint32(hb[28:32], crc32c.Checksum(hb[:28])) }
	switch a[6] % numHdrs {
	case hdrCRC:
		hb[9] ^= 1
	case hdrVersion:
		hb[4] = 2
		reseal()
	case hdrFlags:
		hb[7] = 1
		reseal()
	case hdrMagic:
		hb[0] = 'X'
		reseal()
	}
	if lenMode == lenTruncated {
		p = p[:len(p)/2]
		r.eof = true
	}
	if id == r.id && a[6]%numHdrs == hdrOK && idx < uint64(hostileN) {
		r.sent[idx] = true
	}
	return r.write(append(hb[:], p...))
}

// hostilePeer is the listener; srv is the real server behind it. One
// peer plays many rounds (a fuzzer's inputs), each with its own script.
type hostilePeer struct {
	srv   *Server
	round atomic.Pointer[hostileRound]
}

// hostileRound is one script's play: the first connection after it
// starts is the scripted one.
type hostileRound struct {
	script     []byte
	scripted   atomic.Bool
	mu         sync.Mutex
	complaints []Error       // error frames the dialer sent on the scripted connection
	complained chan struct{} // closed at the first
}

func newHostilePeer(t testing.TB, cfg Config) *hostilePeer {
	t.Helper()
	src := newMemSource()
	src.add(key1, hcs, map[string][]byte{"b": hostileData})
	cfg, err := cfg.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	h := &hostilePeer{srv: newServer(cfg, src, ln)}
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			// Closing first, this side must leave no TIME_WAIT behind.
			nc.(*net.TCPConn).SetLinger(0)
			serve := h.srv.serve
			if rd := h.round.Load(); rd != nil && rd.scripted.CompareAndSwap(false, true) {
				serve = func(c *conn) { rd.run(h.srv, c) }
			}
			if !h.srv.track(nc, serve) {
				return
			}
		}
	}()
	t.Cleanup(func() { h.srv.Close() })
	return h
}

func (h *hostilePeer) addr() string { return h.srv.Addr().String() }

// play starts a round with script sc.
func (h *hostilePeer) play(sc []byte) *hostileRound {
	rd := &hostileRound{script: sc, complained: make(chan struct{})}
	h.round.Store(rd)
	return rd
}

// hangUp ends every connection, this side first: FIN, then the dialer's
// FIN in answer, so no TIME_WAIT is left on the dialer's ephemeral ports
// (a fuzzer makes thousands of connections).
func (h *hostilePeer) hangUp(t testing.TB) {
	t.Helper()
	open := func() int {
		h.srv.mu.Lock()
		defer h.srv.mu.Unlock()
		for c := range h.srv.conns {
			c.nc.(*net.TCPConn).CloseWrite()
		}
		return len(h.srv.conns)
	}
	waitFor(t, 10*time.Second, "the dialer to hang up", func() bool { return open() == 0 })
}

func (rd *hostileRound) run(srv *Server, c *conn) {
	node, role, err := acceptHandshake(&srv.cfg, c, srv.shakes)
	if err != nil {
		c.close(err)
		return
	}
	// The first fetch, peeked: the real server takes it if the script
	// hands over before answering it.
	var h0 Header
	var size int
	for {
		hb, err := c.br.Peek(HeaderSize)
		if err == nil {
			h0, err = ParseHeader(hb)
		}
		if err != nil {
			c.close(err)
			return
		}
		if h0.Type == TFetch {
			size = HeaderSize + int(h0.Length)
			break
		}
		if _, err := c.readFrame(); err != nil {
			c.close(err)
			return
		}
	}
	b, err := c.br.Peek(size)
	if err != nil {
		c.close(err)
		return
	}
	r := &scriptRun{c: c, id: h0.ID, sent: map[uint64]bool{}}
	if err := json.Unmarshal(b[HeaderSize:], &r.req); err != nil {
		c.close(err)
		return
	}
	if r.exec(rd.script) {
		if r.wrote {
			c.br.Discard(size)
		}
		srv.serveConn(c, node, role)
		return
	}
	// FIN: the dialer reads what was sent, then EOF; what it says about
	// it arrives before its own FIN.
	c.nc.(*net.TCPConn).CloseWrite()
	for {
		f, err := c.readFrame()
		if err != nil {
			break
		}
		if f.Type == TError {
			var e Error
			json.Unmarshal(f.Payload, &e)
			rd.mu.Lock()
			if rd.complaints = append(rd.complaints, e); len(rd.complaints) == 1 {
				close(rd.complained)
			}
			rd.mu.Unlock()
		}
	}
	c.close(nil)
}

// Fetch modes of the hostile tests.
const (
	modeDeliver     = 1 << 0 // Deliver instead of Dst
	modeSubset      = 1 << 1 // chunks [3, 8) only
	modeSmallWindow = 1 << 2 // a window of one chunk
)

const guard = 64 // bytes watched on either side of Dst

// hostileResult is a fetch from a hostile peer, its invariants checked.
type hostileResult struct {
	stats  FetchStats
	err    error
	failed map[int][]Attempt
	addr   string
	round  *hostileRound
}

// fetchHostile fetches the hostile buffer from a peer playing sc and
// checks what must hold whatever the peer sends: Fetch ends by itself
// with nil or a *FetchError; every chunk it does not list as failed holds
// the right bytes (the spec carries the manifest's checksums); nothing is
// written outside Dst or outside the chunks asked for, nor after Fetch
// returns; Deliver sees each chunk once, and a request holds at most a
// window of buffers. gate, if set, holds the first Deliver until the dialer has
// complained to the peer.
func fetchHostile(t testing.TB, h *hostilePeer, mode byte, sc []byte, gate bool, log zerolog.Logger) hostileResult {
	t.Helper()
	rd := h.play(sc)
	dcfg := baseConfig(t, "dialer")
	dcfg.Log = log
	dcfg.Timeout, dcfg.Heartbeat = h.srv.cfg.Timeout, h.srv.cfg.Heartbeat
	cl, err := NewClient(dcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	size := int64(len(hostileData))
	spec := FetchSpec{ChunkSize: hcs, Size: size, CRC: hostileCRCs(), Sources: []Source{{h.addr(), hostileKey}}}
	want := make([]int, hostileN)
	for i := range want {
		want[i] = i
	}
	if mode&modeSubset != 0 {
		want = []int{3, 4, 5, 6, 7}
		spec.Chunks = slices.Clone(want)
	}
	if mode&modeSmallWindow != 0 {
		spec.Window = hcs
	}
	back := bytes.Repeat([]byte{0xa5}, guard+int(size)+guard)
	var mu sync.Mutex
	delivered := map[int]int{}
	if mode&modeDeliver != 0 {
		var gated atomic.Bool
		spec.Deliver = func(i int, data []byte) error {
			if gate && gated.CompareAndSwap(false, true) {
				select {
				case <-rd.complained:
				case <-time.After(10 * time.Second):
					t.Error("the dialer never complained to the peer")
				}
			}
			mu.Lock()
			defer mu.Unlock()
			delivered[i]++
			copy(back[guard+i*hcs:], data)
			if int64(len(data)) != spec.chunkLen(i) {
				t.Errorf("chunk %d delivered with %d bytes, want %d", i, len(data), spec.chunkLen(i))
			}
			return nil
		}
	} else {
		spec.Dst = back[guard : guard+int(size) : guard+int(size)]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stats, err := cl.Fetch(ctx, spec)
	if ctx.Err() != nil {
		t.Fatalf("Fetch did not end by itself: %v", err)
	}
	after := bytes.Clone(back)
	res := hostileResult{stats: stats, err: err, failed: map[int][]Attempt{}, addr: h.addr(), round: rd}
	if err != nil {
		var fe *FetchError
		if !errors.As(err, &fe) {
			t.Fatalf("Fetch: %v (%T), want nil or a *FetchError", err, err)
		}
		if len(fe.Failed) == 0 || fe.Total != len(want) {
			t.Fatalf("FetchError of %d failed chunks of %d: %v", len(fe.Failed), fe.Total, err)
		}
		for _, f := range fe.Failed {
			if !slices.Contains(want, f.Chunk) || res.failed[f.Chunk] != nil {
				t.Fatalf("chunk %d failed, which was not asked for or fails twice: %v", f.Chunk, err)
			}
			res.failed[f.Chunk] = f.Attempts
		}
	}
	if stats.Chunks != len(want)-len(res.failed) {
		t.Errorf("stats count %d chunks, want %d", stats.Chunks, len(want)-len(res.failed))
	}
	for i := range hostileN {
		lo, hi := guard+i*hcs, guard+i*hcs+len(hostileChunk(uint64(i)))
		switch {
		case !slices.Contains(want, i):
			if !bytes.Equal(back[lo:hi], bytes.Repeat([]byte{0xa5}, hi-lo)) || delivered[i] != 0 {
				t.Errorf("chunk %d, not asked for, was written", i)
			}
		case res.failed[i] == nil:
			if !bytes.Equal(back[lo:hi], hostileChunk(uint64(i))) {
				t.Errorf("chunk %d not listed as failed but holds wrong bytes", i)
			}
			if mode&modeDeliver != 0 && delivered[i] != 1 {
				t.Errorf("chunk %d delivered %d times", i, delivered[i])
			}
		}
	}
	for _, g := range [][]byte{back[:guard], back[guard+int(size):]} {
		if !bytes.Equal(g, bytes.Repeat([]byte{0xa5}, guard)) {
			t.Errorf("bytes outside Dst were written: %x", g)
		}
	}
	if mode&modeDeliver != 0 {
		window := spec.Window
		if window == 0 {
			window = dcfg.withDefaultsOrDie(t).Window
		}
		if limit := max(window, hcs); stats.Buffered > limit {
			t.Errorf("a request held %d bytes of Deliver buffers at once, more than its window of %d", stats.Buffered, limit)
		}
	} else if stats.Buffered != 0 {
		t.Errorf("a Dst fetch reports %d bytes of buffers", stats.Buffered)
	}
	h.hangUp(t)
	cl.Close()
	if !bytes.Equal(after, back) {
		t.Error("the destination changed after Fetch returned")
	}
	return res
}

func (c Config) withDefaultsOrDie(t testing.TB) Config {
	c, err := c.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// hostileCase is a hostile listener and what the dialer must make of it.
type hostileCase struct {
	name   string
	mode   byte
	script script
	gate   bool
	// failed are the chunks that must fail; nil: the fetch succeeds.
	failed []int
	conn   bool  // their error is the connection's (*ConnError)
	is     error // their error wraps this
	// msg is the cause their error must name, given the peer's address.
	msg func(addr string) string
	// complaint is the error frame the dialer sends before it hangs up.
	complaint *Error
	requests  int // fetch requests the dialer sends; 0: not checked
}

func span(lo, hi int) []int {
	var out []int
	for i := lo; i < hi; i++ {
		out = append(out, i)
	}
	return out
}

func without(s []int, v int) []int {
	return slices.DeleteFunc(slices.Clone(s), func(x int) bool { return x == v })
}

func text(s string) func(string) string { return func(string) string { return s } }

func flipped(i, pos int) []byte {
	p := slices.Clone(hostileChunk(uint64(i)))
	p[pos] ^= 0x40
	return p
}

var hostileCases = []hostileCase{
	{name: "honest", script: script{}.rest(), requests: 1},
	{name: "honest, deliver, small window", mode: modeDeliver | modeSmallWindow | modeSubset, script: script{}.serve()},
	{name: "chunks out of order", script: script{}.chunk(rel(9), co{}).chunk(rel(0), co{}).rest()},
	{name: "index one past the range", script: script{}.chunk(rel(10), co{}), failed: span(0, 10), conn: true,
		msg:       text("peer sent chunk 10 for request 1, which asked for [0, 10)"),
		complaint: &Error{Code: CodeMalformed, Message: "peer sent chunk 10 for request 1, which asked for [0, 10)"}},
	{name: "index 2^64-1", script: script{}.chunk(idxMaxU64, co{}), failed: span(0, 10), conn: true,
		msg: text("peer sent chunk 18446744073709551615 for request 1, which asked for [0, 10)")},
	{name: "index 2^63", script: script{}.chunk(idxTop, co{}), failed: span(0, 10), conn: true,
		msg: text("peer sent chunk 9223372036854775808 for request 1, which asked for [0, 10)")},
	{name: "index first+2^32", mode: modeSubset, script: script{}.chunk(idxHigh, co{}), failed: span(3, 8), conn: true,
		msg: text("peer sent chunk 4294967299 for request 1, which asked for [3, 8)")},
	{name: "index below the range", mode: modeSubset, script: script{}.chunk(rel(-1), co{}), failed: span(3, 8), conn: true,
		msg: text("peer sent chunk 2 for request 1, which asked for [3, 8)")},
	{name: "duplicate chunk", script: script{}.chunk(rel(0), co{}).chunk(rel(0), co{}), failed: span(1, 10), conn: true,
		msg:       text("peer sent chunk 0 of request 1 twice"),
		complaint: &Error{Code: CodeMalformed, Message: "peer sent chunk 0 of request 1 twice"}},
	{name: "duplicate chunk, deliver", mode: modeDeliver, script: script{}.chunk(rel(4), co{}).chunk(rel(4), co{corrupt: 1}),
		failed: without(span(0, 10), 4), conn: true, msg: text("peer sent chunk 4 of request 1 twice")},
	{name: "chunk one byte short", script: script{}.chunk(rel(2), co{length: lenShort}), failed: span(0, 10), is: &Error{Code: CodeMismatch},
		msg: text("peer error mismatch: chunk 2 is 1023 bytes there, 1024 expected (another chunk size?)")},
	{name: "chunk one byte long", mode: modeDeliver, script: script{}.chunk(rel(2), co{length: lenLong}), failed: span(0, 10), is: &Error{Code: CodeMismatch},
		msg: text("chunk 2 is 1025 bytes there, 1024 expected")},
	{name: "empty chunk", script: script{}.chunk(rel(0), co{length: lenZero}), failed: span(0, 10), is: &Error{Code: CodeMismatch},
		msg: text("chunk 0 is 0 bytes there, 1024 expected")},
	{name: "last chunk padded to the chunk size", script: script{}.chunk(rel(9), co{length: lenFull}), failed: span(0, 10), is: &Error{Code: CodeMismatch},
		msg: text("chunk 9 is 1024 bytes there, 300 expected")},
	{name: "chunk over the payload limit", script: script{}.chunk(rel(1), co{length: lenHuge}), failed: span(0, 10), conn: true, is: ErrTooLarge,
		msg:       text("frame too large: chunk payload of 67108865 bytes > 67108864"),
		complaint: &Error{Code: CodeMalformed, Message: "frame too large: chunk payload of 67108865 bytes > 67108864"}},
	{name: "chunk cut short", script: script{}.chunk(rel(0), co{}).chunk(rel(1), co{length: lenTruncated}), failed: span(1, 10), conn: true,
		is: io.ErrUnexpectedEOF, msg: text("connection closed by the peer (its agent exited, or its node is gone): unexpected EOF")},
	{name: "header checksum", script: script{}.chunk(rel(0), co{header: hdrCRC}), failed: span(0, 10), conn: true, is: ErrHeaderCRC,
		msg: text("header checksum mismatch: recorded 0x"), complaint: &Error{Code: CodeMalformed, Message: "header checksum mismatch"}},
	{name: "version 2", script: script{}.chunk(rel(0), co{header: hdrVersion}), failed: span(0, 10), conn: true, is: ErrVersion,
		msg:       text("unsupported peer protocol version 2 (this agent speaks 1)"),
		complaint: &Error{Code: CodeVersion, Message: "unsupported peer protocol version 2 (this agent speaks 1)"}},
	{name: "reserved flags", script: script{}.chunk(rel(0), co{header: hdrFlags}), failed: span(0, 10), conn: true, is: ErrFlags,
		msg: text("reserved flags are not zero: 0x0001")},
	{name: "bad magic", script: script{}.chunk(rel(0), co{header: hdrMagic}), failed: span(0, 10), conn: true, is: ErrMagic,
		msg: text("bad magic (not a reft peer stream, or the stream lost its frame boundaries): got 0x58465450")},
	{name: "http instead of frames", script: script{}.raw([]byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")), failed: span(0, 10),
		conn: true, is: ErrMagic, msg: text("got 0x48545450")},
	{name: "bytes changed at rest (stored CRC)", script: script{}.chunk(rel(4), co{corrupt: 8, crc: crcTrue}).rest(), failed: []int{4}, is: ErrChecksum,
		msg: func(addr string) string {
			return fmt.Sprintf("chunk 4 from %s: CRC-32C 0x%08x, source's stored 0x%08x", addr, crc32c.Checksum(flipped(4, 7)), crc32c.Checksum(hostileChunk(4)))
		}},
	{name: "wrong bytes under their own CRC (manifest CRC)", mode: modeDeliver, script: script{}.chunk(rel(4), co{corrupt: 1}).rest(), failed: []int{4}, is: ErrChecksum,
		msg: func(addr string) string {
			return fmt.Sprintf("chunk 4 from %s: CRC-32C 0x%08x, expected 0x%08x", addr, crc32c.Checksum(flipped(4, 0)), crc32c.Checksum(hostileChunk(4)))
		}},
	{name: "right bytes, wrong CRC field", script: script{}.chunk(rel(0), co{crc: crcWrong}).rest(), failed: []int{0}, is: ErrChecksum,
		msg: func(addr string) string {
			return fmt.Sprintf("chunk 0 from %s: CRC-32C 0x%08x, source's stored 0x%08x", addr, crc32c.Checksum(hostileChunk(0)), crc32c.Checksum(hostileChunk(0))^1)
		}},
	{name: "chunk for a request never made", script: script{}.chunk(rel(0), co{id: idNever}).rest(), failed: span(0, 10), conn: true,
		msg:       text("peer sent chunk 0 for request 2, which this connection never made"),
		complaint: &Error{Code: CodeMalformed, Message: "peer sent chunk 0 for request 2, which this connection never made"}},
	{name: "chunk for the connection (id 0)", script: script{}.chunk(rel(0), co{id: idZero}), failed: span(0, 10), conn: true,
		msg: text("peer sent chunk 0 for request 0, which this connection never made")},
	{name: "chunk for an ended request is dropped", script: script{}.errFrame(idReq, code(CodeNotFound), rel(5), 0).
		chunk(rel(0), co{corrupt: 1}).chunk(rel(1), co{corrupt: 1, crc: crcTrue}).serve(),
		// Chunk 5 has no other source; the rest are asked again, as two runs.
		failed: []int{5}, is: &Error{Code: CodeNotFound}, msg: text("peer error not_found (chunk 5): hostile"), requests: 3},
	{name: "busy, then served", mode: modeDeliver, script: script{}.errFrame(idReq, code(CodeBusy), 0, 0).serve(), requests: 2},
	{name: "error frame for the connection", script: script{}.errFrame(idZero, code(CodeInternal), 0, 0), failed: span(0, 10), conn: true,
		msg: text("peer closed the connection: peer error internal: hostile")},
	{name: "error frame that is not JSON", script: script{}.errFrame(idReq, code(CodeNotFound), 0, 1), failed: span(0, 10), conn: true,
		msg:       text("error payload: unexpected end of JSON input"),
		complaint: &Error{Code: CodeMalformed, Message: "error payload: unexpected end of JSON input"}},
	{name: "unknown frame type", script: script{}.op(opType, 0x42), failed: span(0, 10), conn: true,
		msg:       text("peer sent a type-0x42 frame, which a dialer does not take"),
		complaint: &Error{Code: CodeMalformed, Message: "peer sent a type-0x42 frame, which a dialer does not take"}},
	{name: "a request sent to the dialer", script: script{}.op(opType, byte(TFetch)), failed: span(0, 10), conn: true,
		msg: text("peer sent a fetch frame, which a dialer does not take")},
	{name: "pings and replies nobody asked for", mode: modeSubset,
		script: script{}.op(opPing, 200).op(opReply, idNever, 0, 2).op(opReply, idReq, 1, 1).op(opReply, idMax, 2, 0).rest()},
	{name: "a request left hanging on a live connection", mode: modeDeliver, script: script{}.chunk(rel(0), co{}).serve(),
		failed: span(1, 10), is: ErrStalled,
		msg: text("got no chunk for 2s with its window open, while the connection stayed alive but carried no chunk bytes (the peer's stream is stuck)")},
	{name: "past the window", mode: modeDeliver | modeSmallWindow, gate: true, script: script{}.chunk(rel(0), co{}).chunk(rel(1), co{}),
		failed: span(1, 10), conn: true, msg: text("request 1: peer sent past its window of 1024 bytes (1024 in use)"),
		complaint: &Error{Code: CodeMalformed, Message: "request 1: peer sent past its window of 1024 bytes (1024 in use)"}},
}

// TestHostileListener: each hostile listener costs the dialer only the
// chunks it touched, with an error naming the cause; a protocol
// violation also ends the connection with an error frame telling the
// peer why.
func TestHostileListener(t *testing.T) {
	for _, tc := range hostileCases {
		t.Run(tc.name, func(t *testing.T) {
			log := zerolog.New(zerolog.NewTestWriter(t))
			cfg := baseConfig(t, "hostile")
			cfg.Log = log
			res := fetchHostile(t, newHostilePeer(t, cfg), tc.mode, tc.script, tc.gate, log)
			if tc.failed == nil {
				if res.err != nil {
					t.Fatalf("Fetch: %v", res.err)
				}
			} else {
				got := slices.Sorted(func(yield func(int) bool) {
					for c := range res.failed {
						if !yield(c) {
							return
						}
					}
				})
				if !slices.Equal(got, tc.failed) {
					t.Fatalf("chunks %v failed, want %v: %v", got, tc.failed, res.err)
				}
				for _, c := range tc.failed {
					a := res.failed[c]
					if len(a) != 1 {
						t.Fatalf("chunk %d: %d attempts, want 1: %v", c, len(a), a)
					}
					err := a[0].Err
					if _, ok := errors.AsType[*ConnError](err); ok != tc.conn {
						t.Errorf("chunk %d: %v (%T); connection error %v, want %v", c, err, err, ok, tc.conn)
					}
					if tc.is != nil && !errors.Is(err, tc.is) {
						t.Errorf("chunk %d: %v does not wrap %v", c, err, tc.is)
					}
					if msg := tc.msg(res.addr); !bytes.Contains([]byte(err.Error()), []byte(msg)) {
						t.Errorf("chunk %d: %q does not name the cause %q", c, err, msg)
					}
				}
			}
			if tc.requests != 0 && res.stats.Requests != tc.requests {
				t.Errorf("%d requests, want %d", res.stats.Requests, tc.requests)
			}
			rd := res.round
			rd.mu.Lock()
			defer rd.mu.Unlock()
			if tc.complaint != nil {
				if len(rd.complaints) != 1 || rd.complaints[0].Code != tc.complaint.Code ||
					!bytes.Contains([]byte(rd.complaints[0].Message), []byte(tc.complaint.Message)) {
					t.Errorf("the dialer told the peer %v, want one %s error naming %q", rd.complaints, tc.complaint.Code, tc.complaint.Message)
				}
			}
		})
	}
}

// FuzzHostileListener drives Client.Fetch against listener scripts (see
// opChunk...opServe), seeded with hostileCases. Whatever the script,
// fetchHostile's invariants hold and nothing panics.
func FuzzHostileListener(f *testing.F) {
	for _, tc := range hostileCases {
		f.Add(tc.mode, []byte(tc.script))
	}
	cfg := baseConfig(f, "hostile")
	cfg.Log = zerolog.Nop()
	// Scripts that leave a request hanging wait for the stall timeout:
	// shorter than the tests' so the fuzzer moves on.
	cfg.Timeout, cfg.Heartbeat = 500*time.Millisecond, 100*time.Millisecond
	h := newHostilePeer(f, cfg)
	f.Fuzz(func(t *testing.T, mode byte, sc []byte) {
		if len(sc) > 64*recSize {
			t.Skip("script too long to run quickly")
		}
		fetchHostile(t, h, mode, sc, false, zerolog.Nop())
	})
}
