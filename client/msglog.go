package client

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/internal/crc32c"
)

// The message log (docs/PROTOCOL.md, "Message log"): the messages this
// rank sent across a machine boundary, stored by its node's agent in host
// memory, so that a pipeline stage that fails can be replayed from its
// neighbours' logs (SWIFT; docs/ARCHITECTURE.md, "Message log").
//
// A log belongs to the rank this client registered as: the first log call
// registers the buffers, as the first Save does, so Register the rank's
// buffers before it. Only this rank reads or truncates its log, through
// its own node's agent, and the log is lost when that agent restarts or
// the node is. The log calls may run on any goroutine, beside Save and
// Restore; they take turns with each other.
//
// Errors the agent sends are *Error (errors.As): CodeNoSpace for an append
// over the rank's cap or the node's memory budget (nothing stored was
// dropped), CodeMismatch for other bytes under a stored key, CodeCorrupt
// for a message whose bytes fail their CRC-32C, CodeNotFound for a key
// the agent does not hold, CodeDisabled when the job has no store.

// ErrLogDisabled: the client has no agent (Options.Optional without a
// socket), so nothing can be logged.
var ErrLogDisabled = errors.New("reft is not enabled for this step (no agent): the message log needs one, and nothing was logged")

// ErrLogCopyCorrupt: the bytes LogRead copied out of the agent's arena
// fail the CRC-32C the agent verified them against just before.
var ErrLogCopyCorrupt = errors.New("the copy of a logged message fails its CRC-32C")

// LogAppend stores data (one message this rank sent across a machine
// boundary) as (stream, step, seq) in the node's agent. Streams are the
// caller's names ("act>3", "grad>1": the kind and the receiving rank):
// 1 to 64 bytes of printable ASCII without spaces. A (stream, step, seq)
// already stored with the same bytes (the same length and CRC-32C) is a
// no-op; other bytes: an error (CodeMismatch). data must not change until
// LogAppend returns.
func (c *Client) LogAppend(stream string, step int64, seq int, data []byte) error {
	ctx := context.Background()
	req := proto.LogAppend{LogKey: proto.LogKey{Stream: stream, Step: step, Seq: seq}, Size: int64(len(data))}
	fail := func(err error) error { return fmt.Errorf("message log append of %s: %w", req.LogKey, err) }
	if err := proto.CheckLogAppend(req); err != nil {
		return fail(err)
	}
	if err := c.logReady(ctx); err != nil {
		return fail(err)
	}
	c.logMu.Lock()
	defer c.logMu.Unlock()
	var rep proto.LogAppendReply
	if err := c.conn.call(ctx, proto.TLogAppend, req, &rep); err != nil {
		return fail(err)
	}
	// On a failure from here on, the agent drops the open append at the
	// connection's next log request.
	if err := proto.CheckLogArena(rep.Arena, rep.ArenaSize, req.Size); err != nil {
		return fail(fmt.Errorf("log_append reply: %w", err))
	}
	arena, err := c.logMaps.get(rep.Arena, rep.ArenaSize)
	if err != nil {
		return fail(err)
	}
	// The CRC-32C is computed as the bytes are copied (they cross the
	// memory bus once); the agent checksums the bytes it then holds and
	// stores them only when the two agree, and keeps an equal message it
	// already held instead.
	crc := crc32c.Copy(0, arena[:len(data)], data)
	if err := c.conn.call(ctx, proto.TLogCommit, proto.LogCommit{LogKey: req.LogKey, CRC32C: crc}, nil); err != nil {
		return fail(err)
	}
	return nil
}

// LogRead copies the stored message (stream, step, seq) into dst, which
// must have its exact length. The agent verifies the message's CRC-32C
// before it replies, and LogRead verifies its copy against it again
// (ErrLogCopyCorrupt).
func (c *Client) LogRead(ctx context.Context, stream string, step int64, seq int, dst []byte) error {
	k := proto.LogKey{Stream: stream, Step: step, Seq: seq}
	fail := func(err error) error { return fmt.Errorf("message log read of %s: %w", k, err) }
	if err := proto.CheckLogKey(k); err != nil {
		return fail(err)
	}
	if err := c.logReady(ctx); err != nil {
		return fail(err)
	}
	c.logMu.Lock()
	defer c.logMu.Unlock()
	var rep proto.LogReadReply
	if err := c.conn.call(ctx, proto.TLogRead, k, &rep); err != nil {
		return fail(err)
	}
	if err := proto.CheckLogArena(rep.Arena, rep.ArenaSize, rep.Size); err != nil {
		return fail(fmt.Errorf("log_read reply: %w", err))
	}
	if rep.Size != int64(len(dst)) {
		return fail(fmt.Errorf("the stored message has %d bytes, dst has %d: read it into a buffer of its exact length", rep.Size, len(dst)))
	}
	arena, err := c.logMaps.get(rep.Arena, rep.ArenaSize)
	if err != nil {
		return fail(err)
	}
	if got := crc32c.Copy(0, dst, arena[:rep.Size]); got != rep.CRC32C {
		return fail(fmt.Errorf("%w: the agent verified %#08x, the copy has %#08x: its arena was rewritten during the copy "+
			"(another process of this rank truncated and appended meanwhile) or this host's memory is failing; read it again",
			ErrLogCopyCorrupt, rep.CRC32C, got))
	}
	return nil
}

// LogTruncate drops every message of every stream of this rank with step
// <= upTo; their memory serves the rank's next appends.
func (c *Client) LogTruncate(upTo int64) error {
	ctx := context.Background()
	fail := func(err error) error { return fmt.Errorf("message log truncation up to step %d: %w", upTo, err) }
	if err := c.logReady(ctx); err != nil {
		return fail(err)
	}
	c.logMu.Lock()
	defer c.logMu.Unlock()
	if err := c.conn.call(ctx, proto.TLogTruncate, proto.LogTruncate{UpTo: upTo}, nil); err != nil {
		return fail(err)
	}
	if err := c.logMaps.sweep(false); err != nil {
		return fail(err)
	}
	return nil
}

// LogSteps says which steps of stream the agent holds for this rank,
// ascending (empty, not nil, when none).
func (c *Client) LogSteps(ctx context.Context, stream string) ([]int64, error) {
	fail := func(err error) error { return fmt.Errorf("message log steps of stream %q: %w", stream, err) }
	if err := proto.CheckLogStream(stream); err != nil {
		return nil, fail(err)
	}
	if err := c.logReady(ctx); err != nil {
		return nil, fail(err)
	}
	c.logMu.Lock()
	defer c.logMu.Unlock()
	var rep proto.LogStepsReply
	if err := c.conn.call(ctx, proto.TLogSteps, proto.LogStream{Stream: stream}, &rep); err != nil {
		return nil, fail(err)
	}
	if rep.Steps == nil {
		rep.Steps = []int64{}
	}
	for i := 1; i < len(rep.Steps); i++ {
		if rep.Steps[i] <= rep.Steps[i-1] {
			return nil, fail(fmt.Errorf("log_steps reply: steps %v are not ascending", rep.Steps))
		}
	}
	return rep.Steps, nil
}

// logReady registers the rank's buffers with the agent when no Save or
// Restore did yet: a log belongs to the rank the connection registered as.
func (c *Client) logReady(ctx context.Context) error {
	if c.disabled {
		return ErrLogDisabled
	}
	if c.logRegistered.Load() {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errClosed
	}
	if err := c.register(ctx); err != nil {
		return fmt.Errorf("a log belongs to the rank the client registered as: %w", err)
	}
	c.logRegistered.Store(true)
	return nil
}

// logMaps caches the mappings of message arenas, by path, under logMu.
// Mapping a message's arena (MAP_POPULATE) and unmapping it cost more
// than copying the message, and in steady state the agent hands the same
// arenas out again (a truncated message's arena serves a later append).
// An arena is mapped read-write, once, for appends and reads alike.
//
// A mapping keeps its pages alive after the agent freed the arena (an
// arena over the cap, a full budget): sweep unmaps those whose file is
// gone or replaced, at every LogTruncate (the agent frees arenas only at
// appends, so a freed one stays mapped at most until the rank's next
// truncation) and at Close.
type logMaps struct {
	m map[string]*logMap
}

type logMap struct {
	data     []byte
	dev, ino uint64
}

// get returns the mapping of the arena at path (size bytes), mapping it
// when it is not cached or the file at path is no longer the one mapped.
func (l *logMaps) get(path string, size int64) ([]byte, error) {
	if m := l.m[path]; m != nil {
		var st unix.Stat_t
		if unix.Lstat(path, &st) == nil && st.Dev == m.dev && st.Ino == m.ino && int64(len(m.data)) == size {
			return m.data, nil
		}
		delete(l.m, path)
		if err := unix.Munmap(m.data); err != nil {
			return nil, fmt.Errorf("unmapping arena %s: %w", path, err)
		}
	}
	data, st, err := mapArena(path, size, true)
	if err != nil {
		return nil, err
	}
	if l.m == nil {
		l.m = map[string]*logMap{}
	}
	l.m[path] = &logMap{data: data, dev: st.Dev, ino: st.Ino}
	return data, nil
}

// sweep unmaps the arenas whose file is gone or replaced; all with all.
func (l *logMaps) sweep(all bool) error {
	var errs []error
	for path, m := range l.m {
		var st unix.Stat_t
		if !all && unix.Lstat(path, &st) == nil && st.Dev == m.dev && st.Ino == m.ino {
			continue
		}
		delete(l.m, path)
		if err := unix.Munmap(m.data); err != nil {
			errs = append(errs, fmt.Errorf("unmapping arena %s: %w", path, err))
		}
	}
	return errors.Join(errs...)
}
