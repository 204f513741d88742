package peer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/reft-hpc/reft/internal/crc32c"
)

// Wire constants (docs/PEER_PROTOCOL.md).
const (
	// Magic opens every frame: "RFTP". A stream that does not start with it
	// is not ours (a port scanner, a wrong service), and a frame that lost
	// it means the stream lost its boundaries.
	Magic uint32 = 0x52465450
	// Version is the protocol version this package speaks.
	Version = 1
	// HeaderSize is the fixed header's size.
	HeaderSize = 32
	// MaxControl bounds the JSON payload of every frame but chunk frames.
	MaxControl = 1 << 20
	// MaxPayload bounds any payload, so also the chunk size a peer may
	// serve. tmpfs chunks are 4 MiB by default.
	MaxPayload = 64 << 20
	// MaxHandshake bounds the payload of every frame before the peer is
	// authenticated (hello, challenge, auth, auth reply, error): a token
	// is at most MaxToken bytes, base64 in JSON. A stranger can make a
	// listener hold no more than this per connection.
	MaxHandshake = 32 << 10
)

// Type is a frame type. A reply has the request's type with bit 0x80 set,
// as in the local protocol.
type Type uint8

// Frame types.
const (
	THello      Type = 0x01 // dialer -> listener: job, method, dialer nonce
	TAuth       Type = 0x02 // dialer -> listener: sealed binding
	TPing       Type = 0x03 // either way: liveness, no reply
	TWatermarks Type = 0x04 // committed generations of some ranks
	TManifest   Type = 0x05 // one generation's chunk size, buffers, checksums
	TFetch      Type = 0x06 // stream a chunk range
	TCredit     Type = 0x07 // dialer -> listener: arg bytes of window freed
	TCancel     Type = 0x08 // dialer -> listener: stop streaming request id
	TReplicate  Type = 0x09 // dialer -> listener: a generation to copy in the background
	// Failure detection (agent/detect), served by handlers the agent
	// registers with Server.Handle.
	TBeat    Type = 0x10 // heartbeat to a watched peer; the reply proves it alive
	TProbe   Type = 0x11 // ask an agent whether it reaches a suspected node
	TFailure Type = 0x12 // a confirmed failure: a report to the coordinator, or its publication
	// TStatus asks for the agent's status (its local status reply).
	TStatus Type = 0x13

	ReplyBit         Type = 0x80
	TChallenge            = THello | ReplyBit // listener nonce
	TAuthReply            = TAuth | ReplyBit  // listener's sealed binding
	TWatermarksReply      = TWatermarks | ReplyBit
	TManifestReply        = TManifest | ReplyBit
	TReplicateReply       = TReplicate | ReplyBit
	TChunk                = TFetch | ReplyBit // arg: chunk index; payload: chunk bytes
	TStatusReply          = TStatus | ReplyBit
	TBeatReply            = TBeat | ReplyBit
	TProbeReply           = TProbe | ReplyBit
	TFailureReply         = TFailure | ReplyBit
	TError           Type = 0xFF
)

// typeNames names every type of this version, by its byte; a type
// without a name is unknown (known). An array: known runs for every
// frame.
var typeNames = [256]string{
	THello:           "hello",
	TAuth:            "auth",
	TPing:            "ping",
	TWatermarks:      "watermarks",
	TManifest:        "manifest",
	TFetch:           "fetch",
	TCredit:          "credit",
	TCancel:          "cancel",
	TReplicate:       "replicate",
	TReplicateReply:  "replicate-reply",
	TChallenge:       "challenge",
	TAuthReply:       "auth-reply",
	TWatermarksReply: "watermarks-reply",
	TManifestReply:   "manifest-reply",
	TChunk:           "chunk",
	TStatus:          "status",
	TStatusReply:     "status-reply",
	TBeat:            "beat",
	TProbe:           "probe",
	TFailure:         "failure",
	TBeatReply:       "beat-reply",
	TProbeReply:      "probe-reply",
	TFailureReply:    "failure-reply",
	TError:           "error",
}

func (t Type) String() string {
	if n := typeNames[t]; n != "" {
		return n
	}
	return fmt.Sprintf("type-0x%02x", uint8(t))
}

// Handled reports whether t is a request type served by a Handler
// registered with Server.Handle, not by the store.
func (t Type) Handled() bool { return t == TBeat || t == TProbe || t == TFailure }

// known reports whether t is a type of this version.
func (t Type) known() bool { return typeNames[t] != "" }

// Header is a frame header. Layout (big endian):
//
//	0  4 magic        "RFTP"
//	4  1 version      1
//	5  1 type
//	6  2 flags        reserved, 0
//	8  4 id           request id (0: the connection itself)
//	12 4 length       payload bytes
//	16 8 arg          type-specific: chunk index, credit bytes
//	24 4 payload CRC  CRC-32C of the payload; for chunks, the CRC as stored
//	28 4 header CRC   CRC-32C of bytes 0..27
type Header struct {
	Version uint8
	Type    Type
	Flags   uint16
	ID      uint32
	Length  uint32
	Arg     uint64
	CRC     uint32 // payload CRC-32C
}

// Decoding errors. Every error from ParseHeader and Decode wraps one of
// these, io.EOF or io.ErrUnexpectedEOF.
var (
	ErrMagic     = errors.New("bad magic (not a reft peer stream, or the stream lost its frame boundaries)")
	ErrHeaderCRC = errors.New("header checksum mismatch")
	ErrVersion   = errors.New("unsupported peer protocol version")
	ErrFlags     = errors.New("reserved flags are not zero")
	ErrTooLarge  = errors.New("frame too large")
	ErrPayload   = errors.New("payload checksum mismatch")
)

// frameErr reports whether err is a bad frame (as opposed to I/O).
func frameErr(err error) bool {
	for _, e := range []error{ErrMagic, ErrHeaderCRC, ErrVersion, ErrFlags, ErrTooLarge, ErrPayload} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// frameCode is the error code that answers a bad frame.
func frameCode(err error) string {
	if errors.Is(err, ErrVersion) {
		return CodeVersion
	}
	return CodeMalformed
}

// maxLength is the largest payload a frame of type t may carry.
func maxLength(t Type) uint32 {
	if t == TChunk {
		return MaxPayload
	}
	return MaxControl
}

// Put encodes h into b[:HeaderSize], header CRC included.
func (h Header) Put(b []byte) {
	_ = b[HeaderSize-1]
	binary.BigEndian.PutUint32(b[0:4], Magic)
	b[4] = h.Version
	b[5] = byte(h.Type)
	binary.BigEndian.PutUint16(b[6:8], h.Flags)
	binary.BigEndian.PutUint32(b[8:12], h.ID)
	binary.BigEndian.PutUint32(b[12:16], h.Length)
	binary.BigEndian.PutUint64(b[16:24], h.Arg)
	binary.BigEndian.PutUint32(b[24:28], h.CRC)
	binary.BigEndian.PutUint32(b[28:32], crc32c.Checksum(b[:28]))
}

// ParseHeader decodes and checks a header. Every field is checked before
// anything trusts it: magic, header CRC, version, flags, and the length
// against the bound of the frame's type. Any error here is fatal for the
// stream: the frame boundary cannot be trusted.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, fmt.Errorf("%w: header of %d bytes", io.ErrUnexpectedEOF, len(b))
	}
	if m := binary.BigEndian.Uint32(b[0:4]); m != Magic {
		return Header{}, fmt.Errorf("%w: got 0x%08x", ErrMagic, m)
	}
	if want, got := binary.BigEndian.Uint32(b[28:32]), crc32c.Checksum(b[:28]); want != got {
		return Header{}, fmt.Errorf("%w: recorded 0x%08x, computed 0x%08x", ErrHeaderCRC, want, got)
	}
	h := Header{
		Version: b[4],
		Type:    Type(b[5]),
		Flags:   binary.BigEndian.Uint16(b[6:8]),
		ID:      binary.BigEndian.Uint32(b[8:12]),
		Length:  binary.BigEndian.Uint32(b[12:16]),
		Arg:     binary.BigEndian.Uint64(b[16:24]),
		CRC:     binary.BigEndian.Uint32(b[24:28]),
	}
	if h.Version != Version {
		return h, fmt.Errorf("%w %d (this agent speaks %d)", ErrVersion, h.Version, Version)
	}
	if h.Flags != 0 {
		return h, fmt.Errorf("%w: 0x%04x", ErrFlags, h.Flags)
	}
	if m := maxLength(h.Type); h.Length > m {
		return h, fmt.Errorf("%w: %s payload of %d bytes > %d", ErrTooLarge, h.Type, h.Length, m)
	}
	return h, nil
}

// Frame is a decoded frame with its payload.
type Frame struct {
	Header
	Payload []byte
}

// Decode reads one whole frame and verifies both checksums. It allocates
// the payload only after the header has been checked, so a hostile length
// costs nothing. Bulk receivers read chunk payloads themselves (readChunk)
// to land them in place; Decode is for control frames and for tests.
func Decode(r io.Reader) (Frame, error) {
	var hb [HeaderSize]byte
	if _, err := io.ReadFull(r, hb[:]); err != nil {
		return Frame{}, err
	}
	h, err := ParseHeader(hb[:])
	if err != nil {
		return Frame{Header: h}, err
	}
	f := Frame{Header: h, Payload: make([]byte, h.Length)}
	if _, err := io.ReadFull(r, f.Payload); err != nil {
		return f, noEOF(err)
	}
	if got := crc32c.Checksum(f.Payload); got != h.CRC {
		return f, fmt.Errorf("%w: %s frame id %d: recorded 0x%08x, computed 0x%08x", ErrPayload, h.Type, h.ID, h.CRC, got)
	}
	return f, nil
}

func noEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// AppendFrame encodes a frame of type t with payload p onto b.
func AppendFrame(b []byte, t Type, id uint32, arg uint64, p []byte) ([]byte, error) {
	if uint64(len(p)) > uint64(maxLength(t)) {
		return b, fmt.Errorf("%w: %s payload of %d bytes > %d", ErrTooLarge, t, len(p), maxLength(t))
	}
	var hb [HeaderSize]byte
	Header{Version: Version, Type: t, ID: id, Length: uint32(len(p)), Arg: arg, CRC: crc32c.Checksum(p)}.Put(hb[:])
	b = append(b, hb[:]...)
	return append(b, p...), nil
}
