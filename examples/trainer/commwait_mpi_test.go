//go:build mpi

package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/reft-hpc/reft/examples/trainer/train"
)

// mpiCommWait is what this rank's --comm-wait scenario found, checked by
// TestCommWaitSameBits.
var mpiCommWait struct {
	err       error
	cases     []string
	want, got []*train.Result
}

// commWaitScenario trains each layout twice over real Open MPI, with MPI's
// blocking collectives and with --comm-wait's nonblocking ones tested every
// 200us (MPI_Iallreduce, MPI_Iallgather and MPI_Ibarrier on communicators
// of their own, sub-communicators included): the same bits, or the
// benchmark that uses it would compare different trainings.
func commWaitScenario(world *mpiComm) error {
	for _, c := range []struct {
		name      string
		dp, pp    int
		zero1     bool
		optimizer string
	}{
		{"dp3-zero1-adamw", 3, 1, true, train.AdamW},
		{"pp3-momentum", 1, 3, false, train.Momentum},
	} {
		cfg := train.Defaults()
		cfg.Steps, cfg.DP, cfg.PP, cfg.Layers, cfg.SizeBytes, cfg.Zero1 = 6, c.dp, c.pp, 3, 1<<20, c.zero1
		cfg.Batch, cfg.Micro, cfg.LogEvery, cfg.Threads, cfg.Optimizer = 24, 4, 6, 1, c.optimizer
		if err := cfg.Validate(world.Size()); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		want, err := train.Run(cfg, train.Options{Comm: world})
		if err != nil {
			return fmt.Errorf("%s, blocking collectives: %w", c.name, err)
		}
		sleeping := &mpiComm{c: world.c, world: true, tid: world.tid, nb: newSleepWorld(200 * time.Microsecond)}
		got, err := train.Run(cfg, train.Options{Comm: sleeping})
		if err != nil {
			return fmt.Errorf("%s, --comm-wait 200us: %w", c.name, err)
		}
		mpiCommWait.cases = append(mpiCommWait.cases, c.name)
		mpiCommWait.want, mpiCommWait.got = append(mpiCommWait.want, want), append(mpiCommWait.got, got)
	}
	return nil
}

func TestCommWaitSameBits(t *testing.T) {
	r := &mpiCommWait
	if r.err != nil {
		t.Fatalf("rank %d: %v", mpiReplay.rank, r.err)
	}
	if len(r.cases) != 2 {
		t.Fatalf("rank %d: %d of 2 layouts trained", mpiReplay.rank, len(r.cases))
	}
	for i, name := range r.cases {
		if r.got[i].Hash != r.want[i].Hash {
			t.Errorf("%s: final-params-sha256 %s with --comm-wait, %s with blocking collectives", name, r.got[i].Hash, r.want[i].Hash)
		}
		for k := range r.want[i].Params {
			if !sameBits(r.got[i].Params[k], r.want[i].Params[k]) {
				t.Errorf("%s: rank %d tensor %d differs between --comm-wait and blocking collectives", name, mpiReplay.rank, k)
			}
		}
	}
}
