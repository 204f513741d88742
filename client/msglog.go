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
	// Checksummed first: a message already stored (a replayed step's) is
	// then recognized without a copy.
	req.CRC32C = crc32c.Checksum(data)
	c.logMu.Lock()
	defer c.logMu.Unlock()
	var rep proto.LogAppendReply
	if err := c.conn.call(ctx, proto.TLogAppend, req, &rep); err != nil {
		return fail(err)
	}
	if rep.Stored {
		return nil
	}
	if err := proto.CheckLogArena(rep.Arena, rep.ArenaSize, req.Size); err != nil {
		// The agent drops the open append at the next log request.
		return fail(fmt.Errorf("log_append reply: %w", err))
	}
	if err := withArena(rep.Arena, rep.ArenaSize, true, func(b []byte) { copy(b, data) }); err != nil {
		return fail(err)
	}
	// The agent checksums the bytes it now holds and refuses them unless
	// they are req.CRC32C.
	if err := c.conn.call(ctx, proto.TLogCommit, req.LogKey, nil); err != nil {
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
	var got uint32
	if err := withArena(rep.Arena, rep.ArenaSize, false, func(b []byte) { got = crc32c.Copy(0, dst, b[:rep.Size]) }); err != nil {
		return fail(err)
	}
	if got != rep.CRC32C {
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

// withArena maps a message's arena for one copy and unmaps it: each
// message has an arena of its own, freed by a truncation, and a mapping
// kept would keep its memory alive after the agent freed it.
func withArena(path string, size int64, write bool, copyFn func([]byte)) error {
	b, err := mapArena(path, size, write)
	if err != nil {
		return err
	}
	copyFn(b)
	if err := unix.Munmap(b); err != nil {
		return fmt.Errorf("unmapping arena %s: %w", path, err)
	}
	return nil
}
