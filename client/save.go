package client

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/tmpfs"
)

// Handle is one save in progress. The caller must not modify a registered
// buffer until Wait has returned (or Done is closed).
type Handle struct {
	step     int64
	done     chan struct{}
	err      error
	hurry    chan struct{} // closed by Wait: copy the rest now, idle window or not
	once     sync.Once
	reported atomic.Bool // Wait returned the result to the caller
	stats    SaveStats
}

// SaveStats describe a committed save.
type SaveStats struct {
	Seq      uint64        // commit order the agent gave the generation
	Bytes    int64         // payload bytes
	Copy     time.Duration // copying into the arena, idle-window waits included
	Commit   time.Duration // the commit's round trip
	Checksum time.Duration // of which the agent spent on CRC-32C
}

func newHandle(step int64) *Handle {
	return &Handle{step: step, done: make(chan struct{}), hurry: make(chan struct{})}
}

// finished returns a handle that is already done with err.
func finished(step int64, err error) *Handle {
	h := newHandle(step)
	h.finish(err)
	return h
}

func (h *Handle) finish(err error) {
	h.err = err
	close(h.done)
}

func (h *Handle) hurryUp() { h.once.Do(func() { close(h.hurry) }) }

// Step is the step being saved.
func (h *Handle) Step() int64 { return h.step }

// Done is closed when the save has committed or failed. Unlike Wait it does
// not hurry a copy that is waiting for an idle window.
func (h *Handle) Done() <-chan struct{} { return h.done }

// Stats describe the save once it has committed; zero before that or when
// it failed.
func (h *Handle) Stats() SaveStats {
	select {
	case <-h.done:
		return h.stats
	default:
		return SaveStats{}
	}
}

// Wait finishes the save, copying what is left at once, and returns its
// error: *Error (errors.As) when the agent refused it, a wrapped ctx.Err()
// when ctx ends first (the save goes on).
func (h *Handle) Wait(ctx context.Context) error {
	h.hurryUp()
	select {
	case <-h.done:
		h.reported.Store(true)
		return h.err
	case <-ctx.Done():
		return fmt.Errorf("waiting for the save of step %d: %w", h.step, ctx.Err())
	}
}

// Save snapshots every registered buffer as step. It returns once the agent
// has named the arena (first waiting for the previous save, if that is
// still copying); a background goroutine copies and commits. Errors come
// from the handle's Wait.
func (c *Client) Save(step int64) *Handle {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.disabled {
		c.notice()
		return finished(step, nil)
	}
	fail := func(err error) *Handle { return finished(step, fmt.Errorf("save of step %d: %w", step, err)) }
	if c.closed {
		return fail(errClosed)
	}
	if step < 0 {
		return fail(errors.New("the step must not be negative"))
	}
	ctx := context.Background()
	_ = c.finish(ctx) // its error is reported by its own handle
	if err := c.register(ctx); err != nil {
		return fail(err)
	}
	var rep proto.ArenaReply
	if err := c.conn.call(ctx, proto.TSave, proto.StepReq{Step: step}, &rep); err != nil {
		return fail(err)
	}
	off, err := c.place(rep.Buffers, rep.ArenaSize)
	if err == nil && rep.Step != step {
		err = fmt.Errorf("the agent opened step %d", rep.Step)
	}
	var arena []byte
	if err == nil {
		arena, err = c.maps.get(rep.Arena, rep.ArenaSize, true)
	}
	if err != nil {
		return fail(c.abort(step, fmt.Errorf("save reply: %w", err)))
	}
	h := newHandle(step)
	c.last = h
	tasks := c.chunks(arena, off, true)
	// The checksum of every chunk is computed as it is copied (the bytes
	// cross the memory bus once) and sent with the commit, so the agent does
	// not read the arena again.
	n := make(map[string]int, len(c.bufs))
	for _, t := range tasks {
		n[t.buf]++
	}
	crcs := make(map[string][]uint32, len(c.bufs))
	for _, b := range c.bufs {
		crcs[b.name] = make([]uint32, n[b.name])
	}
	for i := range tasks {
		b := tasks[i].buf
		tasks[i].crc = &crcs[b][len(crcs[b])-n[b]]
		n[b]--
	}
	go func() {
		t := time.Now()
		err := copyChunks(tasks, c.opt.Workers, func() { c.gate.wait(h.hurry) })
		if err != nil {
			h.finish(fmt.Errorf("save of step %d: %w", step, c.abort(step, fmt.Errorf("copying into the arena: %w", err))))
			return
		}
		copied := time.Now()
		var cr proto.CommitReply
		if err := c.conn.call(context.Background(), proto.TCommit, proto.Commit{Step: step, CRC32C: crcs}, &cr); err != nil {
			h.finish(fmt.Errorf("commit of step %d: %w", step, err))
			return
		}
		h.stats = SaveStats{Seq: cr.Seq, Bytes: cr.Bytes, Copy: copied.Sub(t), Commit: time.Since(copied),
			Checksum: time.Duration(cr.ChecksumS * float64(time.Second))}
		h.finish(nil)
	}()
	return h
}

// abort tells the agent to drop the open save after a failure on this side.
func (c *Client) abort(step int64, cause error) error {
	if err := c.conn.call(context.Background(), proto.TAbort, proto.StepReq{Step: step}, nil); err != nil {
		return fmt.Errorf("%w (and the abort failed: %w)", cause, err)
	}
	return cause
}

// finish waits for the newest save, copying what is left at once; it
// returns that save's error unless the caller already had it from Wait.
func (c *Client) finish(ctx context.Context) error {
	h := c.last
	if h == nil {
		return nil
	}
	h.hurryUp()
	select {
	case <-h.done:
	case <-ctx.Done():
		return fmt.Errorf("waiting for the save of step %d: %w", h.step, ctx.Err())
	}
	c.last = nil
	if h.reported.Load() {
		return nil
	}
	return h.err
}

// Hint announces that the trainer will leave the memory bus alone for d
// from now (the forward and backward passes between optimizer steps, say).
// Once a client has had a hint, its copier copies only inside announced
// windows, and what is left at once when the save is waited for, a new
// save starts, or the client closes.
func (c *Client) Hint(d time.Duration) {
	if c.disabled {
		return
	}
	c.gate.hint(d)
}

// gate holds the copier outside the announced idle windows.
type gate struct {
	mu      sync.Mutex
	hinted  bool
	until   time.Time
	changed chan struct{} // closed and replaced by every hint
}

func (g *gate) init() { g.changed = make(chan struct{}) }

func (g *gate) hint(d time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.hinted = true
	g.until = time.Now().Add(max(d, 0))
	close(g.changed)
	g.changed = make(chan struct{})
}

// wait returns when the copier may copy: no hint was ever given, an idle
// window is open, or hurry is closed.
func (g *gate) wait(hurry <-chan struct{}) {
	for {
		select {
		case <-hurry:
			return
		default:
		}
		g.mu.Lock()
		if !g.hinted || time.Now().Before(g.until) {
			g.mu.Unlock()
			return
		}
		ch := g.changed
		g.mu.Unlock()
		select {
		case <-ch:
		case <-hurry:
			return
		}
	}
}

// task is one chunk to copy; crc, when set, receives the CRC-32C of the
// bytes copied.
type task struct {
	dst, src []byte
	buf      string
	crc      *uint32
}

// chunks splits the copy of every registered buffer to (save) or from
// (restore) the arena into the agent's checksum chunks (the ChunkSize asked
// for at registration, or the agent's default).
func (c *Client) chunks(arena []byte, off []int64, save bool) []task {
	cs := c.layout.ChunkSize
	if cs <= 0 {
		cs = DefaultChunkSize
	}
	var out []task
	for i, b := range c.bufs {
		n := int64(len(b.data))
		for o := int64(0); o < n; o += cs {
			e := min(o+cs, n)
			a, m := arena[off[i]+o:off[i]+e], b.data[o:e]
			if save {
				out = append(out, task{dst: a, src: m, buf: b.name})
			} else {
				out = append(out, task{dst: m, src: a})
			}
		}
	}
	return out
}

// copyChunks copies the tasks with the given number of goroutines, calling
// before (when not nil) ahead of every chunk. A fault on the arena's
// mapping (SIGBUS: the file was truncated, or its tmpfs is full) is
// returned as an error instead of killing the rank.
func copyChunks(tasks []task, workers int, before func()) error {
	var next atomic.Int64
	var failed atomic.Bool
	errs := make([]error, max(workers, 1))
	work := func(w int) {
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true)) // w 0 may be the caller's goroutine
		defer func() {
			if r := recover(); r != nil {
				failed.Store(true)
				errs[w] = faultError(r)
			}
		}()
		for !failed.Load() {
			i := next.Add(1) - 1
			if i >= int64(len(tasks)) {
				return
			}
			if before != nil {
				before()
			}
			if t := &tasks[i]; t.crc != nil {
				*t.crc = tmpfs.CopyCRC(0, t.dst, t.src)
			} else {
				copy(t.dst, t.src)
			}
		}
	}
	if workers <= 1 || len(tasks) <= 1 {
		work(0) // the caller is already off the trainer's path or must wait anyway
		return errs[0]
	}
	var wg sync.WaitGroup
	for w := range min(workers, len(tasks)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			work(w)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func faultError(r any) error {
	var a interface{ Addr() uintptr }
	if e, ok := r.(error); ok && errors.As(e, &a) {
		return fmt.Errorf("memory fault at %#x in the arena mapping (was the arena truncated, or its tmpfs full?): %w", a.Addr(), e)
	}
	panic(r) // not a memory fault: a bug, not a copy failure
}
