//go:build mpi

package main

/*
#cgo pkg-config: ompi
#include <mpi.h>

// Open MPI's MPI_COMM_WORLD and MPI_ERRORS_RETURN are macros over its
// globals; a C function keeps cgo off them.
static int reft_errors_return(void) {
	return MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}
*/
import "C"

import "fmt"

// abortWorld ends every rank of the job with exit status 1. empi's
// Comm.Abort passes error code 0, and Open MPI exits with that code, so a
// failed rank (a restore that could not complete) looked to srun, and to
// reft run, like a step that completed.
func abortWorld() {
	C.MPI_Abort(C.MPI_COMM_WORLD, 1)
}

// errorsReturn makes a failed MPI call on the world communicator, and on
// the communicators split from it (they inherit its handler), return its
// error instead of aborting the process. With MPI_ERRORS_ARE_FATAL, the
// default, a survivor whose collective saw the dead peer first (Open MPI
// can, within a second, when the peer's host refuses the connection) died
// before the agent's failure notice came, and its JIT flush never ran
// (seen in TestJITNodeLoss on a loaded machine: no rank flushed, the
// relaunch went back to the last periodic snapshot). Now the error reaches
// train.Run, and main flushes the consistent step before abortWorld.
func errorsReturn() error {
	if rc := C.reft_errors_return(); rc != C.MPI_SUCCESS {
		return fmt.Errorf("MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN): error %d", int(rc))
	}
	return nil
}
