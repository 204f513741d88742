package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/reft-hpc/reft/agent/proto"
)

// Generations lists this rank's committed steps on this node, newest first.
// A disabled client has none.
func (c *Client) Generations(ctx context.Context) ([]int64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.disabled {
		return nil, nil
	}
	if c.closed {
		return nil, fmt.Errorf("generations: %w", errClosed)
	}
	return c.generations(ctx)
}

func (c *Client) generations(ctx context.Context) ([]int64, error) {
	// The agent knows the connection's rank from its registration.
	if len(c.bufs) > 0 {
		if err := c.register(ctx); err != nil {
			return nil, err
		}
	}
	var rep proto.GenerationsReply
	if err := c.conn.call(ctx, proto.TGenerations, nil, &rep); err != nil {
		return nil, fmt.Errorf("listing generations: %w", err)
	}
	steps := make([]int64, len(rep.Generations))
	for i, g := range rep.Generations {
		steps[i] = g.Step
	}
	return steps, nil
}

// Progress tells the agent that this rank reached step (the progress
// heartbeat): a rank that reports no progress, nor saves, for the agent's
// detect.hang is declared hung. Trainers that save less often than every
// step call it every step; it costs one round trip on the local socket.
// It registers the buffers first if needed (the agent knows a rank by its
// registration). A disabled client does nothing.
func (c *Client) Progress(ctx context.Context, step int64) error {
	if step < 0 {
		return fmt.Errorf("progress: step %d must not be negative", step)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.disabled {
		return nil
	}
	if c.closed {
		return fmt.Errorf("progress: %w", errClosed)
	}
	if len(c.bufs) == 0 {
		return fmt.Errorf("progress(%d): nothing is registered; register the rank's buffers first (the agent knows a rank by its registration)", step)
	}
	if err := c.register(ctx); err != nil {
		return err
	}
	if err := c.conn.call(ctx, proto.TProgress, proto.StepReq{Step: step}, nil); err != nil {
		return fmt.Errorf("progress of step %d: %w", step, err)
	}
	return nil
}

// Restore fills every registered buffer from the newest step that every
// rank of the job holds and returns it; ok is false when there is none
// (start fresh). With World > 1 it is a collective: every rank must call
// it, and Options.Agree picks the step. It first finishes an outstanding
// save. With World > 1 no rank returns success unless every rank does:
// after the copy the ranks agree again (Options.Agree, see there), and if
// any rank failed, every rank's Restore returns a *RestoreError naming the
// failed ranks (its buffers may then hold the step's bytes). A generation
// found corrupt is dropped by the agent and the failed rank's error has
// Code CodeCorrupt; calling Restore again (on every rank) picks the newest
// step that is left.
func (c *Client) Restore(ctx context.Context) (step int64, ok bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.disabled {
		c.notice()
		return 0, false, nil
	}
	if c.closed {
		return 0, false, fmt.Errorf("restore: %w", errClosed)
	}
	if c.opt.World > 1 && c.opt.Agree == nil {
		return 0, false, fmt.Errorf("restore: World = %d needs Options.Agree: every rank must restore the same step, "+
			"and only the job's communicator (MPI, torch.distributed) can tell which steps all ranks hold; "+
			"pass client.Gather(yourAllGather) or call RestoreStep with an agreed step", c.opt.World)
	}
	mine, err := c.prepareRestore(ctx)
	if c.opt.World <= 1 {
		if err != nil {
			return 0, false, fmt.Errorf("restore: %w", err)
		}
		step, ok = CommonNewest([][]int64{mine})
		if !ok {
			return 0, false, nil
		}
		if err := c.restore(ctx, step); err != nil {
			return 0, false, err
		}
		return step, true, nil
	}
	// Take part even after a local failure (with no steps), so that the
	// other ranks are not left waiting in the collective.
	all, aerr := c.opt.Agree(ctx, mine)
	if aerr != nil {
		return 0, false, errors.Join(fmt.Errorf("restore: agreeing on the step with the other ranks: %w", aerr), err)
	}
	step, ok = -1, false
	if err != nil {
		err = fmt.Errorf("restore: %w", err)
	} else if step, ok = CommonNewest([][]int64{all, mine}); ok {
		err = c.restore(ctx, step)
	} else {
		step = -1
	}
	// Agree again: no rank trains unless every rank holds the step.
	failed, more, aerr := agreeFailed(ctx, c.opt.Agree, c.opt.Rank, c.opt.World, err != nil)
	if aerr != nil {
		return 0, false, errors.Join(fmt.Errorf("restore: agreeing with the other ranks that every rank restored: %w", aerr), err)
	}
	if err != nil && !slices.Contains(failed, c.opt.Rank) {
		failed = append(failed, c.opt.Rank) // an Agree that breaks its contract must not hide our own failure
		slices.Sort(failed)
	}
	if len(failed) > 0 {
		return 0, false, &RestoreError{Step: step, Ranks: failed, More: more, Err: err}
	}
	if !ok {
		if len(mine) > 0 {
			// Not a first launch: committed work is being thrown away.
			c.opt.Log(fmt.Sprintf("restore: this rank holds step(s) %v, but no step is held by every rank of the job: starting from the beginning; "+
				"the agents' logs say which generations each node kept", mine))
		}
		return 0, false, nil
	}
	return step, true, nil
}

// RestoreError is Restore's error on every rank when a rank of the job
// could not restore: no rank may train from a state the others lack.
type RestoreError struct {
	Step  int64 // the agreed step; -1 when a rank failed before one was chosen
	Ranks []int // the ranks that failed, ascending (at most maxNamedRanks)
	More  bool  // more ranks failed than Ranks names
	Err   error // this rank's own failure; nil on the ranks that restored
}

func (e *RestoreError) Error() string {
	return restoreFailedMessage(e.Step, e.Ranks, e.More) + ownFailure(e.Err)
}

func (e *RestoreError) Unwrap() error { return e.Err }

// restoreFailedMessage is the text every rank reports; the Python client
// (reft/session.py) writes the same.
func restoreFailedMessage(step int64, ranks []int, more bool) string {
	names := make([]string, len(ranks))
	for i, r := range ranks {
		names[i] = strconv.Itoa(r)
	}
	who := "rank " + names[0]
	if len(names) > 1 {
		who = "ranks " + strings.Join(names, ", ")
	}
	if more {
		who += " and more"
	}
	what := fmt.Sprintf("restore of step %d failed on %s", step, who)
	if step < 0 {
		what = fmt.Sprintf("restore failed on %s before a step was chosen", who)
	}
	return what + ": no rank may train from a state the others lack, so restore fails on every rank; " +
		"the failed rank's error and its node's agent log say why; call restore again on every rank " +
		"(a corrupt generation is dropped, so the ranks agree on an older step) or restart the job"
}

func ownFailure(err error) string {
	if err == nil {
		return ""
	}
	return " (this rank: " + err.Error() + ")"
}

// The outcome agreement names failed ranks through Agree's contract alone
// (it returns the values every rank passed): each round splits the ranges
// of ranks that hold a failure into up to outcomeBuckets parts, and every
// rank passes the indexes of the parts it does not fail in, so the parts
// missing from the result hold failed ranks. All is well after one round;
// naming f failed ranks of W takes 1 + ceil(log_64 W) rounds, each passing
// at most maxNamedRanks * outcomeBuckets values.
const (
	outcomeBuckets = 64
	maxNamedRanks  = 16
)

// agreeFailed runs the outcome agreement of a rank (failed: this rank
// failed) and returns the failed ranks, ascending; more is true when more
// than maxNamedRanks parts held failures and only the first are named.
func agreeFailed(ctx context.Context, agree func(context.Context, []int64) ([]int64, error), rank, world int, failed bool) (ranks []int, more bool, err error) {
	mine := []int64{0}
	if failed {
		mine = []int64{}
	}
	got, err := agree(ctx, mine)
	if err != nil || slices.Contains(got, 0) {
		return nil, false, err
	}
	ranges := [][2]int{{0, world}} // [lo, hi): each holds a failed rank
	for slices.ContainsFunc(ranges, func(r [2]int) bool { return r[1]-r[0] > 1 }) {
		var parts [][2]int
		for _, r := range ranges {
			n := r[1] - r[0]
			k := min(outcomeBuckets, n)
			for i := range k {
				parts = append(parts, [2]int{r[0] + i*n/k, r[0] + (i+1)*n/k})
			}
		}
		mine = mine[:0]
		for i, p := range parts {
			if !failed || rank < p[0] || rank >= p[1] {
				mine = append(mine, int64(i))
			}
		}
		if got, err = agree(ctx, mine); err != nil {
			return nil, false, err
		}
		clean := map[int64]bool{}
		for _, i := range got {
			clean[i] = true
		}
		ranges = ranges[:0]
		for i, p := range parts {
			if !clean[int64(i)] {
				ranges = append(ranges, p)
			}
		}
		if len(ranges) > maxNamedRanks {
			ranges, more = ranges[:maxNamedRanks], true
		}
	}
	for _, r := range ranges {
		ranks = append(ranks, r[0])
	}
	return ranks, more, nil
}

// prepareRestore finishes the outstanding save and lists this rank's steps.
func (c *Client) prepareRestore(ctx context.Context) ([]int64, error) {
	if err := c.finish(ctx); err != nil && ctx.Err() != nil {
		return nil, err // a failed save is its own handle's news; a timeout is ours
	}
	if err := c.register(ctx); err != nil {
		return nil, err
	}
	return c.generations(ctx)
}

// RestoreStep fills every registered buffer from exactly step. Every rank
// must choose the same step; Restore does the choosing.
func (c *Client) RestoreStep(ctx context.Context, step int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.disabled {
		c.notice()
		return fmt.Errorf("restore of step %d: reft is off (%s is not set)", step, SocketEnv)
	}
	if c.closed {
		return fmt.Errorf("restore of step %d: %w", step, errClosed)
	}
	if step < 0 {
		return fmt.Errorf("restore of step %d: the step must not be negative", step)
	}
	if err := c.finish(ctx); err != nil && ctx.Err() != nil {
		return fmt.Errorf("restore of step %d: %w", step, err)
	}
	if err := c.register(ctx); err != nil {
		return fmt.Errorf("restore of step %d: %w", step, err)
	}
	return c.restore(ctx, step)
}

// maxReportedBad bounds a release's bad_chunks, so that it fits in a frame
// however much of an arena is corrupt.
const maxReportedBad = 1024

// restore asks the agent for step, copies the arena into the buffers and
// releases the arena. The client verifies every chunk's CRC-32C as it
// copies it (crc32c.Copy), so the arena is read once; it reports chunks
// that fail in its release, and the agent, which verifies them in the
// arena and marks the generation bad, answers corrupt. An agent that
// verified the generation itself replies without checksums, and the client
// only copies.
func (c *Client) restore(ctx context.Context, step int64) error {
	var rep proto.ArenaReply
	if err := c.conn.call(ctx, proto.TRestore, proto.Restore{Step: step, Verify: proto.VerifyClient}, &rep); err != nil {
		return fmt.Errorf("restore of step %d: %w", step, err)
	}
	regions, sections, err := c.layoutOf(&rep, false)
	if err == nil && rep.Step != step {
		err = fmt.Errorf("the agent restored step %d", rep.Step)
	}
	var arena []byte
	if err == nil {
		arena, err = c.maps.get(rep.Arena, rep.ArenaSize, false)
	}
	var bad []proto.MisreadChunk
	if err == nil {
		var tasks []task
		var check func() []proto.MisreadChunk
		if rep.CRC32C != nil {
			tasks, check, err = c.verifiedRestoreTasks(arena, regions, sections, rep.ChunkSize, rep.CRC32C)
		} else {
			tasks = c.restoreTasks(arena, regions)
		}
		if err == nil {
			if cerr := copyChunks(tasks, c.opt.RestoreWorkers, nil); cerr != nil {
				err = fmt.Errorf("copying out of the arena: %w", cerr)
			} else if check != nil {
				bad = check()
			}
		}
	}
	// Release even after a failure: the agent keeps the arena out of reuse
	// until then.
	report := bad[:min(len(bad), maxReportedBad)] // the agent verifies every chunk anyway
	rerr := c.conn.call(ctx, proto.TRelease, proto.Release{Step: step, BadChunks: report}, nil)
	switch {
	case rerr != nil && len(bad) > 0:
		err = errors.Join(err, rerr) // the agent's verdict: corrupt, naming the chunks
	case rerr != nil:
		err = errors.Join(err, fmt.Errorf("releasing the arena: %w", rerr))
	case len(bad) > 0:
		// Only an agent that ignored the report answers without an error.
		err = errors.Join(err, &Error{Code: CodeCorrupt, Message: fmt.Sprintf(
			"%d chunk(s) of the restored generation fail their CRC-32C (first: section %q chunk %d), and the agent did not confirm it; restore an older step",
			len(bad), bad[0].Section, bad[0].Index)})
	}
	if err != nil {
		return fmt.Errorf("restore of step %d: %w", step, err)
	}
	c.jit.noteCommitted(step) // a JIT flush need not save it again
	return nil
}

// Common returns the steps present in every list, newest (largest) first;
// none when lists is empty.
func Common(lists [][]int64) []int64 {
	if len(lists) == 0 {
		return nil
	}
	out := slices.Clone(lists[0])
	slices.Sort(out)
	out = slices.Compact(out)
	for _, l := range lists[1:] {
		out = slices.DeleteFunc(out, func(s int64) bool { return !slices.Contains(l, s) })
	}
	slices.Reverse(out)
	return out
}

// CommonNewest is the largest step present in every list: the step a job
// restores. ok is false when no step is common (or there are no lists).
func CommonNewest(lists [][]int64) (int64, bool) {
	c := Common(lists)
	if len(c) == 0 {
		return 0, false
	}
	return c[0], true
}

// Gather turns an all-gather over the job's communicator (every rank's
// list, in any order) into an Options.Agree.
func Gather(allGather func(ctx context.Context, mine []int64) ([][]int64, error)) func(context.Context, []int64) ([]int64, error) {
	return func(ctx context.Context, mine []int64) ([]int64, error) {
		lists, err := allGather(ctx, mine)
		if err != nil {
			return nil, err
		}
		return Common(lists), nil
	}
}
