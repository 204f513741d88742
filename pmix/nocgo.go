//go:build !cgo

package pmix

import "fmt"

// FromPMIx needs cgo and libpmix; without them only the Slurm fallback works.
func FromPMIx() (Topology, error) {
	return Topology{}, fmt.Errorf("%w: built without cgo", ErrUnavailable)
}
