//go:build !mpi

// Command reft-train needs MPI: build it with -tags mpi (make build/reft-train).
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "reft-train: built without MPI; build with: go build -tags mpi ./examples/trainer (or make build/reft-train)")
	os.Exit(2)
}
