//go:build mpi

// Command reft-train is the reference MPI trainer: a deterministic MLP
// (package train) over MPI. Run it under srun --mpi=pmix with dp*pp ranks;
// rank 0 prints "step N loss X", "mean-step-ms: X" and
// "final-params-sha256: <hex>".
//
// --fail-at STEP:RANK makes that rank SIGKILL itself at the start of STEP,
// but only in a run that did not resume from a snapshot: a relaunch with the
// same flags restores and must not die again.
//
// --hold-in-update STEP:TENSOR (with --undo and --jit) makes every rank stop
// inside its update of STEP before TENSOR until a JIT flush interrupts it
// (each rank says so on stderr): the test of a node lost while the
// survivors are inside the optimizer step (docs/UNDO.md, "every=0").
//
// --hold-before-update STEP:RANK[,RANK...] (with --undo and --jit, plain data
// parallelism) makes those ranks stop after STEP's gradient all-reduce,
// before their update, until a JIT flush has stepped back, and stay blocked
// until the job is torn down; the others say when they finished STEP: the test of survivors on either side
// of a step boundary (docs/UNDO.md).
//
// The surviving ranks of a --fail-at run block in MPI until the step is torn
// down: launch with srun -K1 (--kill-on-bad-exit) unless reft's launcher
// does that.
//
// Snapshots: under srun --reft=SPEC (REFT_AGENT_SOCKET set) every rank opens
// a reft client session, registers its parameters, optimizer state (Sharded
// under --zero1) and step counter, restores the newest step that every rank
// holds in its node's store ("resumed from step N" on rank 0, training goes
// on at N+1) and snapshots every --save-every steps (default 1). The copy
// of a snapshot runs in the background while the next step's single-threaded
// gradient accumulation leaves cores idle (--hints; docs/BENCHMARKS.md has
// the overhead). Without reft it trains without snapshots and rank 0 says so
// once.
//
// --ckpt-dir DIR replaces reft's snapshots with what jobs do without reft:
// a synchronous, fsynced checkpoint to per-rank files in DIR (a shared
// filesystem) every --save-every steps, and a resume from the newest
// complete one (train.FileCheckpoint; the goodput benchmark's status quo).
//
// --log-messages=sync|bubble (--pp >= 2, --dp 1) makes every stage log the
// activations and gradients it sends, for a stage-local replay after a
// failure (docs/LOGGING.md). The log is in-process memory for now, so it
// serves the cost measurement, not a recovery: the replay needs logs that
// outlive the rank, which reft's agent will keep.
//
// Memory per rank is about 6x the stage's parameter bytes with adam/adamw
// (parameters, float32 gradients, int64 fixed-point gradients, two moments),
// less the moments' (dp-1)/dp under --zero1; --undo adds one float32 copy of
// the optimizer range (the last update's gradient, kept for the JIT
// step-back) and a byte per element per buffer.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"syscall"

	"github.com/emer/empi/mpi"

	"github.com/reft-hpc/reft/client"

	"github.com/reft-hpc/reft/examples/trainer/train"
)

func main() {
	// MPI calls must stay on one OS thread.
	runtime.LockOSThread()
	os.Exit(run())
}

func run() int {
	mpi.Init()
	world, err := newMPIComm()
	if err != nil {
		fmt.Fprintln(os.Stderr, "reft-train: MPI_COMM_WORLD:", err)
		return 1
	}
	rank0 := world.Rank() == 0
	cfg, err := train.ParseArgs(os.Args[1:], usageWriter(rank0))
	if err == nil {
		err = cfg.Validate(world.Size())
	}
	if errors.Is(err, flag.ErrHelp) {
		mpi.Finalize()
		return 0
	}
	if err != nil {
		// Every rank sees the same flags: one error line, from rank 0.
		if rank0 {
			fmt.Fprintln(os.Stderr, "reft-train:", err)
		}
		mpi.Finalize()
		return 2
	}
	if cfg.CommWait > 0 {
		world.nb = newSleepWorld(cfg.CommWait)
	}
	if cfg.JIT {
		if err := errorsReturn(); err != nil {
			fmt.Fprintf(os.Stderr, "reft-train: rank %d: --jit: %v\n", world.Rank(), err)
			abortWorld()
			return 1
		}
	}
	var snap train.Snapshotter
	if cfg.CkptDir != "" {
		// The status quo (FileCheckpoint); never both it and reft.
		if os.Getenv(client.SocketEnv) != "" {
			if rank0 {
				fmt.Fprintf(os.Stderr, "reft-train: --ckpt-dir and reft snapshots (srun --reft) are exclusive: drop --ckpt-dir or launch with --reft=off\n")
			}
			mpi.Finalize()
			return 2
		}
		snap = train.NewFileCheckpoint(cfg.CkptDir, os.Stdout)
	} else {
		snap, err = openSnapshotter(world, cfg)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "reft-train: rank %d: snapshots: %v\n", world.Rank(), err)
		abortWorld()
		return 1
	}
	var msgLog train.MessageLog
	if rs, ok := snap.(*reftSnap); ok && cfg.LogMessages != train.LogOff {
		// Under reft the node's agent holds the log: it outlives this
		// process, so a relaunch replays from it (docs/LOGGING.md).
		msgLog = rs.messageLog()
	} else if cfg.LogMessages != train.LogOff {
		msgLog = train.NewMemLog(cfg.LogCap)
		if rank0 && snap != nil {
			fmt.Printf("message-log: --log-messages=%s keeps each rank's log in its own process memory (train.MemLog, --log-cap %d bytes): "+
				"it does not outlive the process, so a relaunch has no logs to replay; under srun --reft the node's agent holds them (docs/LOGGING.md)\n",
				cfg.LogMessages, cfg.LogCap)
		}
	}
	opts := train.Options{
		Comm:    world,
		Snap:    snap,
		MsgLog:  msgLog,
		SnapOff: snapshotsOff,
		Log:     os.Stdout,
		Note:    func(msg string) { fmt.Fprintln(os.Stderr, "reft-train:", msg) },
		Kill: func() error {
			fmt.Fprintf(os.Stderr, "reft-train: rank %d: --fail-at %d:%d: SIGKILL\n", world.Rank(), cfg.FailStep, cfg.FailRank)
			if err := syscall.Kill(os.Getpid(), syscall.SIGKILL); err != nil {
				return fmt.Errorf("--fail-at: kill self: %w", err)
			}
			select {} // SIGKILL is not delivered synchronously
		},
	}
	_, err = train.Run(cfg, opts)
	if rs, ok := snap.(*reftSnap); ok && err != nil && cfg.JIT {
		// A failed collective leaves this rank's last step consistent.
		if ferr := rs.flush(err); ferr != nil {
			fmt.Fprintf(os.Stderr, "reft-train: rank %d: %v\n", world.Rank(), ferr)
		}
	}
	if snap != nil {
		if cerr := snap.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close snapshots: %w", cerr)
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "reft-train: rank %d: %v\n", world.Rank(), err)
		if world.Size() > 1 {
			abortWorld() // the other ranks would block in collectives forever
		}
		return 1
	}
	mpi.Finalize()
	return 0
}

func usageWriter(rank0 bool) io.Writer {
	if rank0 {
		return os.Stderr
	}
	return io.Discard
}
