package client_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/reft-hpc/reft/client"
	"github.com/reft-hpc/reft/hostmem/cuda"
)

// fakeCUDA builds hostmem/cuda's stand-in libcudart (one device) and loads
// it; its calls are logged to the returned file.
func fakeCUDA(t *testing.T) (*cuda.Runtime, string) {
	t.Helper()
	lib := filepath.Join(t.TempDir(), "libcudart.so")
	out, err := exec.Command("gcc", "-shared", "-fPIC", "-DDEVICES=1", "-o", lib, "../hostmem/cuda/testdata/fakecudart.c").CombinedOutput()
	if err != nil {
		t.Fatalf("build fake libcudart: %v\n%s", err, out)
	}
	calls := filepath.Join(t.TempDir(), "calls")
	t.Setenv("FAKE_CUDA_LOG", calls)
	r := cuda.Load(lib)
	if !r.Available() {
		t.Fatal("the fake libcudart did not load")
	}
	return r, calls
}

// gpuCalls is the fake runtime's log: operation and address per call.
func gpuCalls(t *testing.T, path string) (reg, unreg []string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		switch f := strings.Fields(l); {
		case len(f) == 0:
		case f[0] == "register":
			reg = append(reg, f[1])
		case f[0] == "unregister":
			unreg = append(unreg, f[1])
		}
	}
	return reg, unreg
}

// TestArenasRegisteredWithGPURuntime: with a CUDA runtime, every arena a
// rank saves into is registered once, however many saves reuse it, on the
// first save after the process uses a GPU; restores' read-only mappings
// are not; Close unregisters each before unmapping. Without a runtime the
// same saves and restores work and nothing is called. A refusal is said
// once and costs nothing else.
func TestArenasRegisteredWithGPURuntime(t *testing.T) {
	tests := []struct {
		name      string
		runtime   string // "fake", "absent"
		active    string // FAKE_CUDA_ACTIVE before the first save
		refuse    bool
		wantReg   int
		wantWarns int
	}{
		{"absent runtime: no-op", "absent", "", false, 0, 0},
		{"fake runtime", "fake", "0", false, 3, 0},
		{"no GPU in use at the first save", "fake", "", false, 3, 0},
		{"runtime refuses", "fake", "0", true, 0, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var gpu client.HostRegistrar
			var calls string
			if tc.runtime == "fake" {
				gpu, calls = fakeCUDA(t)
			} else {
				gpu = cuda.Load(filepath.Join(t.TempDir(), "libcudart-missing.so"))
			}
			t.Setenv("FAKE_CUDA_ACTIVE", tc.active)
			if tc.refuse {
				t.Setenv("FAKE_CUDA_REFUSE", "1")
			}
			var mu sync.Mutex
			var warns []string
			a := startAgent(t)
			c, err := client.Open(ctxT(t), client.Options{Socket: a.Socket, GPU: gpu, Log: func(m string) {
				mu.Lock()
				defer mu.Unlock()
				warns = append(warns, m)
			}})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			w := patterned(100_000, 1)
			if err := c.Register("w", w, client.Replicated); err != nil {
				t.Fatal(err)
			}
			for step := int64(1); step <= 6; step++ { // the agent rotates three arenas
				if step == 2 {
					os.Setenv("FAKE_CUDA_ACTIVE", "0") // the trainer starts using its GPU
				}
				pattern(w, int(step))
				if err := c.Save(step).Wait(ctxT(t)); err != nil {
					t.Fatal(err)
				}
			}
			clear(w)
			if err := c.RestoreStep(ctxT(t), 6); err != nil {
				t.Fatal(err)
			}
			mustEqual(t, "restored w", w, patterned(100_000, 6))
			if calls == "" {
				if err := c.Close(); err != nil {
					t.Fatal(err)
				}
				return
			}
			reg, unreg := gpuCalls(t, calls)
			if len(reg) != tc.wantReg || len(slices.Compact(slices.Sorted(slices.Values(reg)))) != len(reg) || len(unreg) != 0 {
				t.Fatalf("before Close: registered %v, unregistered %v; want %d distinct arenas registered, none unregistered", reg, unreg, tc.wantReg)
			}
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			reg, unreg = gpuCalls(t, calls)
			if !slices.Equal(slices.Sorted(slices.Values(unreg)), slices.Sorted(slices.Values(reg))) {
				t.Fatalf("after Close: unregistered %v, want the registered %v", unreg, reg)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(warns) != tc.wantWarns || (tc.wantWarns > 0 && !strings.Contains(warns[0], "out of memory")) {
				t.Fatalf("log %q, want %d warning naming the runtime's error", warns, tc.wantWarns)
			}
		})
	}
}
