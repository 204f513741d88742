package client

// Just-in-time flush (the JIT checkpointing paper; docs/ARCHITECTURE.md,
// "JIT flush"). When another node of the job fails, the surviving ranks are
// typically blocked in a collective that the dead rank never joins, holding
// the consistent state of their last finished step. Saving that state at
// once, when it is newer than the last committed generation, bounds the
// lost work to the step in progress whatever the snapshot interval.
//
// The trainer tells the client where its state stands: Consistent(step)
// once the buffers hold the whole state of step (after the optimizer
// update), Updating() before it changes them again. A flush saves only a
// consistent step, never while the trainer is updating (it waits for the
// next Consistent, or gives up), and never beside a save of the trainer's
// own: it goes through Save, which takes turns with the trainer's calls.
// Updating blocks while a flush copies the buffers.
//
// Three triggers: a peer failure notice from the agent (WatchFailures), a
// termination signal (FlushOnSignal: Slurm kills a step with SIGTERM, then
// SIGKILL after KillWait), and the trainer itself (Flush), e.g. when a
// collective fails.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/reft-hpc/reft/agent/proto"
)

// DefaultJITWait is how long a flush after a failure notice waits for the
// trainer to reach a consistent step when Options.JITWait is 0.
const DefaultJITWait = 10 * time.Second

// jitState is where the trainer's state stands, for flushes.
type jitState struct {
	mu         sync.Mutex
	changed    chan struct{} // closed and replaced at every change
	consistent int64         // the step the buffers hold; -1: none declared
	updating   bool          // between Updating and the next Consistent
	epoch      uint64        // counts Updating calls: the buffers' version
	flushing   bool          // a flush runs (and may be copying the buffers)
	committed  int64         // newest step committed or restored here; -1: none
	interrupt  func()        // SetUpdateInterrupt's; nil: none

	// The watcher of the agent's notices (WatchFailures).
	watchConn   *conn
	watchCancel context.CancelFunc
	watchDone   chan struct{}
}

func (j *jitState) init() {
	j.changed = make(chan struct{})
	j.consistent, j.committed = -1, -1
}

// signalLocked wakes every waiter; j.mu is held.
func (j *jitState) signalLocked() {
	close(j.changed)
	j.changed = make(chan struct{})
}

func (j *jitState) noteCommitted(step int64) {
	j.mu.Lock()
	j.committed = max(j.committed, step)
	j.mu.Unlock()
}

// Consistent declares that the registered buffers hold the whole state of
// step (call it after the optimizer update of step, before the trainer's
// Save of it) and will not change until Updating. A failure notice or
// signal from then on saves step at once if it is newer than the newest
// step committed. Without calls to Consistent no flush ever saves.
func (c *Client) Consistent(step int64) {
	if c.disabled || step < 0 {
		return
	}
	j := &c.jit
	j.mu.Lock()
	j.consistent, j.updating = step, false
	j.signalLocked()
	j.mu.Unlock()
}

// Updating declares that the trainer is about to change the registered
// buffers (call it before the optimizer update). It waits while a flush
// copies them, so that the flushed step is never torn.
func (c *Client) Updating() {
	if c.disabled {
		return
	}
	j := &c.jit
	j.mu.Lock()
	for j.flushing {
		ch := j.changed
		j.mu.Unlock()
		<-ch
		j.mu.Lock()
	}
	j.updating = true
	j.epoch++
	j.signalLocked()
	j.mu.Unlock()
}

// SetUpdateInterrupt sets fn (nil: none), which a flush calls, from its
// own goroutine and once per flush, when it finds the trainer updating
// (between Updating and Consistent): a trainer that can undo its update
// (reft-train --undo) stops at its next tensor boundary, undoes the applied
// part and declares the previous step Consistent again, so the flush saves
// that step instead of waiting for an update that a failed peer may keep
// from ending. fn must return at once and must not call the client.
func (c *Client) SetUpdateInterrupt(fn func()) {
	j := &c.jit
	j.mu.Lock()
	j.interrupt = fn
	j.mu.Unlock()
}

// Flush saves the consistent step now if it is newer than the newest step
// committed (or restored) by this client, waiting until ctx ends for the
// trainer to finish an update in progress. It returns the consistent step
// (-1: none declared) and whether this call saved it; a step that the
// trainer is already saving is waited for, not saved twice. reason says
// why (a failed node, a signal) in the one line the client logs.
func (c *Client) Flush(ctx context.Context, reason string) (step int64, saved bool, err error) {
	if c.disabled {
		return -1, false, nil
	}
	j := &c.jit
	j.mu.Lock()
	asked := false
	for j.flushing || j.updating {
		if j.updating && !asked && j.interrupt != nil {
			// The trainer can undo its update: ask it to, rather than
			// wait for an update that may never end.
			asked = true
			fn := j.interrupt
			j.mu.Unlock()
			fn()
			j.mu.Lock()
			continue
		}
		ch := j.changed
		j.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return -1, false, fmt.Errorf("JIT flush (%s): the trainer is changing its state and did not reach a consistent step in time: %w", reason, ctx.Err())
		}
		j.mu.Lock()
	}
	step, epoch := j.consistent, j.epoch
	if step < 0 || step <= j.committed {
		j.mu.Unlock()
		return step, false, nil
	}
	j.flushing = true
	j.mu.Unlock()
	release := func() {
		j.mu.Lock()
		j.flushing = false
		j.signalLocked()
		j.mu.Unlock()
	}

	t := time.Now()
	h, own := c.saveJIT(step, epoch)
	if err := h.Wait(ctx); err != nil {
		select {
		case <-h.done:
			release()
		default:
			// Out of time with the copy still running: the trainer must
			// not change the buffers under it, so Updating waits on.
			go func() { <-h.done; release() }()
		}
		return step, false, fmt.Errorf("JIT flush of step %d (%s): %w", step, reason, err)
	}
	release()
	if !own {
		return step, false, nil
	}
	c.opt.Log(fmt.Sprintf("JIT save of step %d committed in %.1f ms (%s)", step, float64(time.Since(t).Microseconds())/1e3, reason))
	return step, true, nil
}

// saveJIT starts the flush's save of step, unless the trainer's own save
// of it is the newest: then it returns that handle and own false.
func (c *Client) saveJIT(step int64, epoch uint64) (h *Handle, own bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l := c.last; l != nil && l.step == step && !l.jit {
		select {
		case <-l.done:
			if l.err == nil {
				return l, false
			}
		default:
			return l, false
		}
	}
	h = c.save(step)
	h.jit, h.epoch = true, epoch
	return h, true
}

// jitDuplicate is the flush's save of step when the trainer now saves the
// same step with the buffers unchanged since: the trainer then gets that
// save instead of a second copy. c.mu is held.
func (c *Client) jitDuplicate(step int64) *Handle {
	l := c.last
	if l == nil || !l.jit || l.step != step {
		return nil
	}
	c.jit.mu.Lock()
	same := l.epoch == c.jit.epoch
	c.jit.mu.Unlock()
	if !same {
		return nil
	}
	select {
	case <-l.done:
		if l.err != nil {
			return nil
		}
	default:
	}
	return l
}

// WatchFailures opens a second connection to the agent that receives its
// notices (docs/PROTOCOL.md, "Notices") and, at each peer failure notice,
// flushes (see Flush), waiting up to Options.JITWait for a consistent
// step. Close stops it. A disabled client does nothing.
func (c *Client) WatchFailures(ctx context.Context) error {
	if c.disabled {
		return nil
	}
	j := &c.jit
	j.mu.Lock()
	running := j.watchConn != nil
	j.mu.Unlock()
	if running {
		return nil
	}
	cn, err := dial(ctx, c.opt.Socket)
	if err != nil {
		return fmt.Errorf("watching failure notices: %w", err)
	}
	hello := proto.Hello{Client: "reft-go/0.1 notices", PID: os.Getpid(), Step: os.Getenv("REFT_STEP_ID"), Rank: c.opt.Rank}
	var wr proto.WatchReply
	// err is the function's own (not one scoped to an if), so that a failed
	// hello or watch is returned rather than dropped.
	if err = cn.call(ctx, proto.THello, hello, nil); err == nil {
		err = cn.call(ctx, proto.TWatch, nil, &wr)
	}
	if err != nil {
		cn.close()
		var ae *Error
		if errors.As(err, &ae) && ae.Code == CodeUnknownType {
			return fmt.Errorf("watching failure notices: the agent (%s) has no notices; JIT flush needs an agent of this client's release: %w", c.hello.AgentVersion, err)
		}
		return fmt.Errorf("watching failure notices: %w", err)
	}
	wctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	j.mu.Lock()
	j.watchConn, j.watchCancel, j.watchDone = cn, cancel, done
	j.mu.Unlock()
	go func() {
		defer close(done)
		for {
			f, err := proto.Decode(cn.r)
			if err != nil {
				return // closed by Close, or the agent is gone
			}
			if f.Type != proto.TNotice {
				continue
			}
			var n proto.Notice
			if f.Unmarshal(&n) != nil || n.Kind != proto.NoticePeerFailure {
				continue // a kind this client does not know
			}
			wait := c.opt.JITWait
			if wait <= 0 {
				wait = DefaultJITWait
			}
			fctx, fcancel := context.WithTimeout(wctx, wait)
			reason := "node " + n.Node + " failed: " + n.Cause
			step, saved, err := c.Flush(fctx, reason)
			fcancel()
			switch {
			case wctx.Err() != nil:
				return
			case err != nil:
				c.opt.Log(err.Error())
			case !saved && step >= 0:
				c.opt.Log(fmt.Sprintf("JIT flush after %s: step %d is already saved", reason, step))
			}
		}
	}()
	return nil
}

// stopWatch ends WatchFailures and waits for its goroutine; c.mu must not
// be held (a flush in progress may be waiting for it).
func (c *Client) stopWatch() {
	j := &c.jit
	j.mu.Lock()
	cn, cancel, done := j.watchConn, j.watchCancel, j.watchDone
	j.watchConn = nil
	j.mu.Unlock()
	if cn == nil {
		return
	}
	cancel()
	cn.close()
	<-done
}

// signalLinger is how long FlushOnSignal waits after its flush before the
// signal takes its course (Slurm's KillWait, 30 s by default, leaves room).
const signalLinger = time.Second

// FlushOnSignal installs a handler for sigs (none: SIGTERM, which Slurm
// sends to every task of a step it kills, SIGKILL following after
// KillWait): at the first of them it flushes, waiting at most timeout,
// which must leave room inside KillWait, lingers signalLinger for the
// other ranks to flush too, then re-raises the signal with its
// default action, so the process ends as it would have. stop removes the
// handler. A disabled client installs nothing.
func (c *Client) FlushOnSignal(timeout time.Duration, sigs ...os.Signal) (stop func()) {
	if c.disabled {
		return func() {}
	}
	if len(sigs) == 0 {
		sigs = []os.Signal{syscall.SIGTERM}
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, sigs...)
	quit := make(chan struct{})
	var once sync.Once
	go func() {
		select {
		case <-quit:
			return
		case s := <-ch:
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			step, saved, err := c.Flush(ctx, "signal "+s.String())
			cancel()
			switch {
			case err != nil:
				c.opt.Log(err.Error())
			case !saved && step >= 0:
				c.opt.Log(fmt.Sprintf("JIT flush at signal %s: step %d is already saved", s, step))
			}
			// The other ranks got the signal too and may still be
			// flushing: this rank's exit closes its connections, and MPI
			// aborts a peer that sees one close, flush or not.
			time.Sleep(signalLinger)
			signal.Reset(sigs...)
			if ss, ok := s.(syscall.Signal); ok {
				syscall.Kill(os.Getpid(), ss)
			}
		}
	}()
	return func() {
		once.Do(func() {
			signal.Stop(ch)
			close(quit)
		})
	}
}
