package peer

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Hello opens a connection (dialer -> listener). Nothing in it is trusted
// before the auth exchange; the job is compared early only to turn a
// misconfiguration into a clear error.
type Hello struct {
	Protocol int    `json:"protocol"`
	Job      string `json:"job"`
	Method   string `json:"method"` // "munge" or "secret"
	Nonce    []byte `json:"nonce"`  // 32 random bytes (base64 in JSON)
	Node     string `json:"node,omitempty"`
}

// Challenge answers Hello (listener -> dialer) with the listener's nonce.
type Challenge struct {
	Protocol int    `json:"protocol"`
	Method   string `json:"method"`
	Nonce    []byte `json:"nonce"`
	Node     string `json:"node,omitempty"`
}

// AuthMsg carries a sealed Binding (TAuth and TAuthReply).
type AuthMsg struct {
	Token []byte `json:"token"`
}

// Binding is what each side seals with its Authenticator. Both nonces bind
// the token to this one connection, and Dir stops a listener's token from
// being reflected back as a dialer's.
type Binding struct {
	Proto       string `json:"proto"` // "reft-peer/1"
	Dir         string `json:"dir"`   // "dialer" or "listener"
	Job         string `json:"job"`
	UID         int    `json:"uid"`
	DialerNonce []byte `json:"dn"`
	ListenNonce []byte `json:"ln"`
	Node        string `json:"node,omitempty"`
	// Role is the dialer's: "" for an agent of the job, RoleStatus for a
	// tool of the job's user that may only ask for status. It is sealed,
	// so a status tool cannot pass for an agent.
	Role string `json:"role,omitempty"`
}

// RoleStatus is the role of a dialer that is not an agent but a tool of
// the job's user (`reft status`): its connection answers status and
// nothing else, so it reads no snapshot bytes.
const RoleStatus = "status"

// WatermarksRequest asks for committed generations; no ranks: all.
type WatermarksRequest struct {
	Ranks []int `json:"ranks,omitempty"`
}

// HostedRank is a rank registered with the answering agent now (its rank
// runs on that node), with the ring the agent fixed for the rank's
// sharding group, if it has fixed one.
type HostedRank struct {
	Rank int   `json:"rank"`
	Ring []int `json:"ring,omitempty"`
}

// Watermark is one committed, not corrupt generation a peer can serve.
type Watermark struct {
	Rank  int    `json:"rank"`
	Shard string `json:"shard"`
	Step  int64  `json:"step"`
	Seq   uint64 `json:"seq"`
	Bytes int64  `json:"bytes"`
	// Ring is the sharding group's ring the generation was saved with
	// (its manifest's); absent for unsharded generations.
	Ring []int `json:"ring,omitempty"`
}

// WatermarksReply lists them, newest first per (rank, shard), and which
// of the asked ranks run on the answering node (HostedSource).
type WatermarksReply struct {
	Node        string       `json:"node,omitempty"`
	Generations []Watermark  `json:"generations"`
	Hosted      []HostedRank `json:"hosted,omitempty"`
}

// GenKey names one generation on one peer. Seq is the peer's own commit
// order, learnt from its watermarks: a copy of the same step has another
// seq on every node.
type GenKey struct {
	Rank  int    `json:"rank"`
	Shard string `json:"shard"`
	Step  int64  `json:"step"`
	Seq   uint64 `json:"seq"`
}

func (k GenKey) String() string {
	return fmt.Sprintf("rank %d shard %s step %d seq %d", k.Rank, k.Shard, k.Step, k.Seq)
}

// ChunkKey names one buffer of one generation.
type ChunkKey struct {
	GenKey
	Buffer string `json:"buffer"`
}

func (k ChunkKey) String() string { return k.GenKey.String() + " buffer " + k.Buffer }

// BufferInfo is one buffer of a generation: its size and the CRC-32C of
// every chunk (chunk i covers [i*ChunkSize, min((i+1)*ChunkSize, Size))).
type BufferInfo struct {
	Name   string   `json:"name"`
	Size   int64    `json:"size"`
	CRC32C []uint32 `json:"crc32c"`
}

// GenInfo is a generation's layout (the manifest reply).
type GenInfo struct {
	ChunkSize int64        `json:"chunk_size"`
	Buffers   []BufferInfo `json:"buffers"`
}

// Buffer finds a buffer by name.
func (g *GenInfo) Buffer(name string) *BufferInfo {
	for i := range g.Buffers {
		if g.Buffers[i].Name == name {
			return &g.Buffers[i]
		}
	}
	return nil
}

// FetchRequest asks for chunks [First, First+Count) of a buffer. The
// listener streams one chunk frame per chunk, in order, and keeps at most
// Window payload bytes unacknowledged by credit frames (always at least one
// chunk, so a window below the chunk size still moves).
type FetchRequest struct {
	ChunkKey
	First      int   `json:"first"`
	Count      int   `json:"count"`
	ChunkSize  int64 `json:"chunk_size"` // what the dialer expects; 0: not checked
	Size       int64 `json:"size"`       // the buffer size the dialer expects; 0: not checked
	Window     int64 `json:"window"`
	Background bool  `json:"background,omitempty"` // rate-limited replication traffic
}

// check refuses field values no correct dialer sends, before the
// listener looks anything up; the range is checked against the buffer.
func (r *FetchRequest) check() error {
	switch {
	case r.First < 0:
		return fmt.Errorf("fetch: first chunk %d is negative", r.First)
	case r.Count < 1:
		return fmt.Errorf("fetch: count %d; a fetch asks for at least one chunk", r.Count)
	case r.ChunkSize < 0 || r.ChunkSize > MaxPayload:
		return fmt.Errorf("fetch: chunk_size %d outside [0, %d] (0: not checked)", r.ChunkSize, MaxPayload)
	case r.Size < 0:
		return fmt.Errorf("fetch: size %d is negative (0: not checked)", r.Size)
	case r.Window < 0:
		return fmt.Errorf("fetch: window %d is negative (0: the listener's default)", r.Window)
	}
	return nil
}

// ReplicateRequest tells a placement peer that the dialer's node committed
// a generation whose Sections it should copy in the background (GEMINI
// placement of a rank's unreplicated buffers). The listener only queues it
// and answers at once; the copy is a background Fetch of its own.
type ReplicateRequest struct {
	GenKey
	Sections []string `json:"sections"`
}

// ReplicateReply acknowledges a ReplicateRequest.
type ReplicateReply struct{}

// Error codes of an error frame.
const (
	CodeForbidden   = "forbidden"           // authentication failed; the connection is closed
	CodeVersion     = "unsupported_version" // the other side speaks another version; closed
	CodeMalformed   = "malformed"           // a frame failed its checks; closed
	CodeUnknownType = "unknown_type"        // a type this side does not know
	CodeInvalid     = "invalid"             // a field has a bad value; the message names it
	CodeNotFound    = "not_found"           // no such generation, buffer or chunk here
	CodeCorrupt     = "corrupt"             // the generation is marked bad here
	CodeMismatch    = "mismatch"            // chunk or buffer size differs from the request's
	CodeBusy        = "busy"                // too many streams; retry later or elsewhere
	CodeCancelled   = "cancelled"           // the listener is shutting down
	CodeInternal    = "internal"            // the listener failed to serve a valid request
)

// Error is the payload of an error frame and the error a Client returns
// for one. Chunk is set when the error concerns one chunk of a fetch.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Chunk   *int   `json:"chunk,omitempty"`
}

func (e *Error) Error() string {
	if e.Chunk != nil {
		return fmt.Sprintf("peer error %s (chunk %d): %s", e.Code, *e.Chunk, e.Message)
	}
	return "peer error " + e.Code + ": " + e.Message
}

// Is lets errors.Is(err, &Error{Code: CodeBusy}) match by code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// IsCode reports whether err is (or wraps) an error frame with code.
func IsCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

func marshal(v any) ([]byte, error) {
	if v == nil {
		return nil, nil
	}
	return json.Marshal(v)
}

// unmarshal decodes a control payload strictly enough to catch a
// truncated or non-object payload; unknown fields are ignored so fields
// can be added without a version change.
func unmarshal(f Frame, v any) error {
	if len(f.Payload) == 0 {
		return nil
	}
	if err := json.Unmarshal(f.Payload, v); err != nil {
		return fmt.Errorf("%s payload: %w", f.Type, err)
	}
	return nil
}
