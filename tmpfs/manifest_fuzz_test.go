package tmpfs

import (
	"encoding/json"
	"strings"
	"testing"
)

// validManifest is a manifest as a save writes it: planned sections with
// their checksums, and (regions true) sources and regions.
func validManifest(t testing.TB, regions bool) []byte {
	t.Helper()
	spec := Spec{Step: 7, Buffers: []BufferSpec{{Name: "w", Size: 10000}, {Name: "e"}, {Name: "o", Size: 5000, Replicated: true}}}
	bufs, size, err := plan(spec)
	if err != nil {
		t.Fatal(err)
	}
	for i := range bufs {
		bufs[i].CRC32C = make([]uint32, chunks(bufs[i].Size, 4096))
	}
	m := Manifest{Format: manifestFormat, JobID: "42", Rank: 1, Shard: DefaultShard, Step: 7, Seq: 3, Arena: "arena-0",
		ArenaSize: size, ChunkSize: 4096, Buffers: bufs}
	if regions {
		m.Sources = []Source{{Name: "a", Size: 20000}}
		m.Regions = []Region{{Buffer: "a", Offset: 0, Size: 10000, ArenaOffset: bufs[0].Offset},
			{Buffer: "a", Offset: 15000, Size: 5000, ArenaOffset: bufs[2].Offset}}
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzManifestCheck: a manifest read from disk (tmpfs is the user's:
// anything may be in it) either fails check or describes an arena every
// restore can slice without panicking: buffers in order inside the arena,
// one checksum per chunk, every region inside its source and one buffer.
func FuzzManifestCheck(f *testing.F) {
	f.Add(validManifest(f, false), int64(-1))
	f.Add(validManifest(f, true), int64(-1))
	f.Add([]byte(`{"format":1,"chunk_size":4096,"arena_size":8192,"buffers":[{"name":"a","offset":9223372036854775807,"size":1,"crc32c":[0]}]}`), int64(-1))
	f.Add([]byte(`{"format":1,"chunk_size":9223372036854775807,"arena_size":9223372036854775807,"buffers":[{"name":"a","offset":0,"size":9223372036854775807}]}`), int64(-1))
	f.Add([]byte(`{"format":1,"chunk_size":1,"arena_size":4,"buffers":[{"name":"a","size":4,"crc32c":[1,2,3,4]}],"sources":[{"name":"a","size":4}],"regions":[{"buffer":"a","size":2,"arena_offset":3}]}`), int64(-1))
	f.Add([]byte(`{}`), int64(0))
	f.Fuzz(func(t *testing.T, raw []byte, arenaSize int64) {
		var m Manifest
		if json.Unmarshal(raw, &m) != nil {
			return
		}
		if arenaSize < 0 { // -1: the arena file has the size the manifest says
			arenaSize = m.ArenaSize
		}
		if m.check(m.Step, m.Seq, arenaSize) != nil {
			return
		}
		var end int64
		for _, b := range m.Buffers {
			if b.Offset < end || b.Size < 0 || b.Offset > m.ArenaSize || b.Size > m.ArenaSize-b.Offset {
				t.Fatalf("accepted buffer %q at %d+%d in a %d-byte arena after %d", b.Name, b.Offset, b.Size, m.ArenaSize, end)
			}
			end = b.Offset + b.Size
			want := b.Size / m.ChunkSize
			if b.Size%m.ChunkSize != 0 {
				want++
			}
			if int64(len(b.CRC32C)) != want {
				t.Fatalf("accepted buffer %q of %d bytes in %d-byte chunks with %d checksums", b.Name, b.Size, m.ChunkSize, len(b.CRC32C))
			}
		}
		for _, r := range m.RegionList() {
			in := false
			for _, b := range m.Buffers {
				in = in || r.ArenaOffset >= b.Offset && r.Size <= b.Offset+b.Size-r.ArenaOffset
			}
			if r.Size <= 0 || r.Offset < 0 || r.ArenaOffset < 0 || !in {
				t.Fatalf("accepted region %+v outside every buffer", r)
			}
		}
		if arenaSize > 1<<16 {
			return
		}
		// Slice an arena as RestoreGeneration and Reader.Chunk do.
		data := make([]byte, arenaSize)
		for _, b := range m.Buffers {
			dst := make([]byte, b.Size)
			for c := range b.CRC32C {
				lo, hi := int64(c)*m.ChunkSize, min(int64(c+1)*m.ChunkSize, b.Size)
				copy(dst[lo:hi], data[b.Offset+lo:b.Offset+hi])
			}
		}
	})
}

// FuzzNames: the store finds generations and arenas by directory entry
// names, which the user can create in their tmpfs directory; a name parses
// only in the one form the store writes.
func FuzzNames(f *testing.F) {
	for _, s := range []string{"g5-3", "g0-0", "g-1-2", "g05-3", "g5-", "g9223372036854775807-18446744073709551615", "arena-0", "arena-01", "arena--1", "arena-", "state", "arc-r3", ".x", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if step, seq, ok := parseGenName(s); ok && (step < 0 || genName(step, seq) != s) {
			t.Fatalf("parseGenName(%q) = %d, %d", s, step, seq)
		}
		if n, ok := parseArenaName(s); ok && (n < 0 || arenaName(n) != s) {
			t.Fatalf("parseArenaName(%q) = %d", s, n)
		}
		if (Key{Rank: 0, Shard: s}).check() == nil && (s == "" || len(s) > 64 || s[0] == '.' || strings.ContainsAny(s, "/\x00")) {
			t.Fatalf("shard name %q accepted", s)
		}
	})
}
