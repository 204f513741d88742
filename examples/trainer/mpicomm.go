//go:build mpi

package main

import (
	"errors"
	"fmt"

	"github.com/emer/empi/mpi"
	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/examples/trainer/train"
)

// mpiComm adapts empi to train.Comm.
type mpiComm struct {
	c     *mpi.Comm
	world bool
	tmp   []int64
	tid   int // the OS thread MPI was initialized on (main locks it)
	// nb, when set (--comm-wait), runs the collectives; empi the rest.
	nb *sleepComm
}

// newMPIComm wraps MPI_COMM_WORLD; call it on the thread that called
// mpi.Init.
func newMPIComm() (*mpiComm, error) {
	c, err := mpi.NewComm(nil)
	if err != nil {
		return nil, err
	}
	return &mpiComm{c: c, world: true, tid: unix.Gettid()}, nil
}

func (m *mpiComm) Rank() int { return m.c.Rank() }
func (m *mpiComm) Size() int { return m.c.Size() }

func (m *mpiComm) Barrier() error {
	if m.nb != nil {
		return m.nb.barrier()
	}
	return m.c.Barrier()
}

// reduceChunk bounds the scratch buffer: MPI forbids aliasing send and
// receive buffers, and a whole-model copy would double the gradient memory.
const reduceChunk = 1 << 22

func (m *mpiComm) AllReduceSumI64(buf []int64) error {
	if m.tmp == nil {
		m.tmp = make([]int64, min(len(buf), reduceChunk))
	}
	for off := 0; off < len(buf); off += reduceChunk {
		end := min(off+reduceChunk, len(buf))
		if cap(m.tmp) < end-off {
			// A longer reduction than the first (the replay's
			// agreement after the loss's single value).
			m.tmp = make([]int64, end-off)
		}
		src := m.tmp[:end-off]
		copy(src, buf[off:end])
		var err error
		if m.nb != nil {
			err = m.nb.allReduceSumI64(buf[off:end], src)
		} else {
			err = m.c.AllReduceI64(mpi.OpSum, buf[off:end], src)
		}
		if err != nil {
			return fmt.Errorf("MPI_Allreduce of %d int64 at %d: %w", end-off, off, err)
		}
	}
	return nil
}

func (m *mpiComm) AllGatherF32(dst, src []float32) error {
	if len(dst) != len(src)*m.Size() {
		return fmt.Errorf("allgather: dst has %d elements, want %d x %d", len(dst), m.Size(), len(src))
	}
	if len(src) == 0 {
		return nil
	}
	if m.nb != nil {
		return m.nb.allGatherF32(dst, src)
	}
	return m.c.AllGatherF32(dst, src)
}

// AllGatherI64 is MPI_Allgather of equally long src from every member into
// dst, in rank order.
func (m *mpiComm) AllGatherI64(dst, src []int64) error {
	if len(dst) != len(src)*m.Size() {
		return fmt.Errorf("allgather: dst has %d elements, want %d x %d", len(dst), m.Size(), len(src))
	}
	if len(src) == 0 {
		return nil
	}
	if m.nb != nil {
		return m.nb.allGatherI64(dst, src)
	}
	return m.c.AllGatherI64(dst, src)
}

func (m *mpiComm) SendF32(to, tag int, v []float32) error {
	if len(v) == 0 {
		return errors.New("send: empty message")
	}
	return m.c.SendF32(to, tag, v)
}

func (m *mpiComm) RecvF32(from, tag int, v []float32) error {
	if len(v) == 0 {
		return errors.New("recv: empty message")
	}
	return m.c.RecvF32(from, tag, v)
}

// Sub creates the caller's group communicator with MPI_Comm_create, which is
// collective over MPI_COMM_WORLD (each rank passing its own, disjoint group),
// so it is only offered on the world communicator.
func (m *mpiComm) Sub(ranks []int) (train.Comm, error) {
	if !m.world {
		return nil, errors.New("sub-communicators of sub-communicators are not supported")
	}
	c, err := mpi.NewComm(ranks)
	if err != nil {
		return nil, fmt.Errorf("MPI_Comm_create %v: %w", ranks, err)
	}
	sub := &mpiComm{c: c, tid: m.tid}
	if m.nb != nil {
		if sub.nb, err = m.nb.sub(ranks); err != nil {
			return nil, fmt.Errorf("--comm-wait: %w", err)
		}
	}
	return sub, nil
}
