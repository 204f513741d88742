package peer

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/reft-hpc/reft/internal/crc32c"
)

// readBuf is the read buffer of a connection that receives chunks.
// Payloads of a chunk frame larger than it bypass it (bufio reads straight
// into the destination once it is drained), so bulk bytes are copied by
// the kernel only.
const readBuf = 64 << 10

// handshakeBuf is the read buffer of every connection until it receives
// its first chunk frame: strangers hold little memory each, and so do the
// job's many connections that only ever carry control frames (a
// listener's never receives a chunk; a dialer's to a peer outside its
// sharding group mostly beats, probes and asks for watermarks). An agent
// keeps a connection to every other agent (agent/mesh), so this is paid
// twice per node of the job (docs/SCALE.md).
const handshakeBuf = 4 << 10

// crcPiece is the step of the fused read+checksum: the piece just read is
// still in L2 when it is checksummed, so the data crosses memory once.
const crcPiece = 256 << 10

// conn is one authenticated (or authenticating) TCP connection: framed
// reads with a liveness deadline, serialized writes with a write deadline,
// and a heartbeat so that a silent peer is noticed within timeout.
type conn struct {
	frameReader

	wmu       sync.Mutex
	lastWrite atomic.Int64 // unix nanoseconds
	// rate samples the link's rate after background chunks.
	rate rateMeter

	once   sync.Once
	closed chan struct{}
	err    error // why it closed; read after closed is closed
}

// frameReader is a connection's reading side: the frames and payloads
// as they arrive, with liveness deadlines. Only the connection's one
// reading goroutine (the handshake's, then its read loop) calls its
// methods and touches br; other goroutines read the atomics only
// (lastData, by the client's stall check; bulkBuf, by tests). nc, timeout
// and ctr are the connection's, shared with the writing side, and set
// once by newConn.
type frameReader struct {
	nc      net.Conn
	br      *bufio.Reader
	dr      *deadlineReader
	timeout time.Duration
	ctr     *Counters   // nil: not counted
	bulkBuf atomic.Bool // br has the large buffer (growReadBuf); read by tests
	// lastData is when chunk bytes last arrived (unix nanoseconds): a
	// connection busy with other streams' chunks excuses a quiet one.
	lastData atomic.Int64
}

// newConn wraps nc, counted in ctr (nil: not counted) until close.
func newConn(nc net.Conn, timeout time.Duration, ctr *Counters) *conn {
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true) // control frames are small and latency-bound
	}
	dr := &deadlineReader{nc: nc}
	ctr.connOpened()
	return &conn{frameReader: frameReader{nc: nc, dr: dr, br: bufio.NewReaderSize(dr, handshakeBuf), timeout: timeout, ctr: ctr},
		closed: make(chan struct{})}
}

// deadlineReader pushes the read deadline forward whenever bytes flow, at
// most every quarter timeout (setting a deadline costs a timer update), so
// a read fails between 3/4 and 1 timeout after the peer went silent.
type deadlineReader struct {
	nc      net.Conn
	timeout time.Duration // 0: no deadline (during the handshake, which sets its own)
	last    time.Time
}

func (d *deadlineReader) Read(p []byte) (int, error) {
	if d.timeout > 0 {
		if now := time.Now(); now.Sub(d.last) > d.timeout/4 {
			d.nc.SetReadDeadline(now.Add(d.timeout))
			d.last = now
		}
	}
	return d.nc.Read(p)
}

// eagerBulk gives every connection the large buffer at authentication,
// as before it waited for a chunk: BenchmarkIdleConns' baseline. Set only
// by that benchmark, before any connection exists.
var eagerBulk bool

// live switches from the handshake's fixed deadline to liveness deadlines.
func (c *conn) live() {
	c.nc.SetDeadline(time.Time{})
	c.dr.timeout = c.timeout
	c.dr.last = time.Time{}
	if eagerBulk {
		growReadBuf(&c.frameReader)
	}
}

// growReadBuf gives c the large read buffer, once: readHeader does at the
// first chunk frame, before the payload is read. Wrapping keeps whatever
// the small one buffered; reads larger than the small buffer pass through
// it unbuffered, so the data is not copied twice. Only the connection's
// one reading goroutine may call it.
func growReadBuf(r *frameReader) {
	if !r.bulkBuf.Load() {
		r.br = bufio.NewReaderSize(r.br, readBuf)
		r.bulkBuf.Store(true)
	}
}

// close closes the connection once, remembering the first reason.
func (c *conn) close(err error) {
	c.once.Do(func() {
		if err == nil {
			err = net.ErrClosed
		}
		c.err = err
		c.nc.Close()
		c.ctr.connClosed()
		close(c.closed)
	})
}

func (c *conn) isClosed() bool {
	select {
	case <-c.closed:
		return true
	default:
		return false
	}
}

// cause is why the connection closed (nil while open).
func (c *conn) cause() error {
	if c.isClosed() {
		return c.err
	}
	return nil
}

func (r *frameReader) readHeader() (Header, error) {
	var hb [HeaderSize]byte
	if _, err := io.ReadFull(r.br, hb[:]); err != nil {
		return Header{}, r.readErr(err)
	}
	h, err := ParseHeader(hb[:])
	if err == nil {
		r.ctr.recvFrame(h)
		if h.Type == TChunk {
			growReadBuf(r)
		}
	}
	return h, err
}

// readErr names a liveness timeout as what it is.
func (r *frameReader) readErr(err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("%w: nothing received from %s for %s: %v", ErrPeerSilent, r.nc.RemoteAddr(), r.timeout, err)
	}
	return err
}

// readPayload reads a control payload (bounded by ParseHeader) and checks
// its CRC.
func (r *frameReader) readPayload(h Header) (Frame, error) {
	f := Frame{Header: h, Payload: make([]byte, h.Length)}
	if _, err := io.ReadFull(r.br, f.Payload); err != nil {
		return f, r.readErr(noEOF(err))
	}
	if got := crc32c.Checksum(f.Payload); got != h.CRC {
		return f, fmt.Errorf("%w: %s frame id %d: recorded 0x%08x, computed 0x%08x", ErrPayload, h.Type, h.ID, h.CRC, got)
	}
	return f, nil
}

// errUnexpected: a handshake frame of a type the handshake does not take
// at that point.
var errUnexpected = errors.New("unexpected frame type")

// readHandshake reads a frame of the handshake, which must be one of
// want and at most MaxHandshake bytes. Both are checked on the header,
// before any payload is read or allocated, so that a stranger's length
// field costs nothing.
func (r *frameReader) readHandshake(want ...Type) (Frame, error) {
	h, err := r.readHeader()
	if err != nil {
		return Frame{Header: h}, err
	}
	if !slices.Contains(want, h.Type) {
		return Frame{Header: h}, fmt.Errorf("%w: %s", errUnexpected, h.Type)
	}
	if h.Length > MaxHandshake {
		return Frame{Header: h}, fmt.Errorf("%w: %s payload of %d bytes before authentication > %d", ErrTooLarge, h.Type, h.Length, MaxHandshake)
	}
	return r.readPayload(h)
}

// discard skips a payload nobody wants (a ping's, a frame refused).
func (r *frameReader) discard(n uint32) error {
	_, err := r.br.Discard(int(n))
	return r.readErr(noEOF(err))
}

// skipChunk skips the payload of a chunk nobody wants (a cancelled
// stream's), piece by piece as it arrives.
func (r *frameReader) skipChunk(n uint32) error {
	for left := int(n); left > 0; {
		k, err := r.br.Discard(min(left, crcPiece))
		r.lastData.Store(time.Now().UnixNano())
		if err != nil {
			return r.readErr(noEOF(err))
		}
		left -= k
	}
	return nil
}

// readInto reads len(dst) payload bytes into dst and returns their CRC-32C,
// computed piece by piece right after each piece lands.
func (r *frameReader) readInto(dst []byte) (uint32, error) {
	var crc uint32
	for off := 0; off < len(dst); {
		end := min(off+crcPiece, len(dst))
		if _, err := io.ReadFull(r.br, dst[off:end]); err != nil {
			return 0, r.readErr(noEOF(err))
		}
		r.lastData.Store(time.Now().UnixNano())
		crc = crc32c.Update(crc, dst[off:end])
		off = end
	}
	return crc, nil
}

// writeTimeout allows the timeout plus the payload at 16 MiB/s, so a big
// chunk on a slow link is not mistaken for a dead peer.
func (c *conn) writeTimeout(n int) time.Duration {
	return c.timeout + time.Duration(n)*time.Second/(16<<20)
}

// write sends one frame: header and payload in one writev, under the
// write lock so frames of concurrent streams never interleave.
func (c *conn) write(t Type, id uint32, arg uint64, crc uint32, p []byte) error {
	var hb [HeaderSize]byte
	Header{Version: Version, Type: t, ID: id, Length: uint32(len(p)), Arg: arg, CRC: crc}.Put(hb[:])
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.timeout > 0 {
		c.nc.SetWriteDeadline(time.Now().Add(c.writeTimeout(len(p))))
	}
	var err error
	if len(p) == 0 {
		_, err = c.nc.Write(hb[:])
	} else {
		bufs := net.Buffers{hb[:], p}
		_, err = bufs.WriteTo(c.nc)
	}
	c.lastWrite.Store(time.Now().UnixNano())
	if err == nil {
		c.ctr.sentFrame(t, len(p))
	}
	if err != nil {
		err = fmt.Errorf("writing %s frame to %s: %w", t, c.nc.RemoteAddr(), err)
		c.close(err)
	}
	return err
}

// writeMsg sends a control frame with v as its JSON payload.
func (c *conn) writeMsg(t Type, id uint32, v any) error {
	p, err := marshal(v)
	if err != nil {
		return fmt.Errorf("encoding %s payload: %w", t, err)
	}
	if len(p) > MaxControl {
		return fmt.Errorf("%w: %s payload of %d bytes > %d", ErrTooLarge, t, len(p), MaxControl)
	}
	return c.write(t, id, 0, crc32c.Checksum(p), p)
}

// writeChunk sends chunk idx of a fetch. The frame's payload CRC is the
// CRC recorded when the chunk was stored, not one computed now: the
// receiver's check then covers the bytes at rest as well as the wire.
func (c *conn) writeChunk(id uint32, idx int, data []byte, stored uint32) error {
	return c.write(TChunk, id, uint64(idx), stored, data)
}

func (c *conn) writeError(id uint32, code, msg string, chunk *int) error {
	return c.writeMsg(TError, id, &Error{Code: code, Message: msg, Chunk: chunk})
}

// heartbeat pings every interval when nothing else was written, until the
// connection closes. A writer busy with a chunk is liveness enough, so a
// held lock skips the beat.
func (c *conn) heartbeat(interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-c.closed:
			return
		case <-t.C:
		}
		if time.Since(time.Unix(0, c.lastWrite.Load())) < interval {
			continue
		}
		if !c.wmu.TryLock() {
			continue
		}
		c.wmu.Unlock()
		c.write(TPing, 0, 0, crc32c.Checksum(nil), nil)
	}
}

// ErrPeerSilent: a connection received nothing, not even a heartbeat, for
// the configured timeout; the peer or the network is gone.
var ErrPeerSilent = errors.New("peer silent")
