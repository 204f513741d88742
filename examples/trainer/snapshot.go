//go:build mpi

package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/client"
	"github.com/reft-hpc/reft/examples/trainer/train"
	"github.com/reft-hpc/reft/pmix"
)

// snapshotsOff is what rank 0 logs, once, when the step runs without reft.
const snapshotsOff = "snapshots off: " + client.SocketEnv + " is not set (launch with srun --reft=SPEC to enable them); training without in-memory snapshots"

// openSnapshotter opens the rank's reft client session when the step runs
// under --reft (REFT_AGENT_SOCKET is set); without it, it returns nil, and
// train.Run logs once that snapshots are off. It must run on the MPI
// thread: the restore agreement it sets up is an MPI all-gather over world.
func openSnapshotter(world *mpiComm, cfg train.Config) (train.Snapshotter, error) {
	opt := client.Options{Optional: true, Rank: world.Rank(), World: world.Size()}
	if os.Getenv(client.SocketEnv) != "" {
		// The agent lays out and names its store by the rank it is told;
		// PMIx (or Slurm's variables) and MPI must agree on it.
		topo, err := pmix.Discover()
		if err != nil {
			return nil, fmt.Errorf("rank topology: %w", err)
		}
		if topo.Rank != world.Rank() || topo.Size != world.Size() {
			return nil, fmt.Errorf("%s says rank %d of %d, MPI says rank %d of %d", topo.Source, topo.Rank, topo.Size, world.Rank(), world.Size())
		}
		opt.LocalRank = topo.LocalRank
	}
	opt.Layout = fmt.Sprintf("dp=%d,pp=%d,zero1=%v", cfg.DP, cfg.PP, cfg.Zero1)
	tid := world.tid
	opt.Agree = agreeOver(world.Size(), world.AllGatherI64, func() error {
		if got := unix.Gettid(); got != tid {
			return fmt.Errorf("%w (thread %d, MPI's is %d)", errNotMPIThread, got, tid)
		}
		return nil
	})
	rank := world.Rank()
	opt.Log = func(msg string) { fmt.Fprintf(os.Stderr, "reft: rank %d: %s\n", rank, msg) }
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := openReft(ctx, opt)
	if err != nil || s == nil {
		return nil, err // a nil *reftSnap must not become a non-nil interface
	}
	if cfg.JIT {
		s.startJIT(ctx, opt.Log)
	}
	return s, nil
}
