package client

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/hostmem/cuda"
)

// HostRegistrar page-locks host memory for a GPU runtime, so that a
// device-to-host copy into an arena is a DMA straight into it rather than
// through the runtime's bounce buffer. *cuda.Runtime (hostmem/cuda) is one.
// Register may return cuda.ErrNoContext: the process uses no GPU yet, so
// nothing was registered and a later mapping tries again.
type HostRegistrar interface {
	Register(b []byte) error
	Unregister(b []byte) error
}

var (
	processCUDAOnce sync.Once
	processCUDA     *cuda.Runtime
)

// defaultRegistrar is the CUDA runtime this process has loaded itself (a
// trainer using CUDA), once per process; nil when it has none: reft never
// loads CUDA into a process that does not use it.
func defaultRegistrar() HostRegistrar {
	processCUDAOnce.Do(func() { processCUDA = cuda.Loaded() })
	if !processCUDA.Available() {
		return nil
	}
	return processCUDA
}

// mapping is one arena file mapped into this process.
type mapping struct {
	path       string
	write      bool
	data       []byte
	registered bool // with the GPU runtime
	refused    bool // the GPU runtime refused it: not tried again
}

type mapKey struct {
	path  string
	write bool
}

// arenas caches mappings by path and mode: the agent reuses an arena for
// later generations, so mapping it once saves the mmap and the page faults
// of every later save or restore. Saves map read-write, restores read-only,
// so one path can have one mapping of each kind. Callers serialize access.
//
// Read-write mappings are registered with the GPU runtime (gpu, when set):
// saves are where device-to-host copies land. Read-only ones are not:
// CUDA pins read-only memory only with cudaHostRegisterReadOnly, which not
// every device supports, and a restore reads its arena once, which does
// not repay the pinning of every page.
type arenas struct {
	m      map[mapKey]*mapping
	gpu    HostRegistrar
	log    func(string)
	warned bool
}

func newArenas(gpu HostRegistrar, log func(string)) arenas {
	return arenas{m: map[mapKey]*mapping{}, gpu: gpu, log: log}
}

// get returns the mapping of path with size bytes, mapping it (again, when
// the agent changed the arena's size) as needed.
func (a *arenas) get(path string, size int64, write bool) ([]byte, error) {
	k := mapKey{path, write}
	if m := a.m[k]; m != nil {
		if int64(len(m.data)) == size {
			a.register(m)
			return m.data, nil
		}
		delete(a.m, k)
		if err := a.unmap(m); err != nil {
			return nil, err
		}
	}
	data, _, err := mapArena(path, size, write)
	if err != nil {
		return nil, err
	}
	m := &mapping{path: path, write: write, data: data}
	a.m[k] = m
	a.register(m)
	return data, nil
}

// mapArena maps size bytes of the arena file at path, read-write or
// read-only, after checking that it is a regular file of this user; st is
// the file's.
func mapArena(path string, size int64, write bool) (_ []byte, st unix.Stat_t, _ error) {
	if size <= 0 || int64(int(size)) != size {
		return nil, st, fmt.Errorf("arena %s: the agent gave a size of %d bytes", path, size)
	}
	flag, prot := os.O_RDONLY, unix.PROT_READ
	if write {
		flag, prot = os.O_RDWR, unix.PROT_READ|unix.PROT_WRITE
	}
	// Never through a symlink, and only the rank's own regular file: the
	// path comes from the agent's store, and a rank must not map (and
	// write its snapshots into) a file someone else planted there;
	// O_NONBLOCK: a FIFO in its place must not hang the rank.
	f, err := os.OpenFile(path, flag|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return nil, st, fmt.Errorf("opening arena %s: it is a symlink; an arena is a regular file of this user: %w", path, err)
		}
		return nil, st, fmt.Errorf("opening arena: %w", err)
	}
	defer f.Close() // the mapping outlives the descriptor
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, st, fmt.Errorf("arena %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != os.Geteuid() {
		return nil, st, fmt.Errorf("arena %s is not a regular file of this user (uid %d, mode %#o); refusing to map it: the agent's store has been tampered with", path, st.Uid, st.Mode)
	}
	if st.Size < size {
		return nil, st, fmt.Errorf("arena %s holds %d bytes, the agent says %d", path, st.Size, size)
	}
	// MAP_POPULATE builds the page tables now: the pages already exist
	// (the agent preallocates arenas), and faulting them in one by one
	// during the copy would cost more than the copy's memmove.
	data, err := unix.Mmap(int(f.Fd()), 0, int(size), prot, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, st, fmt.Errorf("mapping arena %s (%d bytes): %w", path, size, err)
	}
	return data, st, nil
}

// register registers a read-write mapping with the GPU runtime, once; a
// mapping made before the process used a GPU is tried again at its next
// use. A refusal is said once and leaves the mapping unregistered: the
// copies still work, through the runtime's bounce buffer.
func (a *arenas) register(m *mapping) {
	if a.gpu == nil || !m.write || m.registered || m.refused {
		return
	}
	err := a.gpu.Register(m.data)
	switch {
	case err == nil:
		m.registered = true
	case errors.Is(err, cuda.ErrNoContext):
	default:
		m.refused = true
		if !a.warned {
			a.warned = true
			a.log(fmt.Sprintf("the GPU runtime refused to register snapshot arena %s (%v); device-to-host copies into arenas "+
				"stage through the runtime's bounce buffer", m.path, err))
		}
	}
}

// unmap unregisters and unmaps m: a registration must not outlive its
// pages.
func (a *arenas) unmap(m *mapping) error {
	var errs []error
	if m.registered {
		if err := a.gpu.Unregister(m.data); err != nil && !errors.Is(err, cuda.ErrNoContext) {
			errs = append(errs, fmt.Errorf("unregistering arena %s from the GPU runtime: %w", m.path, err))
		}
		m.registered = false
	}
	if err := unix.Munmap(m.data); err != nil {
		errs = append(errs, fmt.Errorf("unmapping arena %s: %w", m.path, err))
	}
	return errors.Join(errs...)
}

// unmapAll releases every mapping; the first error is returned.
func (a *arenas) unmapAll() error {
	var first error
	for k, m := range a.m {
		delete(a.m, k)
		if err := a.unmap(m); err != nil && first == nil {
			first = err
		}
	}
	return first
}
