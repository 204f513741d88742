package train

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// JIT step-back (docs/UNDO.md, "Survivors on either side of a step
// boundary"). When a node dies inside the gradient all-reduce of step s,
// some survivors may finish step s (the dead rank's part had reached them)
// while the others stay blocked in it, holding s-1. Under --undo the
// complete update of s stays undoable until the next update begins (its
// gradient is kept in undoGrad), so the JIT flush of a rank that finished
// s undoes s, saves s-1, redoes s and saves s (client.SetStepBack): every
// survivor then holds s-1, and the restore agreement loses at most one
// step.
//
// In a pipeline the same holds per stage: a stage that finished step s
// while a lost neighbour left another inside it waits for step s+1's
// input, and its flush saves s-1 and s; the job then goes on from s-1
// where that leaves only the lost stage to replay (replay.go,
// replayTarget).
//
// Concurrency: the step-back runs on the flush's goroutine. The gate keeps
// it and the trainer apart: the trainer holds it except inside the
// communication that reads none of the state (the gradient all-reduce,
// the loss reduction, a pipeline stage's sends and receives of
// activations and gradients) and after Run returns; the step-back takes
// it, so it runs only while the trainer is blocked there or has stopped.
// It puts back the same bits it took, so what the trainer computed from
// the parameters before (a forward pass of the next step's first
// microbatches) stays valid.

// ErrNoStepBack is the step-back's error when the trainer holds the step
// but made it by no update it can undo: restored, or the update after it
// was interrupted and undone (so it passed the next all-reduce, and every
// survivor finished the step). Nothing is lost by saving the step alone.
var ErrNoStepBack = errors.New("no complete update to undo, and none needed")

// StepBacker is a snapshotter whose JIT flush can step back over the
// trainer's last complete update (client.Client.SetStepBack): fn undoes the
// update of step in place and returns step-1 and redo, which applies the
// update again and gives the state back to the trainer.
type StepBacker interface {
	SetStepBack(fn func(ctx context.Context, step int64) (prev int64, redo func() error, err error))
}

func (t *trainer) lockGate()   { t.gate <- struct{}{}; t.holding = true }
func (t *trainer) unlockGate() { t.holding = false; <-t.gate }

// installStepBack gives s the step-back under --undo and --jit where it is
// correct: data parallelism, every buffer replicated. Where it is not, and
// the job saves less often than every step (so that the survivors' flushes
// can straddle a step boundary), rank 0 says once why.
func (t *trainer) installStepBack(s Snapshotter) {
	sb, ok := s.(StepBacker)
	if !ok || t.undo == nil || !t.cfg.JIT || t.stepGrad != nil { // AOR saves every step
		return
	}
	sparse := t.cfg.SaveEvery != 1
	if iv, ok := s.(Interval); ok && iv.Every() == 0 {
		sparse = true
	}
	var why string
	switch {
	case t.cfg.Zero1 && t.cfg.DP > 1:
		why = "--zero1: undoing a complete update would need the other ranks' parameter shards from before the all-gather"
	default:
		sb.SetStepBack(t.stepBack)
		return
	}
	if sparse {
		fmt.Fprintf(t.log, "undo: no JIT step-back under %s; survivors whose flushes straddle a step boundary then agree on their last common step, "+
			"not the one before the newest (docs/UNDO.md)\n", why)
	}
}

// stepBack is the StepBacker function: see there and client.SetStepBack.
func (t *trainer) stepBack(ctx context.Context, step int64) (int64, func() error, error) {
	select {
	case t.gate <- struct{}{}:
	case <-ctx.Done():
		return 0, nil, fmt.Errorf("the trainer reached no collective and did not stop in time: %w", ctx.Err())
	}
	unlock := func() { <-t.gate }
	if err := t.waitSave(); err != nil { // the trainer's save reads the buffers
		unlock()
		return 0, nil, fmt.Errorf("the trainer's save in flight failed: %w", err)
	}
	switch {
	case t.state[0] != step:
		unlock()
		return 0, nil, fmt.Errorf("the trainer moved on to step %d", t.state[0])
	case !t.undo.kept():
		unlock()
		return 0, nil, fmt.Errorf("step %d was restored, or the update after it interrupted and undone: %w", step, ErrNoStepBack)
	}
	lo := 0
	if t.cfg.Zero1 {
		lo = t.dpIdx * t.shardLen
	}
	p := t.params[lo : lo+len(t.undoGrad)]
	t.undo.undo(t.opt, p, t.cfg.Threads)
	t.state[0]--
	t.state[1]--
	redo := func() error {
		defer t.steppedOnce.Do(func() { close(t.stepped) })
		defer unlock()
		t.state[1]++
		t.opt.prepare(t.state[1])
		if err := t.undo.apply(t.opt, p, t.undoGrad, t.cfg.Threads, nil); err != nil {
			return fmt.Errorf("redoing the update of step %d: %w", step, err)
		}
		t.undo.commit()
		t.state[0]++
		return nil
	}
	return t.state[0], redo, nil
}

// holdBeforeUpdate is --hold-before-update's hold, after the gradient
// all-reduce of step: the chosen ranks stand in for ranks still blocked in
// it. Once a JIT flush has stepped back (HoldMax at most) a held rank
// stays blocked, as such a rank would, in a receive that nothing matches
// (a tag of its own, from itself), until the job is torn down: returning
// would end the job (reft-train aborts MPI on an error) before the other
// survivors' flushes.
func (t *trainer) holdBeforeUpdate(step int64) error {
	c := &t.cfg
	if t.resumed || step != c.HoldBeforeStep || !slices.Contains(c.HoldBeforeRanks, t.rank) {
		return nil
	}
	t.note(fmt.Sprintf("hold-before-update: rank %d holds after step %d's gradient all-reduce, before its update, until a JIT flush steps back", t.rank, step))
	select {
	case <-t.stepped:
	case <-time.After(HoldMax):
		return fmt.Errorf("--hold-before-update %d:%d: no JIT flush stepped back within %v", step, t.rank, HoldMax)
	}
	err := t.world.RecvF32(t.rank, tagHold, make([]float32, 1))
	return fmt.Errorf("--hold-before-update %d:%d: held after the JIT flush stepped back, until the job ends: %w", step, t.rank, err)
}
