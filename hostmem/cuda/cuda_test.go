//go:build cgo

package cuda

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/reft-hpc/reft/hostmem"
)

var _ hostmem.HostRegistrar = (*Runtime)(nil)

// fakeCudart is a stand-in libcudart: one device; it accepts one
// registration at a time and refuses to unregister anything else.
const fakeCudart = `
#include <stddef.h>
static void *reg; static size_t reglen;
int cudaGetDeviceCount(int *n) { *n = DEVICES; return 0; }
int cudaHostRegister(void *p, size_t n, unsigned int flags) {
	if (reg || flags != 1) return 712; reg = p; reglen = n; return 0; }
int cudaHostUnregister(void *p) { if (p != reg) return 713; reg = 0; return 0; }
const char *cudaGetErrorString(int e) { return e == 712 ? "part or all of the requested memory range is already mapped" : "pointer does not correspond to a registered memory region"; }
`

func buildFake(t *testing.T, devices string) string {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "fake.c")
	if err := os.WriteFile(src, []byte(fakeCudart), 0o644); err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(dir, "libcudart.so")
	out, err := exec.Command("gcc", "-shared", "-fPIC", "-DDEVICES="+devices, "-o", lib, src).CombinedOutput()
	if err != nil {
		t.Fatalf("build fake libcudart (cgo needs gcc anyway): %v\n%s", err, out)
	}
	return lib
}

func TestAbsentRuntimeIsSilentNoOp(t *testing.T) {
	r := Load(filepath.Join(t.TempDir(), "libcudart-missing.so"))
	if r.Available() || r.Library() != "" {
		t.Fatalf("missing library reported as loaded: %q", r.Library())
	}
	b := make([]byte, 4096)
	if err := r.Register(b); err != nil {
		t.Fatalf("Register without CUDA: %v, want nil", err)
	}
	if err := r.Unregister(b); err != nil {
		t.Fatalf("Unregister without CUDA: %v, want nil", err)
	}
}

func TestDefaultLoadOnThisMachine(t *testing.T) {
	// Whatever the node has, Load never fails and Register never errors
	// when no runtime was loaded.
	r := Load()
	if !r.Available() {
		if err := r.Register(make([]byte, 64)); err != nil {
			t.Fatalf("no-op Register: %v", err)
		}
	} else if r.Library() == "" {
		t.Fatal("loaded runtime without a library name")
	}
}

func TestFakeRuntime(t *testing.T) {
	tests := []struct {
		name, devices string
		available     bool
	}{
		{"one device", "1", true},
		{"no device counts as absent", "0", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lib := buildFake(t, tc.devices)
			r := Load(lib)
			if r.Available() != tc.available {
				t.Fatalf("Available = %v, want %v", r.Available(), tc.available)
			}
			if !tc.available {
				return
			}
			a, b := make([]byte, 4096), make([]byte, 4096)
			if err := r.Register(a); err != nil {
				t.Fatalf("Register: %v", err)
			}
			err := r.Register(b)
			if err == nil || !strings.Contains(err.Error(), "already mapped") || !strings.Contains(err.Error(), "712") {
				t.Fatalf("second Register: %v, want the runtime's error 712 with its message", err)
			}
			if err := r.Unregister(b); err == nil {
				t.Fatal("Unregister of an unregistered range succeeded")
			}
			if err := r.Unregister(a); err != nil {
				t.Fatalf("Unregister: %v", err)
			}
		})
	}
}
