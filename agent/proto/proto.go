// Package proto is the local protocol between a rank (client library) and
// its node's reft-agent, over the agent's Unix socket. docs/PROTOCOL.md is
// the specification; this package is its Go implementation.
//
// A frame is a 12-byte header followed by a JSON payload:
//
//	offset size  field
//	0      4     length   uint32 big endian: bytes after this field (8 + payload)
//	4      1     version  protocol version, 1
//	5      1     type     message type (Type)
//	6      2     flags    reserved, 0
//	8      4     id       request id, echoed by the reply
//	12     n     payload  UTF-8 JSON object (may be empty for requests)
package proto

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Version is the protocol version this package speaks.
const Version = 1

// HeaderSize is the size of the fixed header, length field included.
const HeaderSize = 12

// MaxPayload bounds the payload. Bulk data never travels in frames (it goes
// through shared memory), so frames are small.
const MaxPayload = 1 << 20

// Type is a message type. A reply has the request's type with bit 0x80 set.
type Type uint8

// Message types.
const (
	THello       Type = 0x01
	TStatus      Type = 0x02
	TRegister    Type = 0x03
	TSave        Type = 0x04
	TCommit      Type = 0x05
	TAbort       Type = 0x06
	TGenerations Type = 0x07
	TRestore     Type = 0x08
	TRelease     Type = 0x09
	TComm        Type = 0x0A // a notice: never answered
	// TWatch asks the agent to send notices on the connection from now on.
	TWatch Type = 0x0B
	// TNotice is sent by the agent, unasked, with id 0, on watching
	// connections only (a client that never sent watch never sees one).
	TNotice Type = 0x0C
	// TProgress is the client's progress heartbeat (hang detection); from
	// 0x10 so that other messages can take the types below.
	TProgress    Type = 0x10
	ReplyBit     Type = 0x80
	THelloReply       = THello | ReplyBit
	TStatusReply      = TStatus | ReplyBit
	TError       Type = 0xFF
)

var typeNames = map[Type]string{
	THello: "hello", TStatus: "status", TRegister: "register", TSave: "save", TCommit: "commit",
	TAbort: "abort", TGenerations: "generations", TRestore: "restore", TRelease: "release", TComm: "comm",
	TWatch: "watch", TNotice: "notice", TProgress: "progress",
	TLogAppend: "log_append", TLogCommit: "log_commit", TLogRead: "log_read", TLogTruncate: "log_truncate", TLogSteps: "log_steps",
}

// Requests lists the request types this package knows, for error messages
// ("0x01 hello, 0x02 status, ...").
func Requests() string {
	var ts []int
	for t := range typeNames {
		if t != TNotice { // the agent's, not a request
			ts = append(ts, int(t))
		}
	}
	sort.Ints(ts)
	parts := make([]string, len(ts))
	for i, t := range ts {
		parts[i] = fmt.Sprintf("0x%02x %s", t, typeNames[Type(t)])
	}
	return strings.Join(parts, ", ")
}

func (t Type) String() string {
	if t == TError {
		return "error"
	}
	if n, ok := typeNames[t&^ReplyBit]; ok {
		if t&ReplyBit != 0 {
			return n + "-reply"
		}
		return n
	}
	return fmt.Sprintf("type-0x%02x", uint8(t))
}

// Frame is one decoded frame.
type Frame struct {
	Version uint8
	Type    Type
	ID      uint32
	Payload []byte // JSON; empty means {}
}

// Decoding errors. Every error from Decode wraps one of these (or io.EOF /
// io.ErrUnexpectedEOF from the reader).
var (
	ErrLength   = errors.New("bad frame length")
	ErrVersion  = errors.New("unsupported protocol version")
	ErrFlags    = errors.New("reserved flags are not zero")
	ErrPayload  = errors.New("payload is not a JSON object")
	ErrTooLarge = errors.New("frame too large")
)

// Fatal reports whether a decoding error leaves the stream unusable (the
// frame boundary is lost), so that the connection must be closed after the
// error reply.
func Fatal(err error) bool {
	return errors.Is(err, ErrLength) || errors.Is(err, ErrTooLarge) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)
}

// Decode reads one frame. It reads exactly the frame's bytes whenever the
// length field is valid, so that after a non-fatal error (see Fatal) the next
// frame can be read. A returned Frame is filled in as far as the header was
// valid (ID and Type are set for version, flags and payload errors), so the
// error reply can echo the request id.
func Decode(r io.Reader) (Frame, error) {
	var h [HeaderSize]byte
	if _, err := io.ReadFull(r, h[:4]); err != nil {
		return Frame{}, err
	}
	n := binary.BigEndian.Uint32(h[:4])
	if n < HeaderSize-4 {
		return Frame{}, fmt.Errorf("%w: %d < %d", ErrLength, n, HeaderSize-4)
	}
	if n-(HeaderSize-4) > MaxPayload {
		return Frame{}, fmt.Errorf("%w: payload of %d bytes > %d", ErrTooLarge, n-(HeaderSize-4), MaxPayload)
	}
	if _, err := io.ReadFull(r, h[4:]); err != nil {
		return Frame{}, noEOF(err)
	}
	f := Frame{Version: h[4], Type: Type(h[5]), ID: binary.BigEndian.Uint32(h[8:12])}
	payload := make([]byte, n-(HeaderSize-4))
	if _, err := io.ReadFull(r, payload); err != nil {
		return f, noEOF(err)
	}
	if f.Version != Version {
		return f, fmt.Errorf("%w %d (this agent speaks %d)", ErrVersion, f.Version, Version)
	}
	if flags := binary.BigEndian.Uint16(h[6:8]); flags != 0 {
		return f, fmt.Errorf("%w: 0x%04x", ErrFlags, flags)
	}
	if len(payload) > 0 {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(payload, &obj); err != nil || obj == nil {
			return f, fmt.Errorf("%w: %v", ErrPayload, err)
		}
	}
	f.Payload = payload
	return f, nil
}

func noEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// Append encodes f (with Version forced to the package version) onto b.
func Append(b []byte, f Frame) ([]byte, error) {
	if len(f.Payload) > MaxPayload {
		return b, fmt.Errorf("%w: payload of %d bytes > %d", ErrTooLarge, len(f.Payload), MaxPayload)
	}
	var h [HeaderSize]byte
	binary.BigEndian.PutUint32(h[:4], uint32(HeaderSize-4+len(f.Payload)))
	h[4] = Version
	h[5] = byte(f.Type)
	binary.BigEndian.PutUint32(h[8:12], f.ID)
	b = append(b, h[:]...)
	return append(b, f.Payload...), nil
}

// Write encodes f onto w in one write.
func Write(w io.Writer, f Frame) error {
	b, err := Append(nil, f)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// WriteMsg marshals v as the payload of a frame of type t; nil gives an
// empty payload.
func WriteMsg(w io.Writer, t Type, id uint32, v any) error {
	if v == nil {
		return Write(w, Frame{Type: t, ID: id})
	}
	p, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding %s payload: %w", t, err)
	}
	return Write(w, Frame{Type: t, ID: id, Payload: p})
}

// Unmarshal decodes a frame's payload into v; an empty payload leaves v as is.
func (f Frame) Unmarshal(v any) error {
	if len(f.Payload) == 0 {
		return nil
	}
	if err := json.Unmarshal(f.Payload, v); err != nil {
		return fmt.Errorf("%s payload: %w", f.Type, err)
	}
	return nil
}

// Hello is the payload of a hello request. All fields are optional.
type Hello struct {
	Client string `json:"client,omitempty"` // "reft-py/0.1", "reft-go/0.1", ...
	PID    int    `json:"pid,omitempty"`
	Step   string `json:"step,omitempty"` // REFT_STEP_ID of the caller
	Rank   int    `json:"rank,omitempty"`
}

// HelloReply is the payload of a hello reply.
type HelloReply struct {
	Protocol     int    `json:"protocol"`
	Job          string `json:"job"`
	Node         string `json:"node"`
	Spec         string `json:"spec"`
	AgentVersion string `json:"agent_version"`
	Restart      int    `json:"restart"`
}

// Status is the payload of a status reply.
type Status struct {
	Job           string  `json:"job"`
	Node          string  `json:"node"`
	Spec          string  `json:"spec"`
	AgentVersion  string  `json:"agent_version"`
	PID           int     `json:"pid"`
	UptimeSeconds float64 `json:"uptime_s"`
	Clients       int     `json:"clients"`       // connections open now
	Connections   uint64  `json:"connections"`   // connections accepted so far
	BadFrames     uint64  `json:"bad_frames"`    // malformed frames received so far
	MemoryBudget  uint64  `json:"memory_budget"` // bytes
	StoreDir      string  `json:"store_dir"`
	// Ranks lists what the store holds per rank (own state, shard "state").
	Ranks []RankStatus `json:"ranks,omitempty"`
	// Peering is the connections to the job's other agents.
	Peering *Peering `json:"peering,omitempty"`
	// GPU is the node's GPU health (agent/gpuhealth).
	GPU *GPU `json:"gpu,omitempty"`
	// PlacementWarnings are the sharding-group placement problems this
	// agent found (members of one group sharing this node), one line each.
	PlacementWarnings []string `json:"placement_warnings,omitempty"`
	// Memory is what the snapshot store holds and uses of the budget
	// (absent with snapshots off).
	Memory *Memory `json:"memory,omitempty"`
	// Store is the snapshot store's event counters since the agent
	// started (absent with snapshots off).
	Store *StoreCounters `json:"store,omitempty"`
	// LostNodes are the job's nodes whose loss the agents' failure
	// detector published, in the order this agent learned of them.
	LostNodes []string `json:"lost_nodes,omitempty"`
	// MsgLog is the ranks' message logs on this node (absent with
	// snapshots off).
	MsgLog *MsgLogStatus `json:"msglog,omitempty"`
	// Metrics is what the agent timed and counted since it started that
	// the sections above do not carry (agent/metrics exports both).
	Metrics *Metrics `json:"metrics,omitempty"`
}

// Metrics is the status reply's timings and event counts.
type Metrics struct {
	// SnapshotSeconds: a save request to its commit reply (the client's
	// copy into the arena, checksums, parity encode, the commit).
	SnapshotSeconds *Histogram `json:"snapshot_seconds,omitempty"`
	// EncodeSeconds: a commit's redundancy encode (ARC copy, AEC parity).
	EncodeSeconds *Histogram `json:"encode_seconds,omitempty"`
	// RestoreSeconds by source (local, peer, decode, persistent): a
	// restore request to its reply.
	RestoreSeconds map[string]*Histogram `json:"restore_seconds,omitempty"`
	// FailuresDetected by class (node, agent, hang): the detector's
	// verdicts this agent learned of; DetectionSeconds their latency
	// (last sign of life to confirmation).
	FailuresDetected map[string]uint64 `json:"failures_detected,omitempty"`
	DetectionSeconds *Histogram        `json:"detection_seconds,omitempty"`
	// ReplicationBytes: payload of the background replicas of other
	// nodes' ranks committed here; ReplicationSeconds the time each took.
	ReplicationBytes   uint64     `json:"replication_bytes"`
	ReplicationSeconds *Histogram `json:"replication_seconds,omitempty"`
	// ReplicationSchedule is what the idle-span schedule of background
	// replication did ([protect] background_schedule = "idle"); nil
	// under the other schedules.
	ReplicationSchedule *ReplicationSchedule `json:"replication_schedule,omitempty"`
}

// ReplicationSchedule counts the idle-span schedule's decisions on this
// node (agent/netsched), both ends of its fetches together.
type ReplicationSchedule struct {
	// Chunks admitted into a predicted idle span; Unplanned ones admitted
	// with no timeline learned (outside phases, as "paused" does);
	// Oversize ones larger than any idle span (each started alone).
	Chunks    uint64 `json:"chunks"`
	Unplanned uint64 `json:"unplanned"`
	Oversize  uint64 `json:"oversize"`
	// SpansSkipped: idle spans that ended with a chunk waiting and none
	// admitted; PhasesOverrun: phases that began before the admitted
	// chunks were done at the estimated bandwidth.
	SpansSkipped  uint64 `json:"spans_skipped"`
	PhasesOverrun uint64 `json:"phases_overrun"`
	Reprofiles    uint64 `json:"reprofiles"`
}

// Histogram is a distribution of observations: Count and Sum of them, and
// cumulative counts at each upper bound (+Inf is Count).
type Histogram struct {
	Count   uint64   `json:"count"`
	Sum     float64  `json:"sum"`
	Buckets []Bucket `json:"buckets,omitempty"`
}

// Bucket is a Histogram's count of observations <= LE.
type Bucket struct {
	LE    float64 `json:"le"`
	Count uint64  `json:"count"`
}

// Memory is the status reply's snapshot memory section.
type Memory struct {
	// Held is the payload bytes of every committed generation in the
	// store: every rank's own state, copies and parity, restores.
	Held int64 `json:"held"`
	// Budget is the limit (store.memory_budget resolved); InUse the
	// arena bytes reserved against it (allocated arenas, free ones
	// included, since they are kept for the next saves).
	Budget uint64 `json:"budget"`
	InUse  int64  `json:"in_use"`
	// PinnedBytes of the arenas are locked in memory; UnpinnedArenas
	// could not be (RLIMIT_MEMLOCK): they may be swapped out, and a
	// restore from them is slower.
	PinnedBytes    int64 `json:"pinned_bytes"`
	UnpinnedArenas int64 `json:"unpinned_arenas"`
	HugePageArenas int64 `json:"huge_page_arenas"`
	// BudgetRefusals counts arena allocations the budget refused.
	BudgetRefusals int64 `json:"budget_refusals"`
}

// StoreCounters is the status reply's store section: what happened to
// the node's snapshots since the agent started. A failed save costs the
// trainer only that snapshot, so these are how an operator sees it.
type StoreCounters struct {
	Saves        int64 `json:"saves"`         // generations begun
	Commits      int64 `json:"commits"`       // generations committed
	SaveFailures int64 `json:"save_failures"` // saves (or registrations' preallocations) that failed, any reason
	NoSpace      int64 `json:"no_space"`      // of those, a full tmpfs or hugetlbfs pool
	OverBudget   int64 `json:"over_budget"`   // of those, the memory budget
	Restores     int64 `json:"restores"`      // generations verified for a restore
	// ChecksumFailures counts corrupt chunks found; BadGenerations the
	// generations marked bad for them.
	ChecksumFailures int64 `json:"checksum_failures"`
	BadGenerations   int64 `json:"bad_generations"`
	// Discarded counts incomplete or damaged generations removed when
	// the store was re-indexed at start.
	Discarded int64 `json:"discarded"`
}

// GPU states, of the node and of a device.
const (
	GPUStarting  = "starting"  // NVML not initialized yet
	GPUOK        = "ok"        // watched, nothing wrong seen
	GPUFailing   = "failing"   // a GPU fault that needs a reset or repair
	GPUOff       = "off"       // not watched (reason)
	GPUUnwatched = "unwatched" // a device without events: polled only
)

// GPU is the status reply's GPU health section.
type GPU struct {
	State   string      `json:"state"`
	Reason  string      `json:"reason,omitempty"`
	Devices []GPUDevice `json:"devices,omitempty"`
}

// GPUDevice is one GPU in the status reply.
type GPUDevice struct {
	Index        int    `json:"index"`
	UUID         string `json:"uuid,omitempty"`
	State        string `json:"state"` // ok, failing or unwatched
	Reason       string `json:"reason,omitempty"`
	XID          uint64 `json:"xid,omitempty"`            // the XID that made it fail
	Since        string `json:"since,omitempty"`          // RFC 3339: when it started failing
	SingleBitECC uint64 `json:"single_bit_ecc,omitempty"` // corrected ECC errors seen
}

// RankStatus is one rank's snapshots on this node, in a status reply.
type RankStatus struct {
	Rank        int     `json:"rank"`
	Newest      int64   `json:"newest"` // newest committed step
	Generations []int64 `json:"generations"`
	Bytes       int64   `json:"bytes"` // payload bytes of the newest generation
	// Protection is how the rank's last registration on this node is
	// protected; absent when no rank registered since the agent started.
	Protection *RankProtection `json:"protection,omitempty"`
	// Progress is what hang detection sees of the rank: absent when it
	// made no progress (a save or a progress message) on its open
	// connection.
	Progress *RankProgress `json:"progress,omitempty"`
}

// RankProgress is a rank's progress as the agent measures it. Medians are
// over the rank's last 15 steps, 0 until three were seen.
type RankProgress struct {
	Step    int64   `json:"step"`     // the newest step it reported
	SilentS float64 `json:"silent_s"` // seconds since its last report
	// StepTimeS is the median time between its reports of successive
	// steps (seconds).
	StepTimeS float64 `json:"step_time_s"`
	// ComputeS is the median time from the end of one of its
	// communication phases to the start of the next (seconds): its own
	// work per step, without the waits for other ranks; 0 when the
	// trainer reports no communication phases (comm).
	ComputeS float64 `json:"compute_s"`
	InComm   bool    `json:"in_comm"` // in a communication phase now
	// Where is what the rank was doing at its last report, in words: in
	// the collective its client named, or in its own work since one
	// ended; "" when its trainer reports no communication phases.
	Where string `json:"where,omitempty"`
}

// RankProtection is a rank's snapshot layout, from its registration.
type RankProtection struct {
	// Connected: the rank's connection is open now (a rank that finished
	// or died keeps its last registration here).
	Connected bool   `json:"connected"`
	World     int    `json:"world"`
	Layout    string `json:"layout,omitempty"` // "dp=4 pp=1 tp=1"
	// Mode is "sharded" (own shard plus ARC copy and/or AEC parity of the
	// SG's replicated state), "whole" (replicated state whole on every
	// member, under aor alone) or "local" (the whole state on this node
	// only: no arc/aec, one DP rank, or nothing replicated).
	Mode string `json:"mode"`
	// Group is the sharding group, "(pp=P,tp=T)"; Position the rank's
	// ring position in it; Members the group's ranks by position.
	Group    string `json:"group,omitempty"`
	Position int    `json:"position"`
	Members  []int  `json:"members,omitempty"`
	ARC      bool   `json:"arc,omitempty"`
	AEC      int    `json:"aec,omitempty"` // parity units per stripe
	AOR      bool   `json:"aor,omitempty"` // keeps a replica of its successor's optimizer shard
}

// Protection modes of a RankProtection.
const (
	ProtectSharded = "sharded"
	ProtectWhole   = "whole"
	ProtectLocal   = "local"
)

// Error codes of an error reply.
const (
	CodeMalformed   = "malformed"
	CodeVersion     = "unsupported_version"
	CodeUnknownType = "unknown_type"
	CodeForbidden   = "forbidden"
	CodeInternal    = "internal"
	CodeInvalid     = "invalid"
	CodeBadState    = "bad_state"
	CodeNoSpace     = "no_space"
	CodeNotFound    = "not_found"
	CodeMismatch    = "mismatch"
	CodeCorrupt     = "corrupt"
	CodeDisabled    = "disabled"
	// CodeDegraded: a commit refused under a strict SPEC, its protection
	// below the modes' (spec.Spec.Strict).
	CodeDegraded = "degraded"
)

// BufferSpec is one buffer in a register request.
type BufferSpec struct {
	Name       string `json:"name"`
	Size       int64  `json:"size"`
	Replicated bool   `json:"replicated"`
	// AOR, when set, marks the buffer as this rank's ZeRO-1 shard of an
	// optimizer state tensor and says how a replica of it is kept
	// current from the gradients (REFT's AOR; see AOR and CheckAOR).
	AOR *AOR `json:"aor,omitempty"`
}

// Register is the payload of a register request.
type Register struct {
	Rank      int          `json:"rank"`
	World     int          `json:"world"`
	LocalRank int          `json:"local_rank"`
	Layout    string       `json:"layout"`
	ChunkSize int64        `json:"chunk_size"`
	Buffers   []BufferSpec `json:"buffers"`
}

// BufferPlace is where a buffer lives in every generation's arena.
type BufferPlace struct {
	Name       string `json:"name"`
	Offset     int64  `json:"offset"`
	Size       int64  `json:"size"`
	Replicated bool   `json:"replicated"`
}

// RegisterReply is the payload of a register reply.
type RegisterReply struct {
	Rank      int           `json:"rank"`
	ChunkSize int64         `json:"chunk_size"`
	ArenaSize int64         `json:"arena_size"`
	Buffers   []BufferPlace `json:"buffers"`
}

// StepReq is the payload of save, commit, abort, restore and release
// requests, and of abort and release replies.
type StepReq struct {
	Step int64 `json:"step"`
}

// VerifyClient is a restore request's Verify when the client checks every
// chunk's CRC-32C itself while it copies (docs/PROTOCOL.md, "Restore
// verified by the client").
const VerifyClient = "client"

// Restore is the payload of a restore request. Verify "client" asks the
// agent to leave the checksums to the client: the reply then carries them
// (ArenaReply.CRC32C), and the client reports chunks that fail in its
// release. An agent that verifies anyway replies without them.
type Restore struct {
	Step   int64  `json:"step"`
	Verify string `json:"verify,omitempty"`
}

// Release is the payload of a release request. BadChunks, from a client
// that verified the restore, lists the chunks whose bytes it read did not
// match their checksum; the agent then verifies the generation itself and
// replies corrupt.
type Release struct {
	Step      int64          `json:"step"`
	BadChunks []MisreadChunk `json:"bad_chunks,omitempty"`
}

// MisreadChunk is a chunk a client read with a wrong CRC-32C: chunk Index
// of section Section, whose bytes had CRC-32C Got. (The agent's own
// verdict on the arena, in a corrupt reply, is a BadChunk.)
type MisreadChunk struct {
	Section string `json:"section"`
	Index   int    `json:"index"`
	Got     uint32 `json:"got"`
}

// Comm is the payload of a comm notice: the rank enters (Active) or leaves
// a communication phase (an allreduce). The agent pauses background
// replication while any local rank is in one, and sends no reply.
type Comm struct {
	Active bool `json:"active"`
	// Op names the collective the rank enters (with Active), in a few
	// words ("gradient all-reduce"): a hang verdict names it as where the
	// rank waited. Optional; CheckCommOp says what it may hold.
	Op string `json:"op,omitempty"`
}

// MaxCommOp is the longest Comm.Op, in bytes: a name, not a message.
const MaxCommOp = 96

// CheckCommOp reports whether op may name a collective: at most MaxCommOp
// bytes of printable UTF-8 (it reaches the agent's log and the recovery
// log's cause, so no control character may forge a line).
func CheckCommOp(op string) error {
	if len(op) > MaxCommOp {
		return fmt.Errorf("comm op of %d bytes is longer than %d: name the collective in a few words", len(op), MaxCommOp)
	}
	for i, r := range op {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return fmt.Errorf("comm op %q has an unprintable character at byte %d: name the collective in printable text", op, i)
		}
	}
	return nil
}

// Commit is the payload of a commit request. CRC32C, when the client sends
// it, holds per section (the save reply's Sections; one per buffer, of the
// buffer's name, from an agent without sections) the CRC-32C of every
// chunk (the register reply's chunk_size) of the section as the client
// filled it; the agent then records them instead of reading the arena
// again.
type Commit struct {
	Step   int64               `json:"step"`
	CRC32C map[string][]uint32 `json:"crc32c,omitempty"`
}

// ArenaReply is the payload of save and restore replies.
type ArenaReply struct {
	Step      int64  `json:"step"`
	Seq       uint64 `json:"seq,omitempty"`
	Arena     string `json:"arena"`
	ArenaSize int64  `json:"arena_size"`
	// Buffers are the registered buffers; Offset is where a buffer lies
	// whole in the arena, or -1 when it does not (a client that ignores
	// Regions then fails its bounds check instead of copying wrong bytes).
	Buffers []BufferPlace `json:"buffers"`
	// Regions say what to copy: nil (an agent from before regions) means
	// every buffer whole at its Buffers offset. Not omitempty: an empty
	// list (only empty buffers) is not an absent one.
	Regions []Region `json:"regions"`
	// Sections are the checksummed arena ranges; nil with Regions.
	Sections []Section `json:"sections"`
	// ChunkSize and CRC32C: in a restore reply to a client that asked to
	// verify (Restore.Verify), the generation's chunk size and the CRC-32C
	// of every chunk of every section, keyed by section name, as the
	// manifest records them; absent when the agent verified the
	// generation before replying.
	ChunkSize int64               `json:"chunk_size,omitempty"`
	CRC32C    map[string][]uint32 `json:"crc32c,omitempty"`
}

// Region is a byte range of a registered buffer and its place in the
// arena: a save copies Buffer[Offset:Offset+Size] to
// arena[ArenaOffset:ArenaOffset+Size], a restore copies it back.
type Region struct {
	Buffer      string `json:"buffer"`
	Offset      int64  `json:"offset"`
	Size        int64  `json:"size"`
	ArenaOffset int64  `json:"arena_offset"`
}

// Section is an arena range the agent checksums in chunk_size chunks; a
// commit's CRC32C is keyed by section name.
type Section struct {
	Name        string `json:"name"`
	ArenaOffset int64  `json:"arena_offset"`
	Size        int64  `json:"size"`
}

// CommitReply is the payload of a commit reply.
type CommitReply struct {
	Step      int64   `json:"step"`
	Seq       uint64  `json:"seq"`
	Bytes     int64   `json:"bytes"`
	ChecksumS float64 `json:"checksum_s"`
	// Degraded lists why the node's protection has been below the SPEC
	// for a while (agent.DegradedGrace), as the reft_protection_degraded
	// metric's reasons; absent when it is not. The clients say it once.
	Degraded []string `json:"degraded,omitempty"`
}

// GenInfo is one committed generation in a generations reply.
type GenInfo struct {
	Step  int64  `json:"step"`
	Seq   uint64 `json:"seq"`
	Bytes int64  `json:"bytes"`
	// Source is where the agent holds it: SourceMemory (the node-local
	// store) or SourcePersistent (the persistent directory only).
	Source string `json:"source"`
}

// Generation sources.
const (
	SourceMemory     = "memory"
	SourcePersistent = "persistent"
)

// GenerationsReply is the payload of a generations reply.
type GenerationsReply struct {
	Rank        int       `json:"rank"`
	Generations []GenInfo `json:"generations"`
}

// WatchReply is the payload of a watch reply.
type WatchReply struct {
	// Kinds are the notice kinds this agent sends (NoticePeerFailure).
	Kinds []string `json:"kinds"`
}

// Notice kinds.
const (
	// NoticePeerFailure: another node of the job failed (its agent was
	// lost); ranks holding consistent state newer than their last
	// committed generation should save it at once (JIT flush).
	NoticePeerFailure = "peer_failure"
)

// Notice is the payload of a notice frame. Clients ignore kinds they do
// not know.
type Notice struct {
	Kind  string `json:"kind"`
	Node  string `json:"node,omitempty"`  // the failed node
	Cause string `json:"cause,omitempty"` // one line: how the agent learned it
	Time  string `json:"time"`            // RFC 3339 with nanoseconds: when the agent learned it
}

// Error is the payload of an error reply.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// BadChunks, in a corrupt reply to restore, lists the chunks of the
	// generation that failed their CRC-32C, so the caller can fetch
	// those bytes elsewhere (a peer, an older step).
	BadChunks []BadChunk `json:"bad_chunks,omitempty"`
}

// BadChunk is one corrupt chunk of a generation, or one part of it: a
// checksum chunk of section Section that covers bytes [Offset,
// Offset+Length) of the registered buffer Buffer. A chunk that covers
// several buffers' bytes (a layout other than one section per buffer) is
// listed once per buffer; one that covers no client bytes (an agent-only
// section) has an empty Buffer, and Offset is then within the section.
type BadChunk struct {
	Buffer  string `json:"buffer,omitempty"`
	Section string `json:"section"`
	Chunk   int    `json:"chunk"` // index of the checksum chunk in the section
	Offset  int64  `json:"offset"`
	Length  int64  `json:"length"`
}

func (e *Error) Error() string { return "agent error " + e.Code + ": " + e.Message }

// Call sends a request of type t with payload req on rw and decodes the reply
// into resp. An error reply is returned as *Error.
func Call(rw io.ReadWriter, t Type, id uint32, req, resp any) error {
	werr := WriteMsg(rw, t, id, req)
	f, err := Decode(rw)
	if werr != nil && (err != nil || f.Type != TError) {
		// The agent may have refused the connection (an error frame, then
		// close) before the request went out: prefer its error frame.
		return fmt.Errorf("sending %s: %w", t, werr)
	}
	if err != nil {
		return fmt.Errorf("reading %s reply: %w", t, err)
	}
	if f.ID != id && !(f.Type == TError && f.ID == 0) {
		return fmt.Errorf("reply id %d does not match request id %d", f.ID, id)
	}
	switch f.Type {
	case TError: // id 0: an error about the connection or an unreadable frame
		e := &Error{}
		if err := f.Unmarshal(e); err != nil {
			return err
		}
		return e
	case t | ReplyBit:
		if resp == nil {
			return nil
		}
		return f.Unmarshal(resp)
	}
	return fmt.Errorf("reply of type %s to a %s request", f.Type, t)
}
