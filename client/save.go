package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"github.com/reft-hpc/reft/internal/crc32c"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/reft-hpc/reft/agent/proto"
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
	// jit marks a flush's save (jit.go), of the buffers as they were at
	// Updating count epoch.
	jit   bool
	epoch uint64
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
// from the handle's Wait. When a JIT flush (jit.go) has just saved step and
// the buffers have not changed since, that save's handle is returned.
//
// Under every=0 (Every() == 0) Save copies nothing: it sends the agent the
// progress heartbeat of step instead (hang detection counts saves, see
// Progress), says once that snapshots are left to the JIT flush, and
// returns a finished handle (with the heartbeat's error, if any). The
// flush itself still saves: call Consistent and Updating as always.
func (c *Client) Save(step int64) *Handle {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.disabled && c.every == 0 {
		return c.heartbeat(step)
	}
	if h := c.jitDuplicate(step); h != nil {
		return h
	}
	return c.save(step)
}

// heartbeat is Save under every=0: the progress message of step instead
// of a snapshot. c.mu is held.
func (c *Client) heartbeat(step int64) *Handle {
	c.everyed.Do(func() {
		c.opt.Log("every=0 (" + c.hello.Spec + "): no snapshot on the step path; Save sends a progress heartbeat, " +
			"and a failure is covered by the JIT flush of the live state (WatchFailures, FlushOnSignal)")
	})
	fail := func(err error) *Handle {
		return finished(step, fmt.Errorf("save of step %d (every=0: progress heartbeat): %w", step, err))
	}
	switch {
	case c.closed:
		return fail(errClosed)
	case step < 0:
		return fail(errors.New("the step must not be negative"))
	case len(c.bufs) == 0:
		return fail(errors.New("nothing is registered; register the rank's buffers first"))
	}
	ctx := context.Background()
	_ = c.finish(ctx) // a flush's save still running: its handle reports its error
	if err := c.register(ctx); err != nil {
		return fail(err)
	}
	if err := c.conn.call(ctx, proto.TProgress, proto.StepReq{Step: step}, nil); err != nil {
		return fail(err)
	}
	return finished(step, nil)
}

// save is Save with c.mu held.
func (c *Client) save(step int64) *Handle {
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
	regions, sections, err := c.layoutOf(&rep, true)
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
	// The checksum of every chunk is computed as it is copied (the bytes
	// cross the memory bus once) and sent with the commit, so the agent does
	// not read the arena again.
	tasks, crcs := c.saveTasks(arena, regions, sections)
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
		c.jit.noteCommitted(step)
		if msg := c.degraded.note(cr.Degraded); msg != "" {
			c.opt.Log(msg)
		}
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

// CommPhase says that the rank enters (true) or leaves (false) a
// communication phase, such as its gradient allreduce. The agent pauses
// its background replication (the network copies of unreplicated buffers)
// while any rank on the node is in one, so that replication uses the
// network in the gaps (GEMINI's interleaving). It sends one small frame
// that the agent does not answer, and nothing when the phase is unchanged,
// so a trainer can call it around every collective. A broken connection
// shows at the next Save or Restore. A disabled client does nothing.
func (c *Client) CommPhase(active bool) {
	if c.disabled || c.conn == nil {
		return
	}
	_ = c.conn.commNotice(active, "")
}

// Collective says that the rank enters the collective op, a communication
// phase as CommPhase(true) that names what the rank waits in ("gradient
// all-reduce"): if the rank hangs there, or another rank hangs while it
// waits there, the agent's verdict says so. CommPhase(false) leaves it.
// The error is for an op that cannot name anything (longer than
// proto.MaxCommOp bytes, or not printable); a broken connection shows at
// the next Save or Restore, as with CommPhase.
func (c *Client) Collective(op string) error {
	if err := proto.CheckCommOp(op); err != nil {
		return fmt.Errorf("reft: Collective: %w", err)
	}
	if c.disabled || c.conn == nil {
		return nil
	}
	_ = c.conn.commNotice(true, op)
	return nil
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

// piece is one contiguous copy; a nil dst (in a verified restore) means
// src is only checksummed.
type piece struct{ dst, src []byte }

// task is one chunk to copy, as pieces in arena order; crc, when set,
// receives the CRC-32C of the pieces' bytes (copied, or only read where
// dst is nil), continued from piece to piece, so that it is the chunk's
// whichever regions fill it.
type task struct {
	pieces []piece
	crc    *uint32
}

func (c *Client) chunkSize() int64 {
	if cs := c.layout.ChunkSize; cs > 0 {
		return cs
	}
	return DefaultChunkSize
}

func (c *Client) data() map[string][]byte {
	out := make(map[string][]byte, len(c.bufs))
	for _, b := range c.bufs {
		out[b.name] = b.data
	}
	return out
}

func byArena(a, b proto.Region) int { return cmp.Compare(a.ArenaOffset, b.ArenaOffset) }

// saveTasks cuts a save into the agent's checksum chunks of every section
// (the ChunkSize asked for at registration, or the agent's default), in
// arena order, and returns them with the checksum lists they fill, keyed
// by section. A save's regions fill its sections exactly (layoutOf checked
// it), so a chunk's pieces, copied in arena order, are all of its bytes.
func (c *Client) saveTasks(arena []byte, regions []proto.Region, sections []proto.Section) ([]task, map[string][]uint32) {
	cs, bufs := c.chunkSize(), c.data()
	regs := slices.SortedFunc(slices.Values(regions), byArena)
	secs := slices.SortedFunc(slices.Values(sections), func(a, b proto.Section) int { return cmp.Compare(a.ArenaOffset, b.ArenaOffset) })
	crcs := make(map[string][]uint32, len(secs))
	n := 0
	for _, s := range secs {
		crcs[s.Name] = make([]uint32, (s.Size+cs-1)/cs)
		n += len(crcs[s.Name])
	}
	// A piece ends where a region or a chunk ends, so there are at most
	// this many: all never grows, and the tasks' slices of it stay valid.
	all := make([]piece, 0, len(regs)+n)
	tasks := make([]task, 0, n)
	j := 0 // the first region not copied to its end
	for _, s := range secs {
		for k := range crcs[s.Name] {
			lo := s.ArenaOffset + int64(k)*cs
			hi := min(lo+cs, s.ArenaOffset+s.Size)
			first := len(all)
			for ; j < len(regs) && regs[j].ArenaOffset < hi; j++ {
				r := regs[j]
				a, b := max(lo, r.ArenaOffset), min(hi, r.ArenaOffset+r.Size)
				at := r.Offset - r.ArenaOffset // buffer offset = arena offset + at
				all = append(all, piece{dst: arena[a:b], src: bufs[r.Buffer][a+at : b+at]})
				if r.ArenaOffset+r.Size > hi {
					break // the rest of it is in the next chunk
				}
			}
			tasks = append(tasks, task{pieces: all[first:len(all):len(all)], crc: &crcs[s.Name][k]})
		}
	}
	return tasks, crcs
}

// restoreTasks cuts a restore into pieces of at most a chunk of every
// region, in arena order.
func (c *Client) restoreTasks(arena []byte, regions []proto.Region) []task {
	cs, bufs := c.chunkSize(), c.data()
	regs := slices.SortedFunc(slices.Values(regions), byArena)
	var all []piece
	for _, r := range regs {
		for o := int64(0); o < r.Size; o += cs {
			e := min(o+cs, r.Size)
			all = append(all, piece{dst: bufs[r.Buffer][r.Offset+o : r.Offset+e], src: arena[r.ArenaOffset+o : r.ArenaOffset+e]})
		}
	}
	tasks := make([]task, len(all))
	for i := range all {
		tasks[i].pieces = all[i : i+1 : i+1]
	}
	return tasks
}

// verifiedRestoreTasks cuts a restore into the generation's checksum
// chunks (chunkSize, counted from each section's start), in arena order:
// each task copies its chunk's pieces of the regions and checksums the
// whole chunk, the bytes between regions included (read, not copied), so
// that its CRC-32C is the chunk's as the manifest records it. Chunks that
// no region reads are left out: nothing of them reaches the buffers. check,
// after the copy, lists the chunks whose CRC-32C is not want's.
func (c *Client) verifiedRestoreTasks(arena []byte, regions []proto.Region, sections []proto.Section, chunkSize int64,
	want map[string][]uint32) ([]task, func() []proto.MisreadChunk, error) {
	if chunkSize <= 0 {
		return nil, nil, fmt.Errorf("the agent's restore reply has checksums but chunk_size %d (docs/PROTOCOL.md, \"Restore verified by the client\")", chunkSize)
	}
	bufs := c.data()
	regs := slices.SortedFunc(slices.Values(regions), byArena)
	secs := slices.SortedFunc(slices.Values(sections), func(a, b proto.Section) int { return cmp.Compare(a.ArenaOffset, b.ArenaOffset) })
	type chunk struct {
		section string
		index   int
		want    uint32
	}
	var (
		tasks  []task
		chunks []chunk
	)
	j := 0 // the first region that does not end before the chunk
	for _, s := range secs {
		n := (s.Size + chunkSize - 1) / chunkSize
		for k := range n {
			lo := s.ArenaOffset + k*chunkSize
			hi := min(lo+chunkSize, s.ArenaOffset+s.Size)
			for j < len(regs) && regs[j].ArenaOffset+regs[j].Size <= lo {
				j++
			}
			if j == len(regs) || regs[j].ArenaOffset >= hi {
				continue // no region reads this chunk
			}
			crcs, ok := want[s.Name]
			if !ok || int64(len(crcs)) != n {
				return nil, nil, fmt.Errorf("the agent's restore reply has %d checksums for section %q (%d bytes in chunks of %d), want %d (docs/PROTOCOL.md, \"Restore verified by the client\")",
					len(crcs), s.Name, s.Size, chunkSize, n)
			}
			var ps []piece
			at := lo
			for _, r := range regs[j:] {
				if r.ArenaOffset >= hi {
					break
				}
				a, b := max(at, r.ArenaOffset), min(hi, r.ArenaOffset+r.Size)
				if a > at {
					ps = append(ps, piece{src: arena[at:a]}) // between regions: checksummed only
				}
				d := r.Offset - r.ArenaOffset // buffer offset = arena offset + d
				ps = append(ps, piece{dst: bufs[r.Buffer][a+d : b+d], src: arena[a:b]})
				at = b
			}
			if at < hi {
				ps = append(ps, piece{src: arena[at:hi]})
			}
			tasks = append(tasks, task{pieces: ps})
			chunks = append(chunks, chunk{s.Name, int(k), crcs[k]})
		}
	}
	got := make([]uint32, len(tasks))
	for i := range tasks {
		tasks[i].crc = &got[i]
	}
	check := func() []proto.MisreadChunk {
		var bad []proto.MisreadChunk
		for i, ch := range chunks {
			if got[i] != ch.want {
				bad = append(bad, proto.MisreadChunk{Section: ch.section, Index: ch.index, Got: got[i]})
			}
		}
		return bad
	}
	return tasks, check, nil
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
				var crc uint32
				for _, p := range t.pieces {
					if p.dst == nil { // a restore's bytes between regions
						crc = crc32c.Update(crc, p.src)
					} else {
						crc = crc32c.Copy(crc, p.dst, p.src)
					}
				}
				*t.crc = crc
			} else {
				for _, p := range t.pieces {
					copy(p.dst, p.src)
				}
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
