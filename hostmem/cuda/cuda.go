//go:build cgo

// Package cuda registers host memory with the CUDA runtime, when one can
// be loaded, so device-to-host copies DMA straight into snapshot arenas.
//
// libcudart is opened with dlopen at run time: there is no link-time
// dependency on CUDA, and on a node without it every call is a silent
// no-op. This is the only cgo in hostmem; it depends on nothing else in
// reft.
package cuda

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include <stddef.h>

typedef int (*reft_reg_fn)(void *, size_t, unsigned int);
typedef int (*reft_unreg_fn)(void *);
typedef int (*reft_count_fn)(int *);
typedef const char *(*reft_errstr_fn)(int);

static int reft_call_reg(void *f, void *p, size_t n, unsigned int flags) { return ((reft_reg_fn)f)(p, n, flags); }
static int reft_call_unreg(void *f, void *p) { return ((reft_unreg_fn)f)(p); }
static int reft_call_count(void *f, int *n) { return ((reft_count_fn)f)(n); }
static const char *reft_call_errstr(void *f, int e) { return f ? ((reft_errstr_fn)f)(e) : "unknown CUDA error"; }
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// DefaultLibraries are tried in order by Load.
var DefaultLibraries = []string{"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"}

// cudaHostRegisterPortable makes the registration visible to every CUDA
// context in the process, not only the current one.
const cudaHostRegisterPortable = 0x01

// Runtime is a loaded CUDA runtime, or the no-op stand-in for its absence.
// It implements hostmem.HostRegistrar.
type Runtime struct {
	lib                  unsafe.Pointer
	path                 string
	register, unregister unsafe.Pointer
	errorString          unsafe.Pointer
}

// Load opens the first of libs (DefaultLibraries if none) that dlopen
// finds and that reports at least one device. Without one it returns a
// Runtime whose calls do nothing.
func Load(libs ...string) *Runtime {
	if len(libs) == 0 {
		libs = DefaultLibraries
	}
	for _, name := range libs {
		if r := open(name); r != nil {
			return r
		}
	}
	return &Runtime{}
}

func open(name string) *Runtime {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	lib := C.dlopen(cname, C.RTLD_NOW|C.RTLD_LOCAL)
	if lib == nil {
		return nil
	}
	sym := func(s string) unsafe.Pointer {
		cs := C.CString(s)
		defer C.free(unsafe.Pointer(cs))
		return C.dlsym(lib, cs)
	}
	r := &Runtime{lib: lib, path: name, register: sym("cudaHostRegister"), unregister: sym("cudaHostUnregister"), errorString: sym("cudaGetErrorString")}
	count := sym("cudaGetDeviceCount")
	var n C.int
	// A runtime without a usable device (no driver, no GPU) counts as absent.
	if r.register == nil || r.unregister == nil || count == nil || C.reft_call_count(count, &n) != 0 || n < 1 {
		C.dlclose(lib)
		return nil
	}
	return r
}

// Available says whether a CUDA runtime with a device was loaded.
func (r *Runtime) Available() bool { return r.lib != nil }

// Library is the library that was loaded, "" when none.
func (r *Runtime) Library() string { return r.path }

func (r *Runtime) errorf(op string, code C.int, n int) error {
	return fmt.Errorf("cuda: %s of %d bytes failed: %s (error %d from %s)", op, n, C.GoString(C.reft_call_errstr(r.errorString, code)), int(code), r.path)
}

// Register page-locks b for the GPU (cudaHostRegister, portable). b must
// not be Go heap memory that the collector could move; arenas are mmap'ed.
func (r *Runtime) Register(b []byte) error {
	if r.lib == nil || len(b) == 0 {
		return nil
	}
	if code := C.reft_call_reg(r.register, unsafe.Pointer(unsafe.SliceData(b)), C.size_t(len(b)), cudaHostRegisterPortable); code != 0 {
		return r.errorf("cudaHostRegister", code, len(b))
	}
	return nil
}

// Unregister undoes Register.
func (r *Runtime) Unregister(b []byte) error {
	if r.lib == nil || len(b) == 0 {
		return nil
	}
	if code := C.reft_call_unreg(r.unregister, unsafe.Pointer(unsafe.SliceData(b))); code != 0 {
		return r.errorf("cudaHostUnregister", code, len(b))
	}
	return nil
}
