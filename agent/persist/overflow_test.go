package persist

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/reft-hpc/reft/internal/crc32c"
	"github.com/reft-hpc/reft/tmpfs"
)

// TestCraftedManifestOverflow: a persisted manifest whose buffer offset
// and size wrap around int64 (altered on disk, its marker made to match)
// is not a committed generation: List skips it instead of handing a
// restore offsets past the data file (issue 14, finding 7).
func TestCraftedManifestOverflow(t *testing.T) {
	cases := []struct {
		name         string
		offset, size int64
	}{
		{"offset near the limit", math.MaxInt64 - 100, 200},
		{"size near the limit", 0, math.MaxInt64},
		{"both at the limit", math.MaxInt64, math.MaxInt64},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := localStore(t, filepath.Join(t.TempDir(), "shm"))
			dir := t.TempDir()
			disk := openDisk(t, dir)
			w := persistGen(t, st, disk, 3, 40, -1)
			raw, err := os.ReadFile(filepath.Join(w.Dir, manifestFile))
			if err != nil {
				t.Fatal(err)
			}
			var m tmpfs.Manifest
			if err := json.Unmarshal(raw, &m); err != nil {
				t.Fatal(err)
			}
			last := &m.Buffers[len(m.Buffers)-1]
			last.Offset, last.Size = tc.offset, tc.size
			last.CRC32C = make([]uint32, numChunks(tc.size, m.ChunkSize)%1024) // as many as fit in a file
			raw, _ = json.Marshal(&m)
			if err := os.WriteFile(filepath.Join(w.Dir, manifestFile), raw, 0o600); err != nil {
				t.Fatal(err)
			}
			var mk marker
			mb, _ := os.ReadFile(filepath.Join(w.Dir, markerFile))
			json.Unmarshal(mb, &mk)
			mk.ManifestBytes, mk.ManifestCRC = len(raw), crc32c.Checksum(raw)
			mb, _ = json.Marshal(&mk)
			if err := os.WriteFile(filepath.Join(w.Dir, markerFile), mb, 0o600); err != nil {
				t.Fatal(err)
			}
			gens, err := disk.List(3)
			if err != nil {
				t.Fatal(err)
			}
			if len(gens) != 0 {
				t.Fatalf("List took the crafted generation: buffer %q at %d+%d", last.Name, gens[0].Manifest.Buffers[len(m.Buffers)-1].Offset, tc.size)
			}
		})
	}
}
