//go:build !cgo

package cuda

import "errors"

// DefaultLibraries are tried in order by Load.
var DefaultLibraries = []string{"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"}

// DriverLibrary holds the driver API; unused without cgo.
const DriverLibrary = "libcuda.so.1"

// ErrNoContext: no device of the process has a CUDA context yet. Never
// returned without cgo.
var ErrNoContext = errors.New("cuda: the process uses no GPU yet (no device has an active primary context)")

// Runtime is the no-op stand-in: without cgo there is no dlopen, so no
// CUDA runtime can be loaded.
type Runtime struct{}

// Load returns a Runtime whose calls do nothing (built without cgo).
func Load(libs ...string) *Runtime { return &Runtime{} }

// Loaded returns a Runtime whose calls do nothing (built without cgo).
func Loaded(libs ...string) *Runtime { return &Runtime{} }

// Available is always false without cgo.
func (r *Runtime) Available() bool { return false }

// Library is always "" without cgo.
func (r *Runtime) Library() string { return "" }

// Register does nothing.
func (r *Runtime) Register(b []byte) error { return nil }

// Unregister does nothing.
func (r *Runtime) Unregister(b []byte) error { return nil }
