package client

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"
)

func TestArenaCache(t *testing.T) {
	p := filepath.Join(t.TempDir(), "arena-0")
	if err := os.WriteFile(p, make([]byte, 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	a := newArenas(nil, func(string) {})
	defer a.unmapAll()
	w, err := a.get(p, 4096, true)
	if err != nil {
		t.Fatal(err)
	}
	w[10] = 42
	same := func(x, y []byte) bool { return unsafe.SliceData(x) == unsafe.SliceData(y) }
	tests := []struct {
		name      string
		size      int64
		write     bool
		reuse     []byte // the mapping that must be handed out again; nil: a new one
		wantErr   bool
		wantBytes int
	}{
		{"same path and size: cached", 4096, true, w, false, 4096},
		{"read-only: its own mapping", 4096, false, nil, false, 4096},
		{"size changed: mapped again", 8192, true, nil, false, 8192},
		{"larger than the file", 1 << 20, true, nil, true, 0},
		{"no size", 0, false, nil, true, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := a.get(p, tt.size, tt.write)
			if tt.wantErr {
				if err == nil {
					t.Fatal("no error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(m) != tt.wantBytes || m[10] != 42 {
				t.Fatalf("mapping of %d bytes, byte 10 = %d", len(m), m[10])
			}
			if tt.reuse != nil && !same(m, tt.reuse) {
				t.Fatal("mapped again instead of reusing the cached mapping")
			}
		})
	}
	if _, err := a.get(filepath.Join(t.TempDir(), "missing"), 4096, false); err == nil {
		t.Fatal("mapping a missing file succeeded")
	}
	if err := a.unmapAll(); err != nil || len(a.m) != 0 {
		t.Fatalf("unmapAll = %v, %d left", err, len(a.m))
	}
}

// TestDefaultRegistrarWithoutCUDA: a process that has not loaded a CUDA
// runtime gets no registrar; reft does not load one for it.
func TestDefaultRegistrarWithoutCUDA(t *testing.T) {
	if g := defaultRegistrar(); g != nil {
		t.Fatalf("default registrar %v in a process without CUDA", g)
	}
	if maps, err := os.ReadFile("/proc/self/maps"); err != nil || strings.Contains(string(maps), "libcudart") {
		t.Fatalf("libcudart mapped into the process (%v)", err)
	}
}
