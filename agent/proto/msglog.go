package proto

import (
	"fmt"
	"math"
)

// Message log requests (docs/PROTOCOL.md, "Message log"): a rank stores
// the messages it sent across a machine boundary in its node's agent and
// reads them back during a pipeline stage's replay. The bytes never travel
// in frames: like a save, an append gets an arena to copy into.
const (
	TLogAppend   Type = 0x11
	TLogCommit   Type = 0x12
	TLogRead     Type = 0x13
	TLogTruncate Type = 0x14
	TLogSteps    Type = 0x15
)

// MaxLogStream is the longest stream name, in bytes.
const MaxLogStream = 64

// MaxLogSeq is the largest sequence number of a message within its step.
const MaxLogSeq = math.MaxInt32

// LogKey names one logged message: (stream, step, seq). It is the payload
// of log_read requests.
type LogKey struct {
	Stream string `json:"stream"`
	Step   int64  `json:"step"`
	Seq    int    `json:"seq"`
}

func (k LogKey) String() string {
	return fmt.Sprintf("stream %q step %d seq %d", k.Stream, k.Step, k.Seq)
}

// LogAppend is the payload of a log_append request: Size bytes to be
// stored as Key.
type LogAppend struct {
	LogKey
	Size int64 `json:"size"`
}

// LogAppendReply is the payload of a log_append reply: the client copies
// the message to the start of Arena (ArenaSize bytes, at least the size)
// and sends log_commit.
type LogAppendReply struct {
	Arena     string `json:"arena"`
	ArenaSize int64  `json:"arena_size"`
}

// LogCommit is the payload of a log_commit request: the append open on
// the connection, and the CRC-32C (Castagnoli) of the bytes the client
// copied, computed as it copied them.
type LogCommit struct {
	LogKey
	CRC32C uint32 `json:"crc32c"`
}

// LogCommitReply is the payload of a log_commit reply. Held: the key was
// already held with the same size and CRC-32C (a replayed step's message),
// and the copy was dropped.
type LogCommitReply struct {
	LogKey
	Held bool `json:"held,omitempty"`
}

// LogReadReply is the payload of a log_read reply: the message's Size
// bytes lie at the start of Arena (ArenaSize bytes), with CRC-32C CRC32C,
// which the agent verified before replying.
type LogReadReply struct {
	Arena     string `json:"arena"`
	ArenaSize int64  `json:"arena_size"`
	Size      int64  `json:"size"`
	CRC32C    uint32 `json:"crc32c"`
}

// LogTruncate is the payload of a log_truncate request: drop every
// message of every stream of the rank with step <= UpTo.
type LogTruncate struct {
	UpTo int64 `json:"up_to"`
}

// LogTruncateReply says what a truncation dropped, and what the rank's
// log holds after it.
type LogTruncateReply struct {
	Messages int   `json:"messages"`
	Bytes    int64 `json:"bytes"`
	Held     int64 `json:"held"`
}

// LogStream is the payload of a log_steps request.
type LogStream struct {
	Stream string `json:"stream"`
}

// LogStepsReply lists the steps of a stream the agent holds, ascending
// (never null).
type LogStepsReply struct {
	Steps []int64 `json:"steps"`
}

// CheckLogStream reports whether s may name a stream: 1 to MaxLogStream
// bytes of printable ASCII without spaces (it reaches the agent's log and
// error messages, so no control character may forge a line).
func CheckLogStream(s string) error {
	if s == "" {
		return fmt.Errorf("the stream name is empty: name it, e.g. \"act>3\" (the kind and the receiving rank)")
	}
	if len(s) > MaxLogStream {
		return fmt.Errorf("stream name of %d bytes is longer than %d: use a short name such as \"act>3\"", len(s), MaxLogStream)
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return fmt.Errorf("stream name %q has a byte 0x%02x at %d: use printable ASCII without spaces", s, s[i], i)
		}
	}
	return nil
}

// CheckLogKey checks a decoded message key.
func CheckLogKey(k LogKey) error {
	if err := CheckLogStream(k.Stream); err != nil {
		return err
	}
	if k.Step < 0 {
		return fmt.Errorf("step = %d must not be negative", k.Step)
	}
	if k.Seq < 0 || k.Seq > MaxLogSeq {
		return fmt.Errorf("seq = %d must be in [0, %d]", k.Seq, MaxLogSeq)
	}
	return nil
}

// CheckLogAppend checks a decoded log_append request.
func CheckLogAppend(a LogAppend) error {
	if err := CheckLogKey(a.LogKey); err != nil {
		return err
	}
	if a.Size <= 0 {
		return fmt.Errorf("%s: size = %d must be positive (log messages of at least one byte)", a.LogKey, a.Size)
	}
	return nil
}

// CheckLogArena checks an arena the agent named for a message of size
// bytes (log_append and log_read replies), before the client maps it.
func CheckLogArena(arena string, arenaSize, size int64) error {
	switch {
	case arena == "" || arena[0] != '/':
		return fmt.Errorf("the agent named arena %q, not an absolute path", arena)
	case size <= 0:
		return fmt.Errorf("the agent gave a message size of %d bytes", size)
	case arenaSize < size:
		return fmt.Errorf("the agent's arena %s holds %d bytes, less than the message's %d", arena, arenaSize, size)
	case int64(int(arenaSize)) != arenaSize:
		return fmt.Errorf("the agent's arena %s of %d bytes does not fit in this process's address space", arena, arenaSize)
	}
	return nil
}

// MsgLogStatus is the status reply's message log section: what the
// node's ranks logged (all ranks together) since the agent started.
type MsgLogStatus struct {
	Bytes         int64 `json:"bytes"`          // payload bytes of the messages held now
	AppendedBytes int64 `json:"appended_bytes"` // payload bytes appended since the agent started
	Corrupt       int64 `json:"corrupt"`        // messages found corrupt on a read
	// RankCap is each rank's cap now, in arena bytes (the memory budget's
	// share split among the registered ranks).
	RankCap int64 `json:"rank_cap"`
}
