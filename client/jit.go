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
	"slices"
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
	held       []int64       // the last heldSteps steps committed or restored here
	interrupt  func()        // SetUpdateInterrupt's; nil: none
	stepBack   StepBack      // SetStepBack's; nil: none
	// steppingBack is set while a flush's step-back runs (other flushes
	// wait for it; Updating does not: the trainer's side excludes itself),
	// stepTried once one has run: it is done at most once per client.
	steppingBack, stepTried bool

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

// heldSteps bounds jitState.held: a step-back asks only about the step
// before the newest.
const heldSteps = 8

func (j *jitState) noteCommitted(step int64) {
	j.mu.Lock()
	j.committed = max(j.committed, step)
	if !slices.Contains(j.held, step) {
		if len(j.held) == heldSteps {
			j.held = j.held[1:]
		}
		j.held = append(j.held, step)
	}
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
// why (a failed node, a signal) in the one line the client logs. With a
// step-back (SetStepBack) the first flush that needs one saves the step
// before the consistent one first, then the consistent step.
func (c *Client) Flush(ctx context.Context, reason string) (step int64, saved bool, err error) {
	if c.disabled {
		return -1, false, nil
	}
	j := &c.jit
	j.mu.Lock()
	asked := false
	for j.flushing || j.updating || j.steppingBack {
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
	if j.wantStepBack(step) {
		j.mu.Unlock()
		if prev, saved, err, done := c.stepBackFlush(ctx, step, reason); done {
			return prev, saved, err
		}
		return c.Flush(ctx, reason) // the buffers are unchanged: flush as usual
	}
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

// ErrStepBackNotNeeded, wrapped in a StepBack function's error, says that
// the trainer holds the consistent step s but made it by no complete update
// since it could undo (it was restored, or its update of s+1 was
// interrupted and undone: it passed step s+1's all-reduce, so every
// survivor finished s). The flush then saves s alone, without a word.
var ErrStepBackNotNeeded = errors.New("no step-back needed")

// StepBack is SetStepBack's function: see there.
type StepBack func(ctx context.Context, step int64) (prev int64, redo func() error, err error)

// SetStepBack sets fn (nil: none), which a flush calls, once per client
// and from its own goroutine, when the consistent step s is one whose
// previous step s-1 this client does not hold: fn returns the registered
// buffers to step s-1 in place by undoing the update of step s
// (reft-train --undo keeps what that needs until its next update begins)
// and returns prev (s-1) and redo. The flush saves prev, then calls redo,
// which applies step s's update again (the same bits) and lets the trainer
// go on, and saves s. From fn's return until redo the trainer must neither
// read nor change the buffers, and fn must not return while a save of the
// trainer's own still reads them; after redo, Updating waits for the save
// of s as for any flush. An error from fn means the buffers are unchanged:
// the flush logs it and saves s alone. fn must not call the client.
//
// Why: when a node dies inside a collective, some survivors may have
// finished step s while the others are still blocked in it, holding s-1.
// Their flushes then save s and s-1, the ranks share no newer step than
// their last periodic save (none under every=0), and the restore
// agreement goes back to it. With every survivor holding its newest step
// and the one before, the ranks agree on s-1 at worst (one step lost), and
// on s when every survivor finished it. s-1 is saved first because the
// agent keeps a rank's newest commit and drops a step at or above it as
// a superseded timeline.
func (c *Client) SetStepBack(fn StepBack) {
	j := &c.jit
	j.mu.Lock()
	j.stepBack = fn
	j.mu.Unlock()
}

// wantStepBack says whether a flush of step steps back first; j.mu is held.
func (j *jitState) wantStepBack(step int64) bool {
	// Not to step 0: the state before the first update is where every
	// rank starts anyway, with nothing to restore.
	return j.stepBack != nil && !j.stepTried && step >= 2 && !slices.Contains(j.held, step-1)
}

// stepBackFlush is Flush with the step-back (SetStepBack) of the consistent
// step: it saves step-1, then step. done is false when the trainer could
// not step back (it logs why), with the buffers unchanged. It gives fn half
// of ctx's time, so that the plain flush that follows a refusal has the
// rest.
func (c *Client) stepBackFlush(ctx context.Context, step int64, reason string) (last int64, saved bool, err error, done bool) {
	j := &c.jit
	j.mu.Lock()
	j.stepTried, j.steppingBack = true, true
	j.mu.Unlock()
	finish := func(flushing bool) {
		j.mu.Lock()
		j.steppingBack, j.flushing = false, flushing
		j.signalLocked()
		j.mu.Unlock()
	}
	t := time.Now()
	bctx := ctx
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		bctx, cancel = context.WithDeadline(ctx, t.Add(time.Until(dl)/2))
		defer cancel()
	}
	prev, redo, err := func() (int64, func() error, error) {
		prev, redo, err := j.stepBack(bctx, step)
		if err == nil && prev != step-1 {
			err = errors.Join(fmt.Errorf("the trainer stepped back to step %d, not %d", prev, step-1), redo())
		}
		return prev, redo, err
	}()
	if err != nil {
		finish(false)
		if errors.Is(err, ErrStepBackNotNeeded) {
			return 0, false, nil, false
		}
		c.opt.Log(fmt.Sprintf("JIT flush (%s): step %d not stepped back, so step %d is not saved: %v; "+
			"if another survivor is still inside step %d the ranks will agree on an older step", reason, step, step-1, err, step))
		return 0, false, nil, false
	}
	// The buffers hold prev now, and the trainer is kept out until redo.
	var hp *Handle
	savePrev := func() error {
		j.mu.Lock()
		j.consistent, j.flushing = prev, true
		j.epoch++
		epoch := j.epoch
		j.mu.Unlock()
		c.mu.Lock()
		hp = c.save(prev)
		hp.jit, hp.epoch = true, epoch
		c.mu.Unlock()
		return hp.Wait(ctx)
	}
	perr := savePrev()
	if perr != nil && ctx.Err() != nil {
		// Out of time: the copy may still read the buffers, so redo (and
		// the trainer) wait for it.
		go func() {
			<-hp.done
			rerr := redo()
			j.mu.Lock()
			if rerr == nil {
				j.consistent = step
			}
			j.mu.Unlock()
			finish(false)
		}()
		return prev, false, fmt.Errorf("JIT flush of step %d (%s): the save of step %d (step %d's update undone): %w", step, reason, prev, step, perr), true
	}
	if rerr := redo(); rerr != nil {
		// The buffers are not step's: keep the trainer out of a flush of
		// them and let its next Updating go on.
		finish(false)
		return prev, perr == nil, fmt.Errorf("JIT flush of step %d (%s): redoing step %d's update after saving step %d: %w", step, reason, step, prev, rerr), true
	}
	j.mu.Lock()
	j.consistent = step
	j.epoch++
	epoch := j.epoch
	j.mu.Unlock()
	if perr != nil {
		c.opt.Log(fmt.Sprintf("JIT flush (%s): the save of step %d (step %d's update undone) failed: %v", reason, prev, step, perr))
	}
	// Saved again even when committed before: prev's commit superseded it.
	c.mu.Lock()
	h := c.save(step)
	h.jit, h.epoch = true, epoch
	c.mu.Unlock()
	serr := h.Wait(ctx)
	select {
	case <-h.done:
		finish(false)
	default:
		go func() { <-h.done; finish(false) }() // Updating waits for the copy
	}
	if serr != nil {
		return step, perr == nil, fmt.Errorf("JIT flush of step %d (%s), after step %d: %w", step, reason, prev, serr), true
	}
	if perr == nil {
		c.opt.Log(fmt.Sprintf("JIT save of steps %d and %d (step %d's update undone, saved, redone) committed in %.1f ms (%s)",
			prev, step, step, float64(time.Since(t).Microseconds())/1e3, reason))
	} else {
		c.opt.Log(fmt.Sprintf("JIT save of step %d committed in %.1f ms (%s)", step, float64(time.Since(t).Microseconds())/1e3, reason))
	}
	return step, true, nil, true
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
