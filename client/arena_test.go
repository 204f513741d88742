package client

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
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

// TestArenaRefusesPlanted: a rank maps only its own regular file, never
// through a symlink (issue 14, finding 7): a link or a FIFO in the arena's
// place, or another user's file, is refused at once, with a message.
func TestArenaRefusesPlanted(t *testing.T) {
	tests := []struct {
		name  string
		root  bool // needs root (chown)
		plant func(t *testing.T, dir, p string)
		want  string
	}{
		{"symlink to another file", false, func(t *testing.T, dir, p string) {
			other := filepath.Join(dir, "other")
			os.WriteFile(other, make([]byte, 8192), 0o600)
			os.Symlink(other, p)
		}, "symlink"},
		{"FIFO", false, func(t *testing.T, dir, p string) {
			if err := unix.Mkfifo(p, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "not a regular file"},
		{"another user's file", true, func(t *testing.T, dir, p string) {
			os.WriteFile(p, make([]byte, 8192), 0o666)
			os.Chown(p, 4242, 4242)
		}, "not a regular file of this user"},
	}
	for _, tc := range tests {
		for _, write := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/write=%v", tc.name, write), func(t *testing.T) {
				if tc.root && os.Geteuid() != 0 {
					t.Skip("needs root to give a file to another uid")
				}
				dir := t.TempDir()
				p := filepath.Join(dir, "arena-0")
				tc.plant(t, dir, p)
				a := newArenas(nil, func(string) {})
				defer a.unmapAll()
				done := make(chan error, 1)
				go func() { _, err := a.get(p, 4096, write); done <- err }()
				select {
				case err := <-done:
					if err == nil || !strings.Contains(err.Error(), tc.want) {
						t.Fatalf("get = %v; want a refusal naming %q", err, tc.want)
					}
				case <-time.After(5 * time.Second):
					t.Fatal("get blocked on the planted file")
				}
			})
		}
	}
}
