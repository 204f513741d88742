package peer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	logevent "github.com/reft-hpc/reft/agent/event"
	"github.com/reft-hpc/reft/agent/netsched"
)

// ChunkSource is what a Server serves: the agent's snapshot store
// (StoreSource) or, in tests, a fake.
type ChunkSource interface {
	// Watermarks lists the committed, not corrupt generations of ranks
	// (nil: every rank) that this node can serve.
	Watermarks(ranks []int) []Watermark
	// Open pins a generation until Close, so its bytes stay put while they
	// are streamed. Errors wrap ErrNotFound or ErrCorrupt where they apply.
	Open(k GenKey) (SourceGeneration, error)
}

// HostedSource is a ChunkSource that also knows which ranks run on its
// node (the agent's registrations): a watermarks reply then lists the
// asked ones in Hosted, which is how agents learn the job's rank-to-node
// map for the sharding groups they need, without a job-wide exchange.
type HostedSource interface {
	ChunkSource
	Hosted(ranks []int) []HostedRank
}

// SourceGeneration is a pinned generation.
type SourceGeneration interface {
	Info() *GenInfo
	// Chunk returns chunk i of a buffer, without copying, and the CRC-32C
	// recorded when it was stored. The bytes must stay valid until Close.
	Chunk(buffer string, i int) ([]byte, uint32, error)
	Close()
}

// Source errors a ChunkSource wraps; they become the codes not_found and
// corrupt on the wire.
var (
	ErrNotFound = errors.New("not found")
	ErrCorrupt  = errors.New("marked corrupt")
)

func codeOf(err error) string {
	switch {
	case errors.Is(err, ErrNotFound):
		return CodeNotFound
	case errors.Is(err, ErrCorrupt):
		return CodeCorrupt
	}
	return CodeInternal
}

// Server accepts authenticated connections from the job's other agents and
// serves watermarks, manifests and chunk streams from a ChunkSource.
type Server struct {
	cfg     Config
	src     ChunkSource
	ln      *net.TCPListener
	log     zerolog.Logger
	streams chan struct{} // MaxStreams slots
	shakes  chan struct{} // MaxHandshakes slots
	// unauth holds a slot per connection not yet authenticated
	// (MaxUnauthenticated); the accept loop waits for one before it
	// accepts, so strangers cannot make the agent hold more.
	unauth chan struct{}
	done   chan struct{} // closed by Close

	mu         sync.Mutex
	conns      map[*conn]struct{}
	perHost    map[string]int // unauthenticated connections per remote address
	refusedLog every
	closed     bool
	wg         sync.WaitGroup
	handlers   map[Type]Handler

	stats ServerStats
}

// ServerStats are a Server's counters.
type ServerStats struct {
	Accepted   atomic.Uint64 // connections that passed the handshake
	Refused    atomic.Uint64 // connections refused (authentication, protocol)
	Streams    atomic.Uint64 // fetches started
	ChunksSent atomic.Uint64
	BytesSent  atomic.Uint64
	Busy       atomic.Uint64 // fetches refused with busy
	// Shed counts connections closed unread because their address held
	// MaxUnauthenticatedPerHost unauthenticated ones already.
	Shed atomic.Uint64
	// AcceptBackoffs counts accepts that failed for want of descriptors
	// or memory and were retried after a pause.
	AcceptBackoffs atomic.Uint64
}

// Listen binds a port of cfg.Ports, or else of cfg.PortRange, on cfg.Bind
// and serves src until Close.
func Listen(cfg Config, src ChunkSource) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	var ln *net.TCPListener
	if len(cfg.Ports) > 0 {
		ln, err = ListenPorts(cfg.Bind, cfg.Ports)
	} else {
		ln, err = ListenRange(cfg.Bind, cfg.PortRange[0], cfg.PortRange[1])
	}
	if err != nil {
		return nil, err
	}
	s := newServer(cfg, src, ln)
	s.wg.Add(1)
	go s.accept()
	s.log.Info().Str("addr", ln.Addr().String()).Str("auth", cfg.Auth.Method()).Msg("peer listener up")
	return s, nil
}

// newServer makes a server on ln (cfg with its defaults) that accepts
// nothing yet.
func newServer(cfg Config, src ChunkSource, ln *net.TCPListener) *Server {
	return &Server{cfg: cfg, src: src, ln: ln, log: cfg.Log.With().Str("component", "peer").Logger(),
		streams: make(chan struct{}, cfg.MaxStreams), shakes: make(chan struct{}, cfg.MaxHandshakes),
		unauth: make(chan struct{}, cfg.MaxUnauthenticated), done: make(chan struct{}),
		conns: map[*conn]struct{}{}, perHost: map[string]int{}}
}

// Handler serves one request type that is not the store's (Type.Handled):
// from is the node the dialer authenticated as, payload the request's
// JSON. Its result is the reply's payload; an error becomes an error
// frame (a *Error keeps its code, anything else is internal).
type Handler func(ctx context.Context, from string, payload []byte) (any, error)

// Handle makes the server answer requests of type t with h; until then
// they get unknown_type. t must be one of the Handled types.
func (s *Server) Handle(t Type, h Handler) error {
	if !t.Handled() {
		return fmt.Errorf("peer: %s cannot have a handler", t)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.handlers == nil {
		s.handlers = map[Type]Handler{}
	}
	s.handlers[t] = h
	return nil
}

func (s *Server) handler(t Type) Handler {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.handlers[t]
}

// Addr is the listening address.
func (s *Server) Addr() *net.TCPAddr { return s.ln.Addr().(*net.TCPAddr) }

// Stats returns the server's counters.
func (s *Server) Stats() *ServerStats { return &s.stats }

// Close stops accepting, closes every connection (streams in progress end
// with an I/O error on the fetching side) and waits for its goroutines.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	err := s.ln.Close()
	for c := range s.conns {
		c.close(errors.New("peer server closed"))
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

func (s *Server) accept() {
	defer s.wg.Done()
	var backoff time.Duration
	var shedLog every
	for {
		select {
		case s.unauth <- struct{}{}:
		case <-s.done:
			return
		}
		nc, err := s.ln.Accept()
		if err != nil {
			<-s.unauth
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return
			}
			if !acceptRetryable(err) {
				s.log.Error().Err(err).Msg("peer accept failed; the listener stops")
				return
			}
			// Out of descriptors or memory: a flood, or the job itself.
			// The condition passes when connections close, so wait and
			// try again rather than stop listening for the rest of the job.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			if s.stats.AcceptBackoffs.Add(1) == 1 || backoff == time.Second {
				s.log.Warn().Str("event", "peer_accept_backoff").Err(err).Dur("retry_in", backoff).
					Msg("peer accept failed for want of resources; retrying (raise the open-files limit if this persists)")
			}
			select {
			case <-time.After(backoff):
			case <-s.done:
				return
			}
			continue
		}
		backoff = 0
		host := remoteHost(nc)
		if !s.admit(host) {
			<-s.unauth
			// Count and log before the close, so that whoever sees the
			// close (the flooder, a test) also sees it counted.
			if n := s.stats.Shed.Add(1); shedLog.allow(10 * time.Second) {
				s.log.Warn().Str("event", "peer_conn_shed").Str("remote", host).Uint64("shed", n).
					Msgf("closed a connection from %s unread: it holds %d unauthenticated connections already (a flood, or a misbehaving host)", host, s.cfg.MaxUnauthenticatedPerHost)
			}
			nc.Close()
			continue
		}
		if !s.track(nc, func(c *conn) { s.serveCounted(c, func() { s.authenticated(host) }) }) {
			return
		}
	}
}

// every lets an event through at most once per interval.
type every struct{ last atomic.Int64 }

func (e *every) allow(d time.Duration) bool {
	now, last := time.Now().UnixNano(), e.last.Load()
	return now-last >= int64(d) && e.last.CompareAndSwap(last, now)
}

// acceptRetryable reports whether an accept error passes on its own:
// the process or system is out of descriptors (EMFILE, ENFILE) or of
// buffer memory, or the connection went away before it was accepted.
func acceptRetryable(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED, syscall.EINTR} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// remoteHost is a connection's remote address without the port.
func remoteHost(nc net.Conn) string {
	if a, ok := nc.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	return nc.RemoteAddr().String()
}

// admit counts an unauthenticated connection from host, or reports that
// host holds MaxUnauthenticatedPerHost already.
func (s *Server) admit(host string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.perHost[host] >= s.cfg.MaxUnauthenticatedPerHost {
		return false
	}
	s.perHost[host]++
	return true
}

// authenticated gives back the unauthenticated slots of a connection
// from host whose handshake ended, either way.
func (s *Server) authenticated(host string) {
	s.mu.Lock()
	if s.perHost[host]--; s.perHost[host] <= 0 {
		delete(s.perHost, host)
	}
	s.mu.Unlock()
	<-s.unauth
}

// track serves a new connection with serve on a goroutine of its own,
// closed by Close; false (nc closed) when the server is closed.
func (s *Server) track(nc net.Conn, serve func(*conn)) bool {
	c := newConn(nc, s.cfg.Timeout, s.cfg.Counters)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		c.close(nil)
		return false
	}
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		defer func() {
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		}()
		serve(c)
	}()
	return true
}

// serverConn is one authenticated connection's state.
type serverConn struct {
	s    *Server
	c    *conn
	node string // the authenticated peer node
	role string // the dialer's sealed role: "" (an agent) or RoleStatus
	log  zerolog.Logger
	mu   sync.Mutex
	strs map[uint32]*sendStream
	wg   sync.WaitGroup
	// calls holds a slot per control request being answered, so a peer
	// that sends requests without reading the replies cannot make this
	// side start goroutines without bound.
	calls    chan struct{}
	refusals atomic.Int64 // refusals logged above debug, for the log's cap
}

// maxCalls bounds the control requests (watermarks, manifest, replicate,
// status, and the handlers') one connection has in progress; beyond it a
// request is answered busy. An agent asks a handful at once.
const maxCalls = 64

// maxRefusalLogs is how many refusals above debug level one connection
// logs one by one.
const maxRefusalLogs = 16

// refuse answers request id (of type t) with an error frame and logs it,
// so a peer's bad request shows in this agent's log as well as the
// peer's. A connection logs maxRefusalLogs of them above debug level,
// then says once that it stops, so a broken peer cannot flood the log.
func (sc *serverConn) refuse(id uint32, t Type, code, msg string, chunk *int) {
	lvl := refusalLevel(code)
	var n int64
	if lvl > zerolog.DebugLevel {
		n = sc.refusals.Add(1)
	}
	switch {
	case n <= maxRefusalLogs:
		ev := sc.log.WithLevel(lvl).Str("event", "peer_request_refused").Str("request", t.String()).
			Uint32("id", id).Str("code", code)
		if chunk != nil {
			ev = ev.Int("chunk", *chunk)
		}
		ev.Msg(msg)
	case n == maxRefusalLogs+1:
		sc.log.Warn().Str("event", "peer_refusals_unlogged").
			Msgf("refused %d requests of this connection; further refusals on it are answered but not logged", maxRefusalLogs)
	}
	sc.c.writeError(id, code, msg, chunk)
}

// refusalLevel: a request no correct agent sends is a warning; one that
// races a release or a busy moment is not.
func refusalLevel(code string) zerolog.Level {
	switch code {
	case CodeBusy, CodeCancelled:
		return zerolog.DebugLevel
	case CodeNotFound, CodeCorrupt, CodeMismatch, CodeUnknownType:
		return zerolog.InfoLevel
	}
	return zerolog.WarnLevel
}

func (s *Server) serve(c *conn) { s.serveCounted(c, func() {}) }

// serveCounted is serve, calling shaken when the handshake ended, either
// way (the accept loop's unauthenticated count).
func (s *Server) serveCounted(c *conn, shaken func()) {
	remote := c.nc.RemoteAddr().String()
	node, role, err := acceptHandshake(&s.cfg, c, s.shakes)
	shaken()
	if err != nil {
		// A flood of strangers must not flood the log as well: the first
		// refusals are logged one by one, then one a second at most.
		n := s.stats.Refused.Add(1)
		if n <= maxRefusalLogs || s.refusedLog.allow(time.Second) {
			s.log.Warn().Str("event", logevent.PeerRefused).Str("remote", remote).Uint64("refused", n).Err(err).Msg("refused a peer connection")
		}
		c.close(err)
		return
	}
	s.serveConn(c, node, role)
}

// serveConn serves an authenticated connection until it ends.
func (s *Server) serveConn(c *conn, node, role string) {
	remote := c.nc.RemoteAddr().String()
	s.stats.Accepted.Add(1)
	sc := &serverConn{s: s, c: c, node: node, role: role, strs: map[uint32]*sendStream{}, calls: make(chan struct{}, maxCalls),
		log: s.log.With().Str("remote", remote).Str("peer_node", node).Str("peer_role", role).Logger()}
	sc.log.Debug().Msg("peer connection authenticated")
	go c.heartbeat(s.cfg.Heartbeat)
	err := sc.readLoop()
	c.close(err)
	sc.mu.Lock()
	for _, st := range sc.strs {
		st.cancel()
	}
	sc.mu.Unlock()
	sc.wg.Wait()
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		sc.log.Warn().Str("event", "peer_conn_ended").Err(err).Msg("peer connection ended")
	}
}

// readLoop dispatches frames until the connection fails. It never blocks
// on a stream: requests run on their own goroutines, credits and cancels
// are a map lookup.
func (sc *serverConn) readLoop() error {
	c := sc.c
	for {
		h, err := c.readHeader()
		if err != nil {
			if frameErr(err) && !c.isClosed() { // not for I/O errors: nobody would read it
				sc.refuse(0, h.Type, frameCode(err), err.Error(), nil)
			}
			return err
		}
		switch h.Type {
		case TPing:
			err = c.discard(h.Length)
		case TCredit, TCancel:
			err = sc.control(h)
		case TError: // the dialer's last word, e.g. it refused our credential
			err = sc.dialerError(h)
		case TWatermarks, TManifest, TFetch, TReplicate, TStatus:
			err = sc.dataRequest(h)
		case TBeat, TProbe, TFailure:
			err = sc.detectRequest(h)
		default:
			if err = c.discard(h.Length); err == nil {
				sc.refuse(h.ID, h.Type, CodeUnknownType, fmt.Sprintf("a listener does not take %s frames", h.Type), nil)
			}
		}
		if err != nil {
			return err
		}
	}
}

// control applies a credit or a cancel to its stream (one that ended
// already is ignored).
func (sc *serverConn) control(h Header) error {
	if err := sc.c.discard(h.Length); err != nil {
		return err
	}
	sc.mu.Lock()
	st := sc.strs[h.ID]
	sc.mu.Unlock()
	switch {
	case st == nil: // the stream ended already
	case h.Type == TCredit:
		st.credit(int64(min(h.Arg, 1<<62)))
	default:
		st.cancel()
	}
	return nil
}

// dialerError reads the dialer's error frame, which ends the connection.
func (sc *serverConn) dialerError(h Header) error {
	f, err := sc.c.readPayload(h)
	if err != nil {
		return err
	}
	e := &Error{}
	if err := unmarshal(f, e); err != nil {
		return err
	}
	return fmt.Errorf("dialer closed the connection: %w", e)
}

// dataRequest takes a request for snapshot data or status: refused (and
// the connection closed) on a status tool's connection unless it asks
// for status; a fetch starts its stream, the others run as calls.
func (sc *serverConn) dataRequest(h Header) error {
	if sc.role == RoleStatus && h.Type != TStatus {
		// A status tool reads no snapshot data: refuse and close.
		msg := fmt.Sprintf("a %q connection may ask for status only, not %s", RoleStatus, h.Type)
		sc.refuse(h.ID, h.Type, CodeForbidden, msg, nil)
		return fmt.Errorf("%w: %s", ErrAuth, msg)
	}
	f, err := sc.c.readPayload(h)
	if err != nil {
		sc.refuse(h.ID, h.Type, CodeMalformed, err.Error(), nil)
		return err
	}
	switch {
	case h.ID == 0:
		sc.refuse(0, h.Type, CodeInvalid, fmt.Sprintf("%s request with id 0 (0 is the connection's)", h.Type), nil)
	case h.Type == TFetch:
		sc.request(f) // quick: the stream runs on its own goroutine
	default:
		sc.call(f, sc.request)
	}
	return nil
}

// detectRequest takes a failure detector's request (beat, probe,
// failure) to its handler, on a goroutine of its own; a status tool may
// not take part in (or forge) detection.
func (sc *serverConn) detectRequest(h Header) error {
	if sc.role == RoleStatus {
		msg := fmt.Sprintf("a %q connection may ask for status only, not %s", RoleStatus, h.Type)
		sc.refuse(h.ID, h.Type, CodeForbidden, msg, nil)
		return fmt.Errorf("%w: %s", ErrAuth, msg)
	}
	hd := sc.s.handler(h.Type)
	if hd == nil {
		if err := sc.c.discard(h.Length); err != nil {
			return err
		}
		sc.refuse(h.ID, h.Type, CodeUnknownType, fmt.Sprintf("this agent serves no %s requests (failure detection off)", h.Type), nil)
		return nil
	}
	f, err := sc.c.readPayload(h)
	if err != nil {
		sc.refuse(h.ID, h.Type, CodeMalformed, err.Error(), nil)
		return err
	}
	// A handler may call other agents: never block the reader.
	sc.call(f, func(f Frame) { sc.handle(hd, f) })
	return nil
}

// call answers control request f with serve on a goroutine of its own,
// or busy when maxCalls are in progress on this connection.
func (sc *serverConn) call(f Frame, serve func(Frame)) bool {
	select {
	case sc.calls <- struct{}{}:
	default:
		sc.refuse(f.ID, f.Type, CodeBusy, fmt.Sprintf("%d requests of this connection are in progress; read their replies before sending more", maxCalls), nil)
		return false
	}
	sc.wg.Add(1)
	go func() {
		defer sc.wg.Done()
		defer func() { <-sc.calls }()
		serve(f)
	}()
	return true
}

func (sc *serverConn) request(f Frame) {
	c := sc.c
	switch f.Type {
	case TWatermarks:
		var req WatermarksRequest
		if err := unmarshal(f, &req); err != nil {
			sc.refuse(f.ID, f.Type, CodeMalformed, err.Error(), nil)
			return
		}
		rep := &WatermarksReply{Node: sc.s.cfg.Node, Generations: sc.s.src.Watermarks(req.Ranks)}
		if hs, ok := sc.s.src.(HostedSource); ok {
			rep.Hosted = hs.Hosted(req.Ranks)
		}
		c.writeMsg(TWatermarksReply, f.ID, rep)
	case TManifest:
		sc.manifest(f)
	case TFetch:
		var req FetchRequest
		if err := unmarshal(f, &req); err != nil {
			sc.refuse(f.ID, f.Type, CodeMalformed, err.Error(), nil)
			return
		}
		if err := req.check(); err != nil {
			sc.refuse(f.ID, f.Type, CodeInvalid, err.Error(), nil)
			return
		}
		sc.startFetch(f.ID, req)
	case TReplicate:
		sc.replicate(f)
	case TStatus:
		if sc.s.cfg.Status == nil {
			sc.refuse(f.ID, f.Type, CodeNotFound, sc.s.cfg.Node+" serves no status", nil)
			return
		}
		if err := c.writeMsg(TStatusReply, f.ID, sc.s.cfg.Status()); err != nil && !c.isClosed() {
			sc.refuse(f.ID, f.Type, CodeInternal, err.Error(), nil)
		}
	}
}

// manifest answers a manifest request with the generation's info.
func (sc *serverConn) manifest(f Frame) {
	var k GenKey
	if err := unmarshal(f, &k); err != nil {
		sc.refuse(f.ID, f.Type, CodeMalformed, err.Error(), nil)
		return
	}
	g, err := sc.s.src.Open(k)
	if err != nil {
		sc.refuse(f.ID, f.Type, codeOf(err), err.Error(), nil)
		return
	}
	info := g.Info()
	g.Close()
	if err := sc.c.writeMsg(TManifestReply, f.ID, info); err != nil && !sc.c.isClosed() {
		sc.refuse(f.ID, f.Type, CodeInternal, err.Error(), nil)
	}
}

// replicate hands a replicate request to the Replicate handler.
func (sc *serverConn) replicate(f Frame) {
	var req ReplicateRequest
	if err := unmarshal(f, &req); err != nil {
		sc.refuse(f.ID, f.Type, CodeMalformed, err.Error(), nil)
		return
	}
	if sc.s.cfg.Replicate == nil {
		sc.refuse(f.ID, f.Type, CodeUnknownType, "this agent keeps no replicas (no replicate handler)", nil)
		return
	}
	if err := sc.s.cfg.Replicate(sc.node, req); err != nil {
		sc.refuse(f.ID, f.Type, CodeInvalid, err.Error(), nil)
		return
	}
	sc.c.writeMsg(TReplicateReply, f.ID, &ReplicateReply{})
}

// handle runs a registered handler and sends its reply.
func (sc *serverConn) handle(hd Handler, f Frame) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // the connection's end cancels the handler
		select {
		case <-sc.c.closed:
			cancel()
		case <-ctx.Done():
		}
	}()
	resp, err := hd(ctx, sc.node, f.Payload)
	if err != nil {
		var e *Error
		if !errors.As(err, &e) {
			e = &Error{Code: CodeInternal, Message: err.Error()}
		}
		sc.c.writeError(f.ID, e.Code, e.Message, nil)
		return
	}
	if err := sc.c.writeMsg(f.Type|ReplyBit, f.ID, resp); err != nil && !sc.c.isClosed() {
		sc.c.writeError(f.ID, CodeInternal, err.Error(), nil)
	}
}

// sendStream is one fetch being streamed.
type sendStream struct {
	id      uint32
	req     FetchRequest
	ctx     context.Context
	cancel  context.CancelFunc
	mu      sync.Mutex
	unacked int64
	more    chan struct{} // signalled on credit
}

func (st *sendStream) credit(n int64) {
	st.mu.Lock()
	st.unacked = max(0, st.unacked-n)
	st.mu.Unlock()
	select {
	case st.more <- struct{}{}:
	default:
	}
}

// acquire waits until n more bytes fit the window; a chunk always goes
// when nothing is in flight, so a window below the chunk size still moves.
func (st *sendStream) acquire(n int64) error {
	for {
		st.mu.Lock()
		if st.unacked == 0 || st.unacked+n <= st.req.Window {
			st.unacked += n
			st.mu.Unlock()
			return nil
		}
		st.mu.Unlock()
		select {
		case <-st.more:
		case <-st.ctx.Done():
			return st.ctx.Err()
		}
	}
}

func (sc *serverConn) startFetch(id uint32, req FetchRequest) {
	s := sc.s
	select {
	case s.streams <- struct{}{}:
	default:
		s.stats.Busy.Add(1)
		sc.refuse(id, TFetch, CodeBusy, fmt.Sprintf("%s is streaming %d fetches already; retry later or from another copy", s.cfg.Node, s.cfg.MaxStreams), nil)
		return
	}
	if req.Window <= 0 {
		req.Window = s.cfg.Window
	}
	ctx, cancel := context.WithCancel(context.Background())
	st := &sendStream{id: id, req: req, ctx: ctx, cancel: cancel, more: make(chan struct{}, 1)}
	sc.mu.Lock()
	if sc.strs[id] != nil {
		sc.mu.Unlock()
		<-s.streams
		cancel()
		sc.refuse(id, TFetch, CodeInvalid, fmt.Sprintf("request id %d is already streaming", id), nil)
		return
	}
	sc.strs[id] = st
	sc.wg.Add(1)
	sc.mu.Unlock()
	s.stats.Streams.Add(1)
	go func() {
		defer sc.wg.Done()
		defer func() {
			sc.mu.Lock()
			delete(sc.strs, id)
			sc.mu.Unlock()
			cancel()
			<-s.streams
		}()
		sc.stream(st)
	}()
}

// fetchRefusal says why req cannot be served from the generation info
// describes (code "" when it can): no such buffer, another chunk or
// buffer size than the request expects, or chunks past the buffer's end.
func fetchRefusal(req FetchRequest, info *GenInfo) (code, msg string) {
	b := info.Buffer(req.Buffer)
	switch {
	case b == nil:
		return CodeNotFound, fmt.Sprintf("%s has no buffer %q", req.GenKey, req.Buffer)
	case req.ChunkSize != 0 && req.ChunkSize != info.ChunkSize:
		return CodeMismatch, fmt.Sprintf("%s: chunk size here is %d, the request expects %d", req.ChunkKey, info.ChunkSize, req.ChunkSize)
	case req.Size != 0 && req.Size != b.Size:
		return CodeMismatch, fmt.Sprintf("%s: buffer size here is %d, the request expects %d", req.ChunkKey, b.Size, req.Size)
	case info.ChunkSize <= 0 || info.ChunkSize > MaxPayload:
		return CodeInternal, fmt.Sprintf("%s: chunk size %d outside (0, %d]", req.ChunkKey, info.ChunkSize, MaxPayload)
	}
	// req.check made First >= 0 and Count >= 1, so n-Count cannot
	// overflow and First+Count, once inside n, cannot either.
	if n := len(b.CRC32C); req.First > n-req.Count {
		return CodeInvalid, fmt.Sprintf("%s: %d chunks from chunk %d run past the buffer's %d chunks", req.ChunkKey, req.Count, req.First, n)
	}
	return "", ""
}

// stream sends the chunks of one fetch. Errors before the first chunk
// concern the whole request; a chunk that cannot be read ends the stream
// with an error naming it, so the dialer can take that chunk elsewhere and
// ask again for the rest.
func (sc *serverConn) stream(st *sendStream) {
	s, c, req := sc.s, sc.c, st.req
	fail := func(code string, chunk *int, format string, a ...any) {
		sc.refuse(st.id, TFetch, code, fmt.Sprintf(format, a...), chunk)
	}
	g, err := s.src.Open(req.GenKey)
	if err != nil {
		fail(codeOf(err), nil, "%v", err)
		return
	}
	defer g.Close()
	if code, msg := fetchRefusal(req, g.Info()); code != "" {
		fail(code, nil, "%s", msg)
		return
	}
	for i := req.First; i < req.First+req.Count; i++ {
		data, crc, err := g.Chunk(req.Buffer, i)
		if err != nil {
			fail(codeOf(err), &i, "%s chunk %d: %v", req.ChunkKey, i, err)
			return
		}
		if err := st.acquire(int64(len(data))); err != nil {
			return // cancelled, or the connection is gone
		}
		if req.Background {
			if err := s.cfg.Background.Wait(st.ctx, netsched.Outbound, int64(len(data))); err != nil {
				return
			}
		}
		if err := c.writeChunk(st.id, i, data, crc); err != nil {
			return
		}
		if req.Background {
			if rate, ok := c.rate.sample(c.nc); ok {
				s.cfg.Background.Sent(int64(len(data)), time.Duration(float64(len(data))/rate*float64(time.Second)))
			}
		}
		s.stats.ChunksSent.Add(1)
		s.stats.BytesSent.Add(uint64(len(data)))
	}
}
