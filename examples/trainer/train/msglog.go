package train

import (
	"fmt"
	"hash/crc32"
	"math"
	"slices"
	"sync"
)

// Message logging (SWIFT, section 5): under --log-messages every pipeline
// stage keeps what it sends across the stage boundary, activations forward
// and gradients backward, keyed by (stream, step, microbatch), so that a
// stage lost with its node can be brought from its older snapshot to the
// survivors' step by replaying its inputs (replay.go) instead of rolling
// every stage back. The sender keeps the log: a receiver's loss leaves it
// intact, and a sender's loss makes the sender the stage that replays.

// MessageLog is one rank's log of the messages it sent. A log is written
// and read only by its own rank; implementations must be safe for
// concurrent use (the bubble-time logger appends from a background
// goroutine while the trainer truncates).
type MessageLog interface {
	// Append logs data as message (stream, step, seq). Re-appending the
	// same message with the same bits is a no-op (a replayed step logs
	// again); other bits are an error. The log copies data.
	Append(stream string, step int64, seq int, data []float32) error
	// Read fills dst with message (stream, step, seq); an error when it is
	// not held (never logged, or truncated), has another length, or fails
	// its checksum.
	Read(stream string, step int64, seq int, dst []float32) error
	// Truncate drops every message with step <= upTo.
	Truncate(upTo int64) error
	// Steps lists the steps of which the log holds messages of stream,
	// ascending.
	Steps(stream string) ([]int64, error)
}

// Stream names: the kind and the receiving rank.
func actStream(to int) string  { return fmt.Sprintf("act>%d", to) }
func gradStream(to int) string { return fmt.Sprintf("grad>%d", to) }

// DefaultLogCap bounds an in-process message log (--log-cap).
const DefaultLogCap = 1 << 30

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// MemLog is an in-memory MessageLog: every message is copied and
// checksummed (CRC-32C) on Append and verified on Read; the bytes held are
// bounded by a cap. It is what the tests use, and what reft-train uses
// until the agent stores the logs; in a process that dies with its node it
// is lost, as host memory is.
type MemLog struct {
	mu   sync.Mutex
	cap  int64
	held int64
	msgs map[msgKey]*memMsg
}

type msgKey struct {
	stream string
	step   int64
	seq    int
}

type memMsg struct {
	data []float32
	sum  uint32
}

// NewMemLog makes an empty log that holds at most capBytes bytes of
// messages.
func NewMemLog(capBytes int64) *MemLog {
	return &MemLog{cap: capBytes, msgs: map[msgKey]*memMsg{}}
}

// Bytes is what the log holds now.
func (l *MemLog) Bytes() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held
}

func checkKey(stream string, step int64, seq int) error {
	if stream == "" || step < 1 || seq < 0 {
		return fmt.Errorf("message log: bad key (stream %q, step %d, seq %d): want a stream name, step >= 1 and seq >= 0", stream, step, seq)
	}
	return nil
}

func (l *MemLog) Append(stream string, step int64, seq int, data []float32) error {
	if err := checkKey(stream, step, seq); err != nil {
		return err
	}
	if len(data) == 0 {
		return fmt.Errorf("message log: %s step %d seq %d: empty message", stream, step, seq)
	}
	k := msgKey{stream, step, seq}
	l.mu.Lock()
	defer l.mu.Unlock()
	if m := l.msgs[k]; m != nil {
		if same(m.data, data) {
			return nil
		}
		return fmt.Errorf("message log: %s step %d seq %d is logged with other contents (%d values logged, %d now): "+
			"the recomputed message differs from the original, so the replay would not reproduce the run; "+
			"check that both runs use the same flags and binary", stream, step, seq, len(m.data), len(data))
	}
	n := int64(len(data)) * 4
	if l.held+n > l.cap {
		return fmt.Errorf("message log full: it holds %d bytes in %d messages and its cap is %d; %s step %d seq %d needs %d more: "+
			"logs are truncated when snapshots commit, so snapshot more often (--save-every) or raise --log-cap",
			l.held, len(l.msgs), l.cap, stream, step, seq, n)
	}
	c := slices.Clone(data)
	l.msgs[k] = &memMsg{data: c, sum: crc32.Checksum(bytesOf(c), castagnoli)}
	l.held += n
	return nil
}

// same compares bit patterns (NaN equals itself).
func same(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

func (l *MemLog) Read(stream string, step int64, seq int, dst []float32) error {
	if err := checkKey(stream, step, seq); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	m := l.msgs[msgKey{stream, step, seq}]
	if m == nil {
		return fmt.Errorf("message log: %s step %d seq %d is not held (%s): it was truncated or never logged",
			stream, step, seq, l.heldSteps(stream))
	}
	if len(m.data) != len(dst) {
		return fmt.Errorf("message log: %s step %d seq %d has %d values, the reader expects %d: the log belongs to a run with other flags",
			stream, step, seq, len(m.data), len(dst))
	}
	if crc32.Checksum(bytesOf(m.data), castagnoli) != m.sum {
		return fmt.Errorf("message log: %s step %d seq %d fails its CRC-32C: the logged copy is corrupt and cannot be replayed; "+
			"restore every rank from the newest snapshot they all hold (--log-messages=off)", stream, step, seq)
	}
	copy(dst, m.data)
	return nil
}

// heldSteps describes the steps held of stream, for errors; l.mu held.
func (l *MemLog) heldSteps(stream string) string {
	st := l.steps(stream)
	if len(st) == 0 {
		return "the log holds no step of " + stream
	}
	return fmt.Sprintf("the log holds steps %d..%d of %s", st[0], st[len(st)-1], stream)
}

func (l *MemLog) steps(stream string) []int64 {
	var out []int64
	for k := range l.msgs {
		if k.stream == stream {
			out = append(out, k.step)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func (l *MemLog) Truncate(upTo int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, m := range l.msgs {
		if k.step <= upTo {
			l.held -= int64(len(m.data)) * 4
			delete(l.msgs, k)
		}
	}
	return nil
}

func (l *MemLog) Steps(stream string) ([]int64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.steps(stream), nil
}
