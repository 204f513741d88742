package peer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/netsched"
	"github.com/reft-hpc/reft/internal/crc32c"
)

// Client dials the job's other agents, keeps authenticated connections to
// them (Config.ConnsPerPeer each), and fetches from them.
type Client struct {
	cfg Config
	log zerolog.Logger

	mu     sync.Mutex
	peers  map[string][]*connSlot
	closed bool
}

// connSlot is one connection to a peer. Its lock is held while dialing,
// which can take DialTimeout and HandshakeTimeout against a silent host:
// a caller waits for it only as long as its own ctx allows, so that a
// short request (the failure detector's beat) is not held by a long dial
// that another caller (the mesh's search) started.
type connSlot struct {
	lock chan struct{} // a mutex that a waiter may give up on
	cc   *clientConn
}

func newSlot() *connSlot { return &connSlot{lock: make(chan struct{}, 1)} }

func (s *connSlot) acquire(ctx context.Context) error {
	select {
	case s.lock <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for another dial to the peer: %w", context.Cause(ctx))
	}
}

func (s *connSlot) release() { <-s.lock }

// NewClient makes a client; it dials lazily, on first use of a peer.
func NewClient(cfg Config) (*Client, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Client{cfg: cfg, log: cfg.Log.With().Str("component", "peer").Logger(), peers: map[string][]*connSlot{}}, nil
}

// Close closes every connection; fetches in progress fail.
func (cl *Client) Close() error {
	cl.mu.Lock()
	cl.closed = true
	peers := cl.peers
	cl.peers = map[string][]*connSlot{}
	cl.mu.Unlock()
	for _, slots := range peers {
		for _, s := range slots {
			s.acquire(context.Background())
			if s.cc != nil {
				s.cc.c.close(errors.New("peer client closed"))
			}
			s.release()
		}
	}
	return nil
}

// Connect makes sure an authenticated connection to addr is up, dialing
// when there is none or it died, and returns the node name the peer
// authenticated as (the name sealed in its credential's binding). With a
// live connection it costs no network traffic, so callers may use it to
// watch a peer: a peer that died is noticed by the heartbeats within
// Config.Timeout, and the next Connect re-dials.
func (cl *Client) Connect(ctx context.Context, addr string) (node string, err error) {
	cc, err := cl.conn(ctx, addr, 0)
	if err != nil {
		return "", err
	}
	return cc.node, nil
}

// Drop closes and forgets every connection to addr, e.g. one that turned
// out to reach another node than the caller meant; requests in flight on
// them fail.
func (cl *Client) Drop(addr string) {
	cl.mu.Lock()
	slots := cl.peers[addr]
	delete(cl.peers, addr)
	cl.mu.Unlock()
	for _, s := range slots {
		s.acquire(context.Background())
		if s.cc != nil {
			s.cc.c.close(errors.New("connection dropped by the client"))
		}
		s.release()
	}
}

// ConnError is a failed connection to a peer (dial, handshake, I/O,
// silence past the timeout). Everything in flight on it failed with it.
type ConnError struct {
	Addr string
	Err  error
}

func (e *ConnError) Error() string { return "peer " + e.Addr + ": " + e.Err.Error() }
func (e *ConnError) Unwrap() error { return e.Err }

// conn returns connection i to addr, dialing when there is none or the
// last one died.
func (cl *Client) conn(ctx context.Context, addr string, i int) (*clientConn, error) {
	cl.mu.Lock()
	if cl.closed {
		cl.mu.Unlock()
		return nil, &ConnError{addr, errors.New("client closed")}
	}
	slots := cl.peers[addr]
	if slots == nil {
		slots = make([]*connSlot, cl.cfg.ConnsPerPeer)
		for j := range slots {
			slots[j] = newSlot()
		}
		cl.peers[addr] = slots
	}
	cl.mu.Unlock()
	s := slots[i%len(slots)]
	if err := s.acquire(ctx); err != nil {
		return nil, &ConnError{addr, err}
	}
	defer s.release()
	if s.cc != nil && !s.cc.c.isClosed() {
		return s.cc, nil
	}
	cc, err := cl.dial(ctx, addr)
	if err != nil {
		return nil, &ConnError{addr, err}
	}
	s.cc = cc
	return cc, nil
}

// synRetry caps one TCP connect attempt of a dial. The kernel resends a
// lost SYN 1 s, 3 s and 7 s after the first: a connect begun during a
// short flap whose first resend is lost too waits for the next one, 2 s
// after the link healed, while it holds its connection slot and the
// failure detector's beats queue behind it (seen in a flap's agent logs:
// beats failing with "waiting for another dial" until the mesh's 5 s
// dial gave up).
// A fresh connect every synRetry sends a SYN every second instead, so a
// healed link is used within a second of healing. A cluster's round trip
// is far below it.
const synRetry = time.Second

// dialTCP connects to addr within timeout (and ctx), a fresh attempt
// every per while attempts time out; any other error (refused,
// unreachable) ends it at once.
func dialTCP(ctx context.Context, addr string, timeout, per time.Duration, dial func(context.Context, string) (net.Conn, error)) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	end, _ := ctx.Deadline()
	for {
		actx, acancel := context.WithTimeout(ctx, per)
		nc, err := dial(actx, addr)
		if err == nil || ctx.Err() != nil || !time.Now().Before(end) || !isTimeout(err) {
			acancel()
			return nc, err
		}
		<-actx.Done() // a timeout before per (not seen): no busy loop
		acancel()
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

func (cl *Client) dial(ctx context.Context, addr string) (*clientConn, error) {
	var d net.Dialer
	nc, err := dialTCP(ctx, addr, cl.cfg.DialTimeout, synRetry, func(ctx context.Context, addr string) (net.Conn, error) {
		return d.DialContext(ctx, "tcp", addr)
	})
	if err != nil {
		return nil, fmt.Errorf("connecting: %w (is the peer agent up, and agent.port_range open between nodes?)", err)
	}
	c := newConn(nc, cl.cfg.Timeout, cl.cfg.Counters)
	// A listener that accepts and then says nothing would hold the caller
	// (and Close) until the handshake timeout; cancelling ctx ends it now.
	stop := context.AfterFunc(ctx, func() { c.close(fmt.Errorf("handshake abandoned: %w", context.Cause(ctx))) })
	node, err := dialHandshake(ctx, &cl.cfg, c)
	if !stop() && err == nil { // cancelled just after it succeeded: c is closed
		err = context.Cause(ctx)
	}
	if err != nil {
		c.close(err)
		cl.log.Warn().Str("event", "peer_handshake_failed").Str("remote", addr).Err(err).Msg("could not authenticate a peer")
		return nil, err
	}
	cc := &clientConn{cl: cl, c: c, addr: addr, node: node, streams: map[uint32]*recvStream{}, calls: map[uint32]chan Frame{}}
	go cc.readLoop()
	go c.heartbeat(cl.cfg.Heartbeat)
	return cc, nil
}

// clientConn is one connection of a Client; many streams and calls share
// it, told apart by request id.
type clientConn struct {
	cl   *Client
	c    *conn
	addr string
	node string

	mu      sync.Mutex
	next    uint32
	wrapped bool // next went round: any id may have been issued
	streams map[uint32]*recvStream
	calls   map[uint32]chan Frame
	dead    error
}

// register reserves a request id for a stream or a call.
func (cc *clientConn) register(st *recvStream, ch chan Frame) (uint32, error) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.dead != nil {
		return 0, &ConnError{cc.addr, cc.dead}
	}
	for {
		cc.next++
		id := cc.next
		if id == 0 {
			cc.wrapped = true
			continue
		}
		if cc.streams[id] != nil || cc.calls[id] != nil {
			continue
		}
		if st != nil {
			st.id = id
			cc.streams[id] = st
		} else {
			cc.calls[id] = ch
		}
		return id, nil
	}
}

func (cc *clientConn) unregister(id uint32) {
	cc.mu.Lock()
	delete(cc.streams, id)
	delete(cc.calls, id)
	cc.mu.Unlock()
}

func (cc *clientConn) stream(id uint32) *recvStream {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.streams[id]
}

// issued reports whether request id was ever made on this connection: a
// chunk of an ended request may still be in flight, one of a request
// never made is a broken peer.
func (cc *clientConn) issued(id uint32) bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return id != 0 && (cc.wrapped || id <= cc.next)
}

func (cc *clientConn) readLoop() {
	err := cc.loop()
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
		err = fmt.Errorf("connection closed by the peer (its agent exited, or its node is gone): %w", err)
	}
	cc.c.close(err)
	err = cc.c.cause() // ours, if we closed it first
	cerr := &ConnError{cc.addr, err}
	cc.mu.Lock()
	cc.dead = err
	streams, calls := cc.streams, cc.calls
	cc.streams, cc.calls = map[uint32]*recvStream{}, map[uint32]chan Frame{}
	cc.mu.Unlock()
	for _, st := range streams {
		st.post(event{end: cerr})
	}
	for _, ch := range calls {
		close(ch)
	}
}

// loop reads frames until the connection fails. It never blocks on a
// consumer: chunk bytes land in the stream's destination (or a buffer the
// window guarantees) and the stream's goroutine is told by a queue.
func (cc *clientConn) loop() error {
	c := cc.c
	for {
		h, err := c.readHeader()
		if err != nil {
			if frameErr(err) && !c.isClosed() { // tell the listener why, as it would tell us
				c.writeError(0, frameCode(err), err.Error(), nil)
			}
			return err
		}
		switch h.Type {
		case TPing:
			err = c.discard(h.Length)
		case TChunk:
			err = cc.chunk(h)
		case TError, TWatermarksReply, TManifestReply, TReplicateReply, TStatusReply, TBeatReply, TProbeReply, TFailureReply:
			err = cc.reply(h)
		default:
			err = fmt.Errorf("peer sent a %s frame, which a dialer does not take", h.Type)
			c.writeError(0, CodeMalformed, err.Error(), nil)
		}
		if err != nil {
			return err
		}
	}
}

// chunk lands a chunk in its stream; one of a stream that ended (it was
// cancelled) is dropped, one of a request never made ends the connection.
func (cc *clientConn) chunk(h Header) error {
	c := cc.c
	c.lastData.Store(time.Now().UnixNano())
	st := cc.stream(h.ID)
	if st == nil {
		if !cc.issued(h.ID) {
			err := fmt.Errorf("peer sent chunk %d for request %d, which this connection never made", h.Arg, h.ID)
			c.writeError(0, CodeMalformed, err.Error(), nil)
			return err
		}
		// Cancelled or ended: drop what was in flight.
		return c.skipChunk(h.Length)
	}
	if err := st.receive(h); err != nil {
		c.writeError(0, CodeMalformed, err.Error(), nil)
		return err
	}
	return nil
}

// reply hands a reply (or an error) to the call waiting for it; an error
// for a stream ends that stream, one for the connection (id 0) ends it.
func (cc *clientConn) reply(h Header) error {
	c := cc.c
	f, err := c.readPayload(h)
	if err != nil {
		if frameErr(err) {
			c.writeError(0, CodeMalformed, err.Error(), nil)
		}
		return err
	}
	if h.Type == TError {
		e := &Error{}
		if err := unmarshal(f, e); err != nil {
			c.writeError(0, CodeMalformed, err.Error(), nil)
			return err
		}
		if h.ID == 0 {
			return fmt.Errorf("peer closed the connection: %w", e)
		}
		if st := cc.stream(h.ID); st != nil {
			cc.unregister(h.ID)
			st.post(event{end: e})
			return nil
		}
	}
	cc.mu.Lock()
	ch := cc.calls[h.ID]
	delete(cc.calls, h.ID)
	cc.mu.Unlock()
	if ch != nil {
		ch <- f
	}
	return nil
}

// call sends a control request and waits for its reply.
func (cc *clientConn) call(ctx context.Context, t Type, req any, resp any) error {
	ch := make(chan Frame, 1)
	id, err := cc.register(nil, ch)
	if err != nil {
		return err
	}
	defer cc.unregister(id)
	if err := cc.c.writeMsg(t, id, req); err != nil {
		return &ConnError{cc.addr, err}
	}
	select {
	case f, ok := <-ch:
		if !ok {
			return &ConnError{cc.addr, cc.c.cause()}
		}
		switch f.Type {
		case TError:
			e := &Error{}
			if err := unmarshal(f, e); err != nil {
				return err
			}
			return e
		case t | ReplyBit:
			return unmarshal(f, resp)
		}
		return fmt.Errorf("peer %s answered %s with %s", cc.addr, t, f.Type)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Watermarks asks the agent at addr which generations of ranks (nil: all)
// it holds.
func (cl *Client) Watermarks(ctx context.Context, addr string, ranks []int) (*WatermarksReply, error) {
	cc, err := cl.conn(ctx, addr, 0)
	if err != nil {
		return nil, err
	}
	r := &WatermarksReply{}
	if err := cc.call(ctx, TWatermarks, &WatermarksRequest{Ranks: ranks}, r); err != nil {
		return nil, fmt.Errorf("watermarks from %s: %w", addr, err)
	}
	return r, nil
}

// Replicate asks the agent at addr to copy sections of generation k of
// this agent's store in the background. It returns once the peer has
// queued the request, not when the copy is done.
func (cl *Client) Replicate(ctx context.Context, addr string, req ReplicateRequest) error {
	cc, err := cl.conn(ctx, addr, 0)
	if err != nil {
		return err
	}
	if err := cc.call(ctx, TReplicate, &req, &ReplicateReply{}); err != nil {
		return fmt.Errorf("replicate request to %s: %w", addr, err)
	}
	return nil
}

// Call sends a request of type t (one a Handler serves on the other side:
// TBeat, TProbe, TFailure) with req as its JSON payload and decodes the
// reply into resp. It dials when there is no live connection.
func (cl *Client) Call(ctx context.Context, addr string, t Type, req, resp any) error {
	if !t.Handled() {
		return fmt.Errorf("peer: %s is not a request type for Call", t)
	}
	cc, err := cl.conn(ctx, addr, 0)
	if err != nil {
		return err
	}
	if err := cc.call(ctx, t, req, resp); err != nil {
		return fmt.Errorf("%s to %s: %w", t, addr, err)
	}
	return nil
}

// Status asks the agent at addr for its status (the JSON of its local
// status reply, docs/PROTOCOL.md) and returns it undecoded, with the node
// the agent authenticated as.
func (cl *Client) Status(ctx context.Context, addr string) (node string, status json.RawMessage, err error) {
	cc, err := cl.conn(ctx, addr, 0)
	if err != nil {
		return "", nil, err
	}
	if err := cc.call(ctx, TStatus, nil, &status); err != nil {
		return cc.node, nil, fmt.Errorf("status from %s: %w", addr, err)
	}
	return cc.node, status, nil
}

// Manifest asks the agent at addr for a generation's layout and checksums,
// checked for consistency before it is returned.
func (cl *Client) Manifest(ctx context.Context, addr string, k GenKey) (*GenInfo, error) {
	cc, err := cl.conn(ctx, addr, 0)
	if err != nil {
		return nil, err
	}
	g := &GenInfo{}
	if err := cc.call(ctx, TManifest, &k, g); err != nil {
		return nil, fmt.Errorf("manifest of %s from %s: %w", k, addr, err)
	}
	if err := g.check(); err != nil {
		return nil, fmt.Errorf("manifest of %s from %s: %w", k, addr, err)
	}
	return g, nil
}

// check validates a GenInfo from the wire: every count it implies must
// agree, so nothing downstream indexes past a slice.
func (g *GenInfo) check() error {
	if g.ChunkSize <= 0 || g.ChunkSize > MaxPayload {
		return fmt.Errorf("chunk size %d outside (0, %d]", g.ChunkSize, MaxPayload)
	}
	for _, b := range g.Buffers {
		if b.Size < 0 {
			return fmt.Errorf("buffer %q has negative size %d", b.Name, b.Size)
		}
		if want := numChunks(b.Size, g.ChunkSize); int64(len(b.CRC32C)) != want {
			return fmt.Errorf("buffer %q of %d bytes has %d checksums, want %d", b.Name, b.Size, len(b.CRC32C), want)
		}
	}
	return nil
}

// numChunks is how many chunks of chunk bytes hold size bytes, without
// the overflow of (size+chunk-1)/chunk for sizes near the int64 limit.
func numChunks(size, chunk int64) int64 {
	n := size / chunk
	if size%chunk != 0 {
		n++
	}
	return n
}

// event is what the reader tells a stream: a chunk landed (err: it failed
// its checksum), or the stream ended early (end).
type event struct {
	chunk  int
	buf    []byte
	err    error
	end    error
	cancel bool // end was found by the dialer: tell the listener to stop
}

// recvStream is the dialer's side of one fetch request.
type recvStream struct {
	cc   *clientConn
	id   uint32
	req  FetchRequest
	spec *FetchSpec
	src  Source
	pool *bufPool // nil: chunks land in spec.Dst
	got  []bool   // touched by the reader only
	// rmu is held by the reader while a chunk lands; detached (under rmu)
	// tells it the fetch no longer owns the destination.
	rmu      sync.Mutex
	detached bool
	mu       sync.Mutex
	queue    []event
	wake     chan struct{}
}

func (st *recvStream) post(ev event) {
	st.mu.Lock()
	st.queue = append(st.queue, ev)
	st.mu.Unlock()
	select {
	case st.wake <- struct{}{}:
	default:
	}
}

// ErrStalled: a request got no chunk for Config.Timeout while its window
// was open and its connection, alive, carried no chunk bytes at all.
var ErrStalled = errors.New("peer stream stalled")

// nextEvent waits for the stream's next event. With stall > 0 it gives up
// when nothing arrives for stall although every chunk received has been
// credited (the listener may send) and the connection carries no chunk
// bytes for anyone: the peer's stream is stuck, and its heartbeats would
// keep the connection, and this wait, alive for ever.
func (st *recvStream) nextEvent(ctx context.Context, stall time.Duration) (event, error) {
	since := time.Now().UnixNano()
	var tick <-chan time.Time
	if stall > 0 {
		t := time.NewTicker(stall / 4)
		defer t.Stop()
		tick = t.C
	}
	for {
		st.mu.Lock()
		if len(st.queue) > 0 {
			ev := st.queue[0]
			st.queue = st.queue[1:]
			st.mu.Unlock()
			return ev, nil
		}
		st.mu.Unlock()
		select {
		case <-st.wake:
		case <-ctx.Done():
			return event{}, ctx.Err()
		case now := <-tick:
			last := max(since, st.cc.c.lastData.Load())
			if now.Sub(time.Unix(0, last)) >= stall {
				return event{}, fmt.Errorf("%w: request %d got no chunk for %s with its window open, while the connection stayed alive but carried no chunk bytes (the peer's stream is stuck)",
					ErrStalled, st.id, stall)
			}
		}
	}
}

// receive handles one chunk frame on the reader goroutine. Its error is a
// protocol violation that ends the connection; a chunk that merely fails
// its checksum is an event.
func (st *recvStream) receive(h Header) error {
	c := st.cc.c
	st.rmu.Lock()
	defer st.rmu.Unlock()
	if st.detached {
		return c.skipChunk(h.Length)
	}
	first, count := st.req.First, st.req.Count
	if h.Arg < uint64(first) || h.Arg >= uint64(first+count) {
		return fmt.Errorf("peer sent chunk %d for request %d, which asked for [%d, %d)", h.Arg, h.ID, first, first+count)
	}
	idx := int(h.Arg)
	if st.got[idx-first] {
		return fmt.Errorf("peer sent chunk %d of request %d twice", idx, h.ID)
	}
	st.got[idx-first] = true
	want := st.spec.chunkLen(idx)
	if int64(h.Length) != want {
		if err := c.skipChunk(h.Length); err != nil {
			return err
		}
		st.cc.unregister(st.id)
		st.post(event{cancel: true, end: &Error{Code: CodeMismatch, Message: fmt.Sprintf("chunk %d is %d bytes there, %d expected (another chunk size?)", idx, h.Length, want)}})
		return nil
	}
	var buf []byte
	if st.pool != nil {
		var err error
		if buf, err = st.pool.get(int(want)); err != nil {
			return fmt.Errorf("request %d: %w", h.ID, err)
		}
	} else {
		off := int64(idx) * st.spec.ChunkSize
		buf = st.spec.Dst[off : off+want]
	}
	crc, err := c.readInto(buf)
	if err != nil {
		return err
	}
	var cerr error
	if crc != h.CRC {
		cerr = &ChecksumError{Chunk: idx, Source: st.src, Want: h.CRC, Got: crc, Stored: true}
	} else if st.spec.CRC != nil && crc != st.spec.CRC[idx] {
		cerr = &ChecksumError{Chunk: idx, Source: st.src, Want: st.spec.CRC[idx], Got: crc}
	}
	st.post(event{chunk: idx, buf: buf, err: cerr})
	return nil
}

// detach ends the stream's claim on its connection: no chunk lands in the
// destination after it returns, so the caller may reuse Dst. A chunk
// landing right now may finish; one stuck on a silent peer is cut off by
// closing the connection.
func (st *recvStream) detach() {
	st.cc.unregister(st.id)
	if !st.rmu.TryLock() {
		locked := make(chan struct{})
		go func() {
			st.rmu.Lock()
			close(locked)
		}()
		select {
		case <-locked:
		case <-time.After(100 * time.Millisecond):
			st.cc.c.close(errors.New("a fetch was abandoned while its chunk was still arriving"))
			<-locked
		}
	}
	st.detached = true
	st.rmu.Unlock()
}

// ErrChecksum is wrapped by every ChecksumError.
var ErrChecksum = errors.New("chunk checksum mismatch")

// ChecksumError is a chunk whose bytes, as received, do not match its
// CRC-32C: the one the source recorded (Stored: corrupt at rest there, or
// in transit) or the one the caller expects.
type ChecksumError struct {
	Chunk     int
	Source    Source
	Want, Got uint32
	Stored    bool
}

func (e *ChecksumError) Error() string {
	which := "expected"
	if e.Stored {
		which = "source's stored"
	}
	return fmt.Sprintf("chunk %d from %s: CRC-32C 0x%08x, %s 0x%08x", e.Chunk, e.Source.Addr, e.Got, which, e.Want)
}

func (e *ChecksumError) Unwrap() error { return ErrChecksum }

// bufPool holds the receive buffers of a Deliver fetch. The listener keeps
// at most max(window, one chunk) bytes unacknowledged and credit goes back
// only after a buffer is returned, so the pool never needs more; a peer
// that sends beyond its window breaks the protocol.
type bufPool struct {
	mu    sync.Mutex
	free  [][]byte
	cap   int
	limit int64
	used  int64
	peak  *atomic.Int64 // the fetch's: the most one request held
}

// notePeak raises peak to v.
func notePeak(peak *atomic.Int64, v int64) {
	for p := peak.Load(); v > p && !peak.CompareAndSwap(p, v); p = peak.Load() {
	}
}

func (p *bufPool) get(n int) ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.used > 0 && p.used+int64(n) > p.limit {
		return nil, fmt.Errorf("peer sent past its window of %d bytes (%d in use)", p.limit, p.used)
	}
	p.used += int64(n)
	notePeak(p.peak, p.used)
	if k := len(p.free); k > 0 {
		b := p.free[k-1]
		p.free = p.free[:k-1]
		return b[:n], nil
	}
	return make([]byte, n, max(n, p.cap)), nil
}

func (p *bufPool) put(b []byte) {
	p.mu.Lock()
	p.used -= int64(len(b))
	p.free = append(p.free, b[:cap(b)])
	p.mu.Unlock()
}

// runResult is how one request ended.
type runResult struct {
	src   Source
	list  []int         // the chunks asked for
	ok    []int         // landed and verified
	bad   map[int]error // landed but failed their checksum
	end   error         // the request ended before every chunk came: *Error, *ConnError, ctx
	fatal error         // the caller's Deliver failed: abort the fetch
	retry bool          // list is a delayed retry, not a request
}

// take records one chunk's outcome: a bad chunk, or a good one handed
// to Deliver (when set) and counted; false when Deliver failed, which
// ends the run (res.fatal).
func (res *runResult) take(spec *FetchSpec, ev event) bool {
	if ev.err != nil {
		res.bad[ev.chunk] = ev.err
		return true
	}
	if spec.Deliver != nil {
		if err := spec.Deliver(ev.chunk, ev.buf); err != nil {
			res.fatal = fmt.Errorf("delivering chunk %d: %w", ev.chunk, err)
			return false
		}
	}
	res.ok = append(res.ok, ev.chunk)
	if spec.Progress != nil {
		spec.Progress(int64(len(ev.buf)))
	}
	return true
}

// run sends one fetch request for chunks list (contiguous) and consumes its
// stream.
func (cl *Client) run(ctx context.Context, spec *FetchSpec, src Source, list []int, connIdx int, peak *atomic.Int64) runResult {
	res := runResult{src: src, list: list, bad: map[int]error{}}
	cc, err := cl.conn(ctx, src.Addr, connIdx)
	if err != nil {
		res.end = err
		return res
	}
	window := spec.Window
	if window <= 0 {
		window = cl.cfg.Window
	}
	req := FetchRequest{ChunkKey: src.Key, First: list[0], Count: len(list), ChunkSize: spec.ChunkSize,
		Size: spec.Size, Window: window, Background: spec.Background}
	st := &recvStream{cc: cc, req: req, spec: spec, src: src, got: make([]bool, len(list)), wake: make(chan struct{}, 1)}
	if spec.Deliver != nil {
		st.pool = &bufPool{cap: int(spec.ChunkSize), limit: max(window, spec.ChunkSize), peak: peak}
	}
	id, err := cc.register(st, nil)
	if err != nil {
		res.end = err
		return res
	}
	defer st.detach()
	if err := cc.c.writeMsg(TFetch, id, &req); err != nil {
		res.end = &ConnError{cc.addr, err}
		return res
	}
	// A background stream may wait on either side's paused limiter for
	// as long as the trainer communicates: only foreground ones stall.
	var stall time.Duration
	if !spec.Background {
		stall = cl.cfg.Timeout
	}
	for left := len(list); left > 0; left-- {
		ev, err := st.nextEvent(ctx, stall)
		if err != nil {
			cc.c.write(TCancel, id, 0, crc32c.Checksum(nil), nil)
			res.end = err
			return res
		}
		if ev.end != nil {
			res.end = ev.end
			if ev.cancel { // found here (a size mismatch): the listener still streams
				cc.c.write(TCancel, id, 0, crc32c.Checksum(nil), nil)
			}
			return res
		}
		if !res.take(spec, ev) {
			cc.c.write(TCancel, id, 0, crc32c.Checksum(nil), nil)
			return res
		}
		n := int64(len(ev.buf))
		if st.pool != nil {
			st.pool.put(ev.buf)
		}
		if spec.Background {
			if err := cl.cfg.Background.Wait(ctx, netsched.Inbound, n); err != nil {
				cc.c.write(TCancel, id, 0, crc32c.Checksum(nil), nil)
				res.end = err
				return res
			}
		}
		cc.c.write(TCredit, id, uint64(n), crc32c.Checksum(nil), nil) // a dead conn shows up as an end event
	}
	return res
}
