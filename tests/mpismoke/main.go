//go:build mpi

// Command reft-mpi-smoke checks that MPI over PMIx works on the cluster: every
// rank contributes rank+1 to an AllReduce and verifies the sum n(n+1)/2.
package main

import (
	"fmt"
	"os"
	"runtime"

	"github.com/emer/empi/mpi"
)

func main() {
	// MPI calls must stay on one OS thread.
	runtime.LockOSThread()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "reft-mpi-smoke:", err)
		os.Exit(1)
	}
}

func run() error {
	mpi.Init()
	defer mpi.Finalize()
	comm, err := mpi.NewComm(nil)
	if err != nil {
		return fmt.Errorf("MPI_COMM_WORLD: %w", err)
	}
	rank, size := comm.Rank(), comm.Size()
	orig := []float64{float64(rank + 1)}
	dest := make([]float64, 1)
	if err := comm.AllReduceF64(mpi.OpSum, dest, orig); err != nil {
		return fmt.Errorf("AllReduce: %w", err)
	}
	want := float64(size * (size + 1) / 2)
	host, _ := os.Hostname()
	if dest[0] != want {
		return fmt.Errorf("rank %d/%d on %s: allreduce sum %v, want %v", rank, size, host, dest[0], want)
	}
	fmt.Printf("rank %d/%d host %s allreduce-sum %v ok\n", rank, size, host, dest[0])
	return nil
}
