package client

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/tmpfs"
)

// TestSaveTasks: whatever regions fill the sections, the fused copy puts
// every region's bytes at its arena offset and the checksum of every
// section chunk is that of the chunk's bytes, also when a chunk is filled
// by several regions, a region straddles chunk boundaries, or the regions
// lie in another order than the buffers. Restore copies them back.
func TestSaveTasks(t *testing.T) {
	const cs = 4096
	w, m := 10_000, 3_001 // buffer sizes
	r := func(buf string, off, size, at int64) proto.Region {
		return proto.Region{Buffer: buf, Offset: off, Size: size, ArenaOffset: at}
	}
	for _, tc := range []struct {
		name     string
		sections []proto.Section
		regions  []proto.Region
	}{
		{"whole buffers", []proto.Section{{Name: "w", Size: 10_000}, {Name: "m", ArenaOffset: 12_288, Size: 3_001}},
			[]proto.Region{r("w", 0, 10_000, 0), r("m", 0, 3_001, 12_288)}},
		{"straddling, permuted, two sections", []proto.Section{{Name: "b", ArenaOffset: 8192, Size: 6_001}, {Name: "a", Size: 7_000}},
			[]proto.Region{
				r("m", 0, 1, 0), r("w", 9_000, 1_000, 1), r("w", 5_000, 4_000, 1_001), r("m", 1, 1_999, 5_001), // a: chunk 0 has 3 regions
				r("w", 0, 5_000, 8192), r("m", 2_000, 1_001, 13_192), // b: w straddles its chunk boundary
			}},
		{"many small regions in one chunk", []proto.Section{{Name: "s", Size: 13_001}, {Name: "empty", ArenaOffset: 16_384}},
			func() []proto.Region {
				var out []proto.Region
				at := int64(0)
				for o := int64(9_990); o >= 0; o -= 10 { // backwards, 10 bytes at a time
					out = append(out, r("w", o, 10, at))
					at += 10
				}
				return append(out, r("m", 0, 3_001, at))
			}()},
	} {
		for _, workers := range []int{1, 3} {
			t.Run(fmt.Sprintf("%s/workers=%d", tc.name, workers), func(t *testing.T) {
				c := &Client{layout: &proto.RegisterReply{ChunkSize: cs}, bufs: []buffer{
					{name: "w", data: make([]byte, w)}, {name: "m", data: make([]byte, m)}}}
				for k, b := range c.bufs {
					for i := range b.data {
						b.data[i] = byte(i*7 + k*101 + i>>8)
					}
				}
				sizes := map[string]int64{"w": int64(w), "m": int64(m)}
				arena := bytes.Repeat([]byte{0xAA}, 20_480)
				if err := proto.CheckLayout(sizes, int64(len(arena)), tc.sections, tc.regions, true); err != nil {
					t.Fatalf("the test's layout: %v", err)
				}
				tasks, crcs := c.saveTasks(arena, tc.regions, tc.sections)
				if err := copyChunks(tasks, workers, nil); err != nil {
					t.Fatal(err)
				}
				for _, rg := range tc.regions {
					src := c.data()[rg.Buffer][rg.Offset : rg.Offset+rg.Size]
					if !bytes.Equal(arena[rg.ArenaOffset:rg.ArenaOffset+rg.Size], src) {
						t.Fatalf("region %+v: the arena does not hold its bytes", rg)
					}
				}
				if len(crcs) != len(tc.sections) {
					t.Fatalf("checksums of %d sections, want %d", len(crcs), len(tc.sections))
				}
				for _, s := range tc.sections {
					want := tmpfs.ChunkCRCs(arena[s.ArenaOffset:s.ArenaOffset+s.Size], cs, 1)
					if got := crcs[s.Name]; len(got) != len(want) || got == nil || fmt.Sprint(got) != fmt.Sprint(want) {
						t.Fatalf("section %q: checksums %v, want %v", s.Name, got, want)
					}
				}
				want := c.data()
				c.bufs[0].data, c.bufs[1].data = make([]byte, w), make([]byte, m)
				if err := copyChunks(c.restoreTasks(arena, tc.regions), workers, nil); err != nil {
					t.Fatal(err)
				}
				for name, d := range c.data() {
					if !bytes.Equal(d, want[name]) {
						t.Fatalf("buffer %q differs after the restore", name)
					}
				}
			})
		}
	}
}
