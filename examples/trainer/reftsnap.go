package main

// The reft client behind train.Snapshotter. Free of MPI and cgo, so the
// adapter and the step agreement are tested (and benchmarked) in-process
// without the mpi build tag; snapshot.go (mpi) supplies the MPI parts.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
	"unsafe"

	"github.com/reft-hpc/reft/client"
	"github.com/reft-hpc/reft/examples/trainer/train"
)

// reftSnap adapts a client session to train.Snapshotter.
type reftSnap struct {
	c          *client.Client
	stopSignal func() // removes the SIGTERM flush; nil without JIT
}

// jitSignalTimeout bounds the flush at SIGTERM: Slurm SIGKILLs a step's
// tasks KillWait after its SIGTERM (30 s by default, 5 s on the test
// cluster), and the process must die of the signal before that.
const jitSignalTimeout = 3 * time.Second

// startJIT makes the session save the newest consistent step (declared by
// the trainer through train.Consistency) when the agent reports a failed
// node, and at SIGTERM. Without notices (an agent from before them) the
// signal flush still runs; log says so.
func (s *reftSnap) startJIT(ctx context.Context, log func(string)) {
	if err := s.c.WatchFailures(ctx); err != nil {
		log("JIT flush on failure notices is off (the SIGTERM flush stays on): " + err.Error())
	}
	s.stopSignal = s.c.FlushOnSignal(jitSignalTimeout)
}

// Consistent tells the client that the buffers hold step (train.Consistency).
func (s *reftSnap) Consistent(step int64) { s.c.Consistent(step) }

// Updating tells the client that the buffers are about to change; it waits
// while a JIT flush copies them (train.Consistency).
func (s *reftSnap) Updating() { s.c.Updating() }

// SetUpdateInterrupt lets the JIT flush stop an update in progress
// (train.UpdateInterrupter).
func (s *reftSnap) SetUpdateInterrupt(fn func()) { s.c.SetUpdateInterrupt(fn) }

// SetStepBack lets the JIT flush step back over the trainer's last complete
// update, saving the step before it as well (train.StepBacker).
func (s *reftSnap) SetStepBack(fn func(ctx context.Context, step int64) (int64, func() error, error)) {
	s.c.SetStepBack(func(ctx context.Context, step int64) (int64, func() error, error) {
		prev, redo, err := fn(ctx, step)
		if errors.Is(err, train.ErrNoStepBack) {
			err = fmt.Errorf("%w: %w", client.ErrStepBackNotNeeded, err)
		}
		return prev, redo, err
	})
}

// Every is the job's SPEC every= (train.Interval): 0 under every=0.
func (s *reftSnap) Every() int { return s.c.Every() }

// flush saves the newest consistent step after training stopped with
// cause (a failed collective: the peers may be gone), within
// jitSignalTimeout; the client logs what it saved.
func (s *reftSnap) flush(cause error) error {
	ctx, cancel := context.WithTimeout(context.Background(), jitSignalTimeout)
	defer cancel()
	_, _, err := s.c.Flush(ctx, "training stopped: "+cause.Error())
	return err
}

// openReft opens a client session with opt. It returns nil (and no error)
// when opt.Optional is set and reft is not enabled for the step, so that
// train.Run logs once that snapshots are off.
func openReft(ctx context.Context, opt client.Options) (*reftSnap, error) {
	c, err := client.Open(ctx, opt)
	if err != nil {
		return nil, err
	}
	if !c.Enabled() {
		return nil, c.Close()
	}
	return &reftSnap{c: c}, nil
}

func (s *reftSnap) Register(name string, buf []byte, replicated bool) error {
	kind := client.Sharded
	if replicated {
		kind = client.Replicated
	}
	return s.c.Register(name, buf, kind)
}

// AOR reports whether the job's SPEC has aor (the agent's hello reply).
func (s *reftSnap) AOR() bool { return s.c.AOR() }

// RegisterOptimizerState registers a ZeRO-1 optimizer shard with its aor
// object (train.AORSnapshotter).
func (s *reftSnap) RegisterOptimizerState(name string, buf []byte, st train.OptimizerState) error {
	o := st.Optimizer
	return s.c.RegisterOptimizerState(name, buf, client.AOR{Optimizer: o.Kind, State: st.State, Beta1: o.Beta1, Beta2: o.Beta2,
		Momentum: o.Momentum, Grad: st.Grad, Shards: st.Shards, Index: st.Index})
}

// Save returns at once; the copy runs in the client's background copier
// and its errors come from Wait.
func (s *reftSnap) Save(step int64) (train.Waiter, error) {
	return saveWaiter{s.c.Save(step)}, nil
}

// Restore is collective: every rank calls it, and the client's Agree picks
// the newest step that every rank holds.
func (s *reftSnap) Restore() (int64, bool, error) {
	return s.c.Restore(context.Background())
}

func (s *reftSnap) Close() error {
	if s.stopSignal != nil {
		s.stopSignal()
	}
	return s.c.Close()
}

// Hint passes the trainer's idle windows to the client's copier.
func (s *reftSnap) Hint(d time.Duration) { s.c.Hint(d) }

// CommPhase passes the trainer's all-reduce to the client: the agent
// pauses its background replication meanwhile, and names the collective
// if the rank hangs in it (train.CommPhaser). The trainer's names are
// constants that CheckCommOp accepts, so an error is a bug: it panics.
func (s *reftSnap) CommPhase(active bool, op string) {
	if !active || op == "" {
		s.c.CommPhase(active)
		return
	}
	if err := s.c.Collective(op); err != nil {
		panic(err)
	}
}

type saveWaiter struct{ h *client.Handle }

// Wait has no deadline: a save only waits on this node's agent, and a dead
// agent closes the socket, which fails the save.
func (w saveWaiter) Wait() error { return w.h.Wait(context.Background()) }

// gatherSteps is an all-gather of every rank's step list over a
// communicator of size ranks whose allGather(dst, src) tiles every rank's
// equally long src into dst in rank order (MPI_Allgather). Lists differ in
// length, so the lengths go first and the lists follow padded to the
// longest.
func gatherSteps(size int, allGather func(dst, src []int64) error, mine []int64) ([][]int64, error) {
	counts := make([]int64, size)
	if err := allGather(counts, []int64{int64(len(mine))}); err != nil {
		return nil, fmt.Errorf("all-gather of the step list lengths: %w", err)
	}
	longest := slices.Max(counts)
	lists := make([][]int64, size)
	if longest == 0 {
		return lists, nil
	}
	if longest > 1<<16 {
		return nil, fmt.Errorf("a rank reports %d generations: not a step list", longest)
	}
	pad := make([]int64, longest)
	copy(pad, mine)
	all := make([]int64, int64(size)*longest)
	if err := allGather(all, pad); err != nil {
		return nil, fmt.Errorf("all-gather of the step lists: %w", err)
	}
	for r := range lists {
		lists[r] = all[int64(r)*longest : int64(r)*longest+counts[r]]
	}
	return lists, nil
}

// agreeOver builds client.Options.Agree from an all-gather (see
// gatherSteps). onThread, when not nil, is checked first: MPI must only be
// called from the thread that initialized it.
func agreeOver(size int, allGather func(dst, src []int64) error, onThread func() error) func(context.Context, []int64) ([]int64, error) {
	return client.Gather(func(ctx context.Context, mine []int64) ([][]int64, error) {
		if onThread != nil {
			if err := onThread(); err != nil {
				return nil, err
			}
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return gatherSteps(size, allGather, mine)
	})
}

// errNotMPIThread is returned when the agreement is called off the MPI thread.
var errNotMPIThread = errors.New("the restore agreement ran off the MPI thread: call Restore from the goroutine that initialized MPI")

// LocalSteps lists this rank's own generations, ascending, for the
// restore without the agreement on a step every rank holds
// (train.LocalRestorer): under --log-messages a stage lost with its node
// restores the peer copy of its last snapshot while the survivors restore
// their JIT flush of a newer step, and the trainer replays the difference
// from the message logs.
func (s *reftSnap) LocalSteps() ([]int64, error) {
	steps, err := s.c.Generations(context.Background())
	if err != nil {
		return nil, fmt.Errorf("listing this rank's generations: %w", err)
	}
	slices.Sort(steps)
	return steps, nil
}

// RestoreLocal restores this rank's own generation of step
// (train.LocalRestorer); a checksum failure wraps
// train.ErrCorruptGeneration.
func (s *reftSnap) RestoreLocal(step int64) error {
	err := s.c.RestoreStep(context.Background(), step)
	var ae *client.Error
	if errors.As(err, &ae) && ae.Code == client.CodeCorrupt {
		return fmt.Errorf("%w: %w", train.ErrCorruptGeneration, err)
	}
	return err
}

// reftLog is the agent's message log of this rank behind train.MessageLog
// (client.LogAppend and the rest): the messages live in the node agent's
// memory, outside the trainer's process, so a relaunched rank's
// neighbours still hold what it needs to replay.
type reftLog struct{ c *client.Client }

func f32bytes(v []float32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), len(v)*4)
}

func (l reftLog) Append(stream string, step int64, seq int, data []float32) error {
	return l.c.LogAppend(stream, step, seq, f32bytes(data))
}

func (l reftLog) Read(stream string, step int64, seq int, dst []float32) error {
	return l.c.LogRead(context.Background(), stream, step, seq, f32bytes(dst))
}

func (l reftLog) Truncate(upTo int64) error { return l.c.LogTruncate(upTo) }

func (l reftLog) Steps(stream string) ([]int64, error) {
	return l.c.LogSteps(context.Background(), stream)
}

// messageLog is the agent's message log of the session (train.MessageLog).
func (s *reftSnap) messageLog() train.MessageLog { return reftLog{s.c} }
