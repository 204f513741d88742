//go:build cgo

// Package cuda registers host memory with the CUDA runtime, when one can
// be loaded, so device-to-host copies DMA straight into snapshot arenas.
//
// libcudart is opened with dlopen at run time: there is no link-time
// dependency on CUDA, and on a node without it every call is a silent
// no-op. This is the only cgo in hostmem; it depends on nothing else in
// reft.
//
// Registration never creates a CUDA context: it runs on the first device
// whose primary context the process already holds (the GPU the trainer
// uses), and is ErrNoContext while there is none. A context costs hundreds
// of MiB of device memory, and a runtime call on a thread that never chose
// a device would make one on device 0 in every rank of a node.
package cuda

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include <stddef.h>

typedef int (*reft_reg_fn)(void *, size_t, unsigned int);
typedef int (*reft_unreg_fn)(void *);
typedef int (*reft_int_ptr_fn)(int *);
typedef int (*reft_int_fn)(int);
typedef int (*reft_dev_get_fn)(int *, int);
typedef int (*reft_ctx_state_fn)(int, unsigned int *, int *);
typedef const char *(*reft_errstr_fn)(int);

struct reft_rt {
	void *reg, *unreg, *count, *get_dev, *set_dev, *dev_get, *ctx_state;
};

static int reft_call_count(void *f, int *n) { return ((reft_int_ptr_fn)f)(n); }
static const char *reft_call_errstr(void *f, int e) { return f ? ((reft_errstr_fn)f)(e) : "unknown CUDA error"; }

// reft_active says whether device ordinal i has an active primary context.
static int reft_active(struct reft_rt *r, int i) {
	int dev = 0, active = 0;
	unsigned int flags = 0;
	if (((reft_dev_get_fn)r->dev_get)(&dev, i) != 0) return 0;
	if (((reft_ctx_state_fn)r->ctx_state)(dev, &flags, &active) != 0) return 0;
	return active;
}

#define REFT_NO_CONTEXT (-1)

// reft_on_active runs cudaHostRegister (unreg == 0) or cudaHostUnregister
// on the calling thread with the first device that has an active primary
// context made current, so no call creates one; *dev is that device. The
// thread's previous device is made current again when it had a context.
// All in one C call: the current device is per thread.
static int reft_on_active(struct reft_rt *r, int unreg, void *p, size_t n, unsigned int flags, int *dev) {
	int count = 0, prev = -1, rc;
	*dev = -1;
	if (reft_call_count(r->count, &count) != 0) return REFT_NO_CONTEXT;
	for (int i = 0; i < count; i++) {
		if (reft_active(r, i)) { *dev = i; break; }
	}
	if (*dev < 0) return REFT_NO_CONTEXT;
	if (((reft_int_ptr_fn)r->get_dev)(&prev) != 0) prev = -1;
	if (prev != *dev && (rc = ((reft_int_fn)r->set_dev)(*dev)) != 0) return rc;
	rc = unreg ? ((reft_unreg_fn)r->unreg)(p) : ((reft_reg_fn)r->reg)(p, n, flags);
	if (prev >= 0 && prev != *dev && reft_active(r, prev)) ((reft_int_fn)r->set_dev)(prev);
	return rc;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"
)

// DefaultLibraries are tried in order by Load.
var DefaultLibraries = []string{"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"}

// DriverLibrary holds the driver API (cuDevicePrimaryCtxGetState) when
// the runtime library does not export it; the runtime loads it.
const DriverLibrary = "libcuda.so.1"

// ErrNoContext: no device of the process has a CUDA context yet, so
// nothing was registered. Registering would create one; try again once
// the process uses a GPU.
var ErrNoContext = errors.New("cuda: the process uses no GPU yet (no device has an active primary context)")

// Flags of cudaHostRegister.
const (
	// cudaHostRegisterPortable makes the registration visible to every
	// CUDA context in the process, not only the current one.
	cudaHostRegisterPortable = 0x01
)

// Runtime is a loaded CUDA runtime, or the no-op stand-in for its absence.
// It implements hostmem.HostRegistrar.
type Runtime struct {
	mu          sync.Mutex // guards the driver symbols' lookup
	lib, driver unsafe.Pointer
	path        string
	rt          C.struct_reft_rt
	errorString unsafe.Pointer
}

// Load opens the first of libs (DefaultLibraries if none) that dlopen
// finds and that reports at least one device. Without one it returns a
// Runtime whose calls do nothing.
func Load(libs ...string) *Runtime { return load(0, libs) }

// Loaded is Load restricted to a runtime this process has already loaded
// (RTLD_NOLOAD): a process that does not use CUDA never gets it loaded
// and initialized by reft.
func Loaded(libs ...string) *Runtime { return load(C.RTLD_NOLOAD, libs) }

func load(flags C.int, libs []string) *Runtime {
	if len(libs) == 0 {
		libs = DefaultLibraries
	}
	for _, name := range libs {
		if r := open(name, flags); r != nil {
			return r
		}
	}
	return &Runtime{}
}

func dlopen(name string, flags C.int) unsafe.Pointer {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	return C.dlopen(cname, C.RTLD_NOW|C.RTLD_LOCAL|flags)
}

func dlsym(lib unsafe.Pointer, s string) unsafe.Pointer {
	cs := C.CString(s)
	defer C.free(unsafe.Pointer(cs))
	return C.dlsym(lib, cs)
}

func open(name string, flags C.int) *Runtime {
	lib := dlopen(name, flags)
	if lib == nil {
		return nil
	}
	r := &Runtime{lib: lib, path: name, errorString: dlsym(lib, "cudaGetErrorString")}
	r.rt.reg, r.rt.unreg = dlsym(lib, "cudaHostRegister"), dlsym(lib, "cudaHostUnregister")
	r.rt.count, r.rt.get_dev, r.rt.set_dev = dlsym(lib, "cudaGetDeviceCount"), dlsym(lib, "cudaGetDevice"), dlsym(lib, "cudaSetDevice")
	var n C.int
	// A runtime without a usable device (no driver, no GPU) counts as absent.
	if r.rt.reg == nil || r.rt.unreg == nil || r.rt.count == nil || r.rt.get_dev == nil || r.rt.set_dev == nil ||
		C.reft_call_count(r.rt.count, &n) != 0 || n < 1 {
		C.dlclose(lib)
		return nil
	}
	return r
}

// driverSyms finds cuDeviceGet and cuDevicePrimaryCtxGetState: in the
// runtime library when it exports them, else in the driver library the
// runtime has loaded.
func (r *Runtime) driverSyms() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.rt.ctx_state != nil {
		return true
	}
	lib := r.lib
	if dlsym(lib, "cuDevicePrimaryCtxGetState") == nil {
		if r.driver == nil {
			r.driver = dlopen(DriverLibrary, C.RTLD_NOLOAD)
		}
		if lib = r.driver; lib == nil {
			return false
		}
	}
	r.rt.dev_get, r.rt.ctx_state = dlsym(lib, "cuDeviceGet"), dlsym(lib, "cuDevicePrimaryCtxGetState")
	if r.rt.dev_get == nil || r.rt.ctx_state == nil {
		r.rt.dev_get, r.rt.ctx_state = nil, nil
		return false
	}
	return true
}

// Available says whether a CUDA runtime with a device was loaded.
func (r *Runtime) Available() bool { return r.lib != nil }

// Library is the library that was loaded, "" when none.
func (r *Runtime) Library() string { return r.path }

func (r *Runtime) errorf(op string, code C.int, n int, dev C.int) error {
	return fmt.Errorf("cuda: %s of %d bytes on device %d failed: %s (error %d from %s)", op, n, int(dev),
		C.GoString(C.reft_call_errstr(r.errorString, code)), int(code), r.path)
}

// call runs register or unregister on the active device.
func (r *Runtime) call(op string, unreg C.int, b []byte) error {
	if !r.driverSyms() {
		return ErrNoContext // the driver is not even loaded: no context exists
	}
	var dev C.int
	code := C.reft_on_active(&r.rt, unreg, unsafe.Pointer(unsafe.SliceData(b)), C.size_t(len(b)), cudaHostRegisterPortable, &dev)
	switch {
	case code == C.REFT_NO_CONTEXT:
		return ErrNoContext
	case code != 0:
		return r.errorf(op, code, len(b), dev)
	}
	return nil
}

// Register page-locks b for the GPU (cudaHostRegister, portable), on the
// device the process already uses; ErrNoContext when it uses none yet.
// b must not be Go heap memory that the collector could move; arenas are
// mmap'ed. Without a runtime it does nothing.
func (r *Runtime) Register(b []byte) error {
	if r.lib == nil || len(b) == 0 {
		return nil
	}
	return r.call("cudaHostRegister", 0, b)
}

// Unregister undoes Register. ErrNoContext means the process holds no
// CUDA context any more, and with it went the registration.
func (r *Runtime) Unregister(b []byte) error {
	if r.lib == nil || len(b) == 0 {
		return nil
	}
	return r.call("cudaHostUnregister", 1, b)
}
