//go:build mpi

package main

/*
#cgo pkg-config: ompi
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <mpi.h>

// reft_wait tests req every ns nanoseconds, sleeping between the tests,
// until it completes: Open MPI's TCP transport progresses only inside MPI
// calls, so each test moves what arrived since the last.
static int reft_wait(MPI_Request *req, long ns) {
	struct timespec ts = { ns / 1000000000L, ns % 1000000000L };
	for (;;) {
		int done = 0;
		int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
		if (rc != MPI_SUCCESS || done) {
			return rc;
		}
		nanosleep(&ts, NULL);
	}
}

static int reft_iallreduce_sum_i64(MPI_Comm c, const int64_t *src, int64_t *dst, int n, long ns) {
	MPI_Request req;
	int rc = MPI_Iallreduce(src, dst, n, MPI_INT64_T, MPI_SUM, c, &req);
	return rc != MPI_SUCCESS ? rc : reft_wait(&req, ns);
}

static int reft_iallgather_f32(MPI_Comm c, const float *src, float *dst, int n, long ns) {
	MPI_Request req;
	int rc = MPI_Iallgather(src, n, MPI_FLOAT, dst, n, MPI_FLOAT, c, &req);
	return rc != MPI_SUCCESS ? rc : reft_wait(&req, ns);
}

static int reft_iallgather_i64(MPI_Comm c, const int64_t *src, int64_t *dst, int n, long ns) {
	MPI_Request req;
	int rc = MPI_Iallgather(src, n, MPI_INT64_T, dst, n, MPI_INT64_T, c, &req);
	return rc != MPI_SUCCESS ? rc : reft_wait(&req, ns);
}

static int reft_ibarrier(MPI_Comm c, long ns) {
	MPI_Request req;
	int rc = MPI_Ibarrier(c, &req);
	return rc != MPI_SUCCESS ? rc : reft_wait(&req, ns);
}

static MPI_Comm reft_world(void) { return MPI_COMM_WORLD; }

// reft_comm_create is MPI_Comm_create over MPI_COMM_WORLD with the group
// of the n world ranks in ranks (collective over the world: each rank
// passes its own group, the groups disjoint).
static int reft_comm_create(const int *ranks, int n, MPI_Comm *out) {
	MPI_Group world, g;
	int rc = MPI_Comm_group(MPI_COMM_WORLD, &world);
	if (rc != MPI_SUCCESS) {
		return rc;
	}
	rc = MPI_Group_incl(world, n, ranks, &g);
	MPI_Group_free(&world);
	if (rc != MPI_SUCCESS) {
		return rc;
	}
	rc = MPI_Comm_create(MPI_COMM_WORLD, g, out);
	MPI_Group_free(&g);
	return rc;
}

static int reft_errors_return(void) {
	return MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

static void reft_error_string(int rc, char *buf, int *len) {
	MPI_Error_string(rc, buf, len);
}
*/
import "C"

import (
	"fmt"
	"time"
	"unsafe"
)

// sleepComm runs a communicator's collectives as nonblocking ones that it
// tests every wait and sleeps between (reft-train --comm-wait): MPI's
// blocking calls poll a core for as long as they wait, so on a node with
// fewer cores than processes the ranks' waits take the CPU from whatever
// else runs there (the agents), which a GPU job's host, whose collectives
// run on the device, does not see. Its own MPI communicator keeps its
// traffic apart from empi's.
type sleepComm struct {
	c    C.MPI_Comm
	wait C.long // nanoseconds between tests
}

func newSleepWorld(wait time.Duration) *sleepComm {
	return &sleepComm{c: C.reft_world(), wait: C.long(wait.Nanoseconds())}
}

// sub creates the sleepComm of the world ranks in ranks (collective over
// the world, as mpiComm.Sub).
func (s *sleepComm) sub(ranks []int) (*sleepComm, error) {
	rs := make([]C.int, len(ranks))
	for i, r := range ranks {
		rs[i] = C.int(r)
	}
	out := &sleepComm{wait: s.wait}
	if err := mpiErr(C.reft_comm_create(&rs[0], C.int(len(rs)), &out.c), "MPI_Comm_create"); err != nil {
		return nil, err
	}
	return out, nil
}

func (s *sleepComm) allReduceSumI64(dst, src []int64) error {
	return mpiErr(C.reft_iallreduce_sum_i64(s.c, (*C.int64_t)(unsafe.Pointer(&src[0])), (*C.int64_t)(unsafe.Pointer(&dst[0])), C.int(len(src)), s.wait),
		"MPI_Iallreduce")
}

func (s *sleepComm) allGatherF32(dst, src []float32) error {
	return mpiErr(C.reft_iallgather_f32(s.c, (*C.float)(unsafe.Pointer(&src[0])), (*C.float)(unsafe.Pointer(&dst[0])), C.int(len(src)), s.wait),
		"MPI_Iallgather")
}

func (s *sleepComm) allGatherI64(dst, src []int64) error {
	return mpiErr(C.reft_iallgather_i64(s.c, (*C.int64_t)(unsafe.Pointer(&src[0])), (*C.int64_t)(unsafe.Pointer(&dst[0])), C.int(len(src)), s.wait),
		"MPI_Iallgather")
}

func (s *sleepComm) barrier() error {
	return mpiErr(C.reft_ibarrier(s.c, s.wait), "MPI_Ibarrier")
}

// errorsReturn makes MPI's errors on the world (and the communicators
// created from it, which inherit it) return to the caller instead of
// aborting the job: under --jit a rank whose collective fails (a peer's
// socket reset by its node's death) must live to flush its consistent
// step before it aborts the job itself.
func errorsReturn() error {
	return mpiErr(C.reft_errors_return(), "MPI_Comm_set_errhandler(MPI_ERRORS_RETURN)")
}

func mpiErr(rc C.int, op string) error {
	if rc == C.MPI_SUCCESS {
		return nil
	}
	buf := make([]byte, C.MPI_MAX_ERROR_STRING)
	var n C.int
	C.reft_error_string(rc, (*C.char)(unsafe.Pointer(&buf[0])), &n)
	return fmt.Errorf("%s: MPI error %d: %s", op, int(rc), buf[:max(0, int(n))])
}
