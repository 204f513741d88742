//go:build cgo

package cuda

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/reft-hpc/reft/hostmem"
)

var _ hostmem.HostRegistrar = (*Runtime)(nil)

// buildFake compiles testdata/fakecudart.c with the given device count
// into a fresh libcudart.so and returns its path.
func buildFake(t *testing.T, devices string) string {
	t.Helper()
	lib := filepath.Join(t.TempDir(), "libcudart.so")
	out, err := exec.Command("gcc", "-shared", "-fPIC", "-DDEVICES="+devices, "-o", lib, "testdata/fakecudart.c").CombinedOutput()
	if err != nil {
		t.Fatalf("build fake libcudart (cgo needs gcc anyway): %v\n%s", err, out)
	}
	return lib
}

func TestAbsentRuntimeIsSilentNoOp(t *testing.T) {
	for _, r := range []*Runtime{Load(filepath.Join(t.TempDir(), "libcudart-missing.so")), Loaded(filepath.Join(t.TempDir(), "libcudart-missing.so"))} {
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
		active        string // device with a context; "": none
		available     bool
		wantDev       int // device the registration ran on
		noContext     bool
	}{
		{"one device", "1", "0", true, 0, false},
		{"no device counts as absent", "0", "", false, 0, false},
		{"the device in use, not device 0", "2", "1", true, 1, false},
		{"no context yet: nothing registered", "2", "", true, 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lib := buildFake(t, tc.devices)
			logPath := filepath.Join(t.TempDir(), "calls")
			t.Setenv("FAKE_CUDA_LOG", logPath)
			t.Setenv("FAKE_CUDA_ACTIVE", tc.active)
			r := Load(lib)
			if r.Available() != tc.available {
				t.Fatalf("Available = %v, want %v", r.Available(), tc.available)
			}
			if !tc.available {
				return
			}
			a, b := make([]byte, 4096), make([]byte, 4096)
			if tc.noContext {
				if err := r.Register(a); !errors.Is(err, ErrNoContext) {
					t.Fatalf("Register without a context: %v, want ErrNoContext", err)
				}
				if calls, _ := os.ReadFile(logPath); len(calls) != 0 {
					t.Fatalf("runtime calls without a context:\n%s", calls)
				}
				return
			}
			if err := r.Register(a); err != nil {
				t.Fatalf("Register: %v", err)
			}
			err := r.Register(a)
			if err == nil || !strings.Contains(err.Error(), "already mapped") || !strings.Contains(err.Error(), "712") {
				t.Fatalf("second Register: %v, want the runtime's error 712 with its message", err)
			}
			if err := r.Unregister(b); err == nil {
				t.Fatal("Unregister of an unregistered range succeeded")
			}
			if err := r.Unregister(a); err != nil {
				t.Fatalf("Unregister: %v", err)
			}
			calls, _ := os.ReadFile(logPath)
			p := fmt.Sprintf("%p", unsafe.SliceData(a))
			want := fmt.Sprintf("register %s 4096 1 %d\nunregister %s 0 0 %d\n", p, tc.wantDev, p, tc.wantDev)
			if string(calls) != want {
				t.Fatalf("runtime calls:\n%s\nwant:\n%s", calls, want)
			}
		})
	}
}

// TestLoadedOnlyWhenAlreadyLoaded: Loaded finds a runtime only once the
// process has loaded it (here by Load; in a trainer by its CUDA code).
func TestLoadedOnlyWhenAlreadyLoaded(t *testing.T) {
	lib := buildFake(t, "1")
	if r := Loaded(lib); r.Available() {
		t.Fatal("Loaded loaded a runtime the process had not")
	}
	if r := Load(lib); !r.Available() {
		t.Fatal("Load did not load the fake runtime")
	}
	if r := Loaded(lib); !r.Available() || r.Library() != lib {
		t.Fatalf("Loaded after Load: available %v, library %q", r.Available(), r.Library())
	}
}
