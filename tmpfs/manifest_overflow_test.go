package tmpfs

import (
	"math"
	"strings"
	"testing"
)

// TestManifestCheckOverflow: a manifest read from the store is checked
// without sums that wrap, so a crafted one whose Offset+Size overflows
// is refused instead of passing the check and indexing past the arena
// (issue 14, finding 7).
func TestManifestCheckOverflow(t *testing.T) {
	const arena, cs = 8192, 4096
	cases := []struct {
		name string
		buf  Buffer
		want string // "" accepted
	}{
		{"fits", Buffer{Name: "a", Offset: 4096, Size: 4096, CRC32C: []uint32{0}}, ""},
		{"offset near the int64 limit", Buffer{Name: "a", Offset: math.MaxInt64 - 100, Size: 200, CRC32C: []uint32{0}}, "leaves the arena"},
		{"size near the int64 limit", Buffer{Name: "a", Offset: 4096, Size: math.MaxInt64 - 10, CRC32C: []uint32{0}}, "leaves the arena"},
		{"both at the limit", Buffer{Name: "a", Offset: math.MaxInt64, Size: math.MaxInt64, CRC32C: []uint32{0}}, "leaves the arena"},
		{"negative size", Buffer{Name: "a", Offset: 0, Size: -1}, "leaves the arena"},
		{"past the end by one", Buffer{Name: "a", Offset: 4097, Size: 4096, CRC32C: []uint32{0}}, "leaves the arena"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := &Manifest{Format: manifestFormat, Step: 1, Seq: 1, ChunkSize: cs, ArenaSize: arena, Arena: "arena-0", Buffers: []Buffer{tc.buf}}
			err := m.check(1, 1, arena)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused a valid manifest: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("check = %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

// TestChunksNoOverflow: the chunk count of a size near the int64 limit
// is right, not negative.
func TestChunksNoOverflow(t *testing.T) {
	for _, tc := range []struct {
		n, cs int64
		want  int
	}{
		{0, 4096, 0}, {1, 4096, 1}, {4096, 4096, 1}, {4097, 4096, 2},
		{math.MaxInt64, 1 << 62, 2}, {10, math.MaxInt64, 1},
	} {
		if got := chunks(tc.n, tc.cs); got != tc.want {
			t.Errorf("chunks(%d, %d) = %d, want %d", tc.n, tc.cs, got, tc.want)
		}
	}
}
