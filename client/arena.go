package client

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// mapping is one arena file mapped into this process.
type mapping struct {
	path  string
	write bool
	data  []byte
}

type mapKey struct {
	path  string
	write bool
}

// arenas caches mappings by path and mode: the agent reuses an arena for
// later generations, so mapping it once saves the mmap and the page faults
// of every later save or restore. Saves map read-write, restores read-only,
// so one path can have one mapping of each kind. Callers serialize access.
type arenas map[mapKey]*mapping

// get returns the mapping of path with size bytes, mapping it (again, when
// the agent changed the arena's size) as needed.
func (a arenas) get(path string, size int64, write bool) ([]byte, error) {
	k := mapKey{path, write}
	if m := a[k]; m != nil {
		if int64(len(m.data)) == size {
			return m.data, nil
		}
		delete(a, k)
		if err := unix.Munmap(m.data); err != nil {
			return nil, fmt.Errorf("unmapping arena %s: %w", path, err)
		}
	}
	if size <= 0 || int64(int(size)) != size {
		return nil, fmt.Errorf("arena %s: the agent gave a size of %d bytes", path, size)
	}
	flag, prot := os.O_RDONLY, unix.PROT_READ
	if write {
		flag, prot = os.O_RDWR, unix.PROT_READ|unix.PROT_WRITE
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return nil, fmt.Errorf("opening arena: %w", err)
	}
	defer f.Close() // the mapping outlives the descriptor
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("arena %s: %w", path, err)
	}
	if st.Size() < size {
		return nil, fmt.Errorf("arena %s holds %d bytes, the agent says %d", path, st.Size(), size)
	}
	// MAP_POPULATE builds the page tables now: the pages already exist
	// (the agent preallocates arenas), and faulting them in one by one
	// during the copy would cost more than the copy's memmove.
	data, err := unix.Mmap(int(f.Fd()), 0, int(size), prot, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("mapping arena %s (%d bytes): %w", path, size, err)
	}
	a[k] = &mapping{path: path, write: write, data: data}
	return data, nil
}

// unmapAll releases every mapping; the first error is returned.
func (a arenas) unmapAll() error {
	var first error
	for k, m := range a {
		delete(a, k)
		if err := unix.Munmap(m.data); err != nil && first == nil {
			first = fmt.Errorf("unmapping arena %s: %w", m.path, err)
		}
	}
	return first
}
