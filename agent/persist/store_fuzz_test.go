package persist

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/reft-hpc/reft/internal/crc32c"
	"github.com/reft-hpc/reft/tmpfs"
)

// FuzzRead: a persistent generation directory (on a shared file system the
// job's user writes) either fails read or holds a manifest whose buffers
// lie in the data file with one checksum per chunk, and Load of it, with
// the data file the size the marker says, never panics and reports
// nothing but a *CorruptError or a wrapped error.
func FuzzRead(f *testing.F) {
	valid, err := json.Marshal(tmpfs.Manifest{Format: 1, JobID: "42", Rank: 0, Step: 5, Arena: "arena-0", ArenaSize: 8192, ChunkSize: 4096,
		Buffers: []tmpfs.Buffer{{Name: "w", Size: 5000, CRC32C: []uint32{1, 2}}, {Name: "e", Offset: 8192}}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(valid, []byte(nil))
	f.Add([]byte(`{"job_id":"42","step":5,"arena_size":4096,"chunk_size":4096,"buffers":[{"name":"a","offset":9223372036854775807,"size":1,"crc32c":[0]}]}`), []byte(nil))
	f.Add([]byte(`{"job_id":"42","step":5,"arena_size":9223372036854775807,"chunk_size":9223372036854775807,"buffers":[{"name":"a","size":9223372036854775807}]}`), []byte(nil))
	f.Add(valid, []byte(`{"step":5,"manifest_bytes":1}`))
	f.Add([]byte(`{}`), []byte(`not json`))
	f.Fuzz(func(t *testing.T, raw, marker []byte) {
		dir := t.TempDir()
		s := &Store{job: "42", node: "n1", dir: dir}
		gdir := filepath.Join(dir, "r0", genName(5))
		if err := os.MkdirAll(gdir, 0o700); err != nil {
			t.Fatal(err)
		}
		var m tmpfs.Manifest
		_ = json.Unmarshal(raw, &m)
		if len(marker) == 0 { // a marker that matches: reach the manifest's checks
			var err error
			marker, err = json.Marshal(map[string]any{"step": 5, "manifest_bytes": len(raw), "manifest_crc32c": crc32c.Checksum(raw), "data_bytes": m.ArenaSize})
			if err != nil {
				t.Fatal(err)
			}
		}
		for name, b := range map[string][]byte{markerFile: marker, manifestFile: raw} {
			if err := os.WriteFile(filepath.Join(gdir, name), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		g, err := s.read(0, gdir, 5)
		if err != nil {
			return
		}
		m = g.Manifest
		var end int64
		for _, b := range m.Buffers {
			if b.Offset < end || b.Size < 0 || b.Offset > m.ArenaSize || b.Size > m.ArenaSize-b.Offset {
				t.Fatalf("accepted buffer %q at %d+%d in a %d-byte data file after %d", b.Name, b.Offset, b.Size, m.ArenaSize, end)
			}
			end = b.Offset + b.Size
			if n := int64(len(b.CRC32C)); n > math.MaxInt64/m.ChunkSize || n*m.ChunkSize < b.Size || n > 0 && (n-1)*m.ChunkSize >= b.Size {
				t.Fatalf("accepted buffer %q of %d bytes in %d-byte chunks with %d checksums", b.Name, b.Size, m.ChunkSize, n)
			}
		}
		if m.ArenaSize > 1<<16 {
			return
		}
		if err := os.WriteFile(filepath.Join(gdir, dataFile), make([]byte, m.ArenaSize), 0o600); err != nil {
			t.Fatal(err)
		}
		err = s.Load(g, func(name string) ([]byte, error) {
			for _, b := range m.Buffers {
				if b.Name == name {
					return make([]byte, b.Size), nil
				}
			}
			return nil, errors.New("no such buffer")
		})
		var cerr *CorruptError
		if err != nil && !errors.As(err, &cerr) && err.Error() == "" {
			t.Fatalf("Load: empty error")
		}
	})
}
