//go:build mpi

package main

// The stage-local replay (train/replay.go) over real Open MPI, where sends
// of messages above the eager limit block until the receiver posts its
// receive: `make unit` runs this test binary under mpirun -n 3. Each
// process is one pipeline stage and keeps its own in-memory snapshots and
// message log, which live on between the two trainings of the scenario
// (reft-train itself cannot replay yet: docs/LOGGING.md).

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"regexp"
	"runtime"
	"testing"

	"github.com/emer/empi/mpi"

	"github.com/reft-hpc/reft/examples/trainer/train"
)

// mpiReplay is what this rank's scenario found, checked by TestMPIReplay.
var mpiReplay struct {
	rank, size int
	err        error
	want, got  *train.Result
	out        string // rank 0's lines of the replaying training
}

// TestMain runs the scenario on the main goroutine, locked to the thread
// that initializes MPI (MPI is called from that thread only), then the
// tests.
func TestMain(m *testing.M) {
	runtime.LockOSThread()
	mpi.Init()
	world, err := newMPIComm()
	if err == nil {
		mpiReplay.rank, mpiReplay.size = world.Rank(), world.Size()
		err = replayScenario(world)
		if err == nil {
			mpiCommWait.err = commWaitScenario(world)
		}
	}
	mpiReplay.err = err
	code := m.Run()
	if (err != nil || mpiCommWait.err != nil) && mpiReplay.size > 1 {
		abortWorld() // the other ranks may wait for this one
	}
	mpi.Finalize()
	os.Exit(code)
}

// replayScenario: an uninterrupted 12-step run (the reference); a logged
// run to step 9 with snapshots every 3 steps; stage 1 then loses its
// generation 9 and its log (its node), and a logged run to step 12
// restores each stage's newest generation: stage 1 replays 7..9 from its
// neighbours' logs over MPI while stages 0 and 2 serve them.
func replayScenario(world *mpiComm) error {
	if world.Size() != 3 {
		return fmt.Errorf("the scenario needs 3 ranks, got %d: run this test binary under mpirun -n 3 (make unit does)", world.Size())
	}
	cfg := train.Defaults()
	cfg.Steps, cfg.PP, cfg.Layers, cfg.SizeBytes = 12, 3, 3, 4<<20
	cfg.Batch, cfg.Micro, cfg.SaveEvery, cfg.LogEvery, cfg.Threads, cfg.Optimizer = 32, 8, 3, 3, 1, train.AdamW
	if err := cfg.Validate(world.Size()); err != nil {
		return err
	}
	want, err := train.Run(cfg, train.Options{Comm: world})
	if err != nil {
		return fmt.Errorf("reference run: %w", err)
	}
	mpiReplay.want = want

	rank := world.Rank()
	cfg.LogMessages = train.LogBubble
	store := train.NewMemStore(world.Size())
	log := train.NewMemLog(train.DefaultLogCap)
	first := cfg
	first.Steps = 9
	snap := store.Rank(rank)
	if _, err := train.Run(first, train.Options{Comm: world, Snap: snap, MsgLog: log}); err != nil {
		return fmt.Errorf("logged run to step 9: %w", err)
	}
	if err := snap.Close(); err != nil {
		return err
	}
	if rank == 1 {
		store.Lose(1, 6)
		log = train.NewMemLog(train.DefaultLogCap)
	}
	var out bytes.Buffer
	got, err := train.Run(cfg, train.Options{Comm: world, Snap: store.Rank(rank), MsgLog: log, Log: &out})
	if err != nil {
		return fmt.Errorf("replaying run: %w", err)
	}
	mpiReplay.got, mpiReplay.out = got, out.String()
	return nil
}

func TestMPIReplay(t *testing.T) {
	r := &mpiReplay
	if r.err != nil {
		t.Fatalf("rank %d: %v", r.rank, r.err)
	}
	if got, want := r.got.ResumedFrom, map[bool]int64{true: 6, false: 9}[r.rank == 1]; got != want {
		t.Errorf("rank %d resumed from %d, want %d", r.rank, got, want)
	}
	if got, want := r.got.Replayed, map[bool]int64{true: 3, false: 0}[r.rank == 1]; got != want {
		t.Errorf("rank %d replayed %d steps, want %d", r.rank, got, want)
	}
	for i := range r.want.Params {
		if !sameBits(r.got.Params[i], r.want.Params[i]) {
			t.Errorf("rank %d tensor %d differs from the uninterrupted run", r.rank, i)
		}
	}
	if r.rank == 0 {
		if r.got.Hash != r.want.Hash {
			t.Errorf("final-params-sha256 %s, uninterrupted %s", r.got.Hash, r.want.Hash)
		}
		if !regexp.MustCompile(`(?m)^REPLAY stage 1 from 6 to 9 steps 3 seconds [0-9.]+$`).MatchString(r.out) {
			t.Errorf("no REPLAY line for stage 1 in:\n%s", r.out)
		}
	}
}

// sameBits compares a and b bit for bit.
func sameBits(a, b []float32) bool {
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
