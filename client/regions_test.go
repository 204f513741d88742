package client

import (
	"bytes"
	"fmt"
	"strings"
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

// TestVerifiedRestoreTasks: a verified restore copies every region back
// and checksums every chunk a region reads, whole: bytes between regions
// are read, not copied, so a flipped byte there is reported too; a chunk
// no region reads is neither copied nor checked. A reply whose checksums
// do not match the sections is refused before anything is copied.
func TestVerifiedRestoreTasks(t *testing.T) {
	const cs = 4096
	w, m := 10_000, 3_001
	r := func(buf string, off, size, at int64) proto.Region {
		return proto.Region{Buffer: buf, Offset: off, Size: size, ArenaOffset: at}
	}
	// Section a: w's bytes 0..5999 in chunk 0 and 1 with a gap at
	// 3000..3999; chunk 2 (8192..) read by nothing. Section b: m whole,
	// then 100 bytes no region names.
	secs := []proto.Section{{Name: "a", Size: 12_288}, {Name: "b", ArenaOffset: 12_288, Size: 3_101}}
	regs := []proto.Region{r("w", 0, 3_000, 0), r("w", 3_000, 3_000, 4_000), r("m", 0, 3_001, 12_288)}
	for _, tc := range []struct {
		name  string
		flip  int64 // arena byte to corrupt after the checksums; -1 none
		bad   []proto.MisreadChunk
		crcs  func(map[string][]uint32)
		error string
	}{
		{name: "intact", flip: -1},
		{name: "in a region", flip: 5_000, bad: []proto.MisreadChunk{{Section: "a", Index: 1}}},
		{name: "in a gap of a read chunk", flip: 3_500, bad: []proto.MisreadChunk{{Section: "a", Index: 0}}},
		{name: "after the last region of a section", flip: 12_288 + 3_050, bad: []proto.MisreadChunk{{Section: "b", Index: 0}}},
		{name: "in a chunk nothing reads", flip: 9_000},
		{name: "a checksum short", flip: -1, crcs: func(c map[string][]uint32) { c["a"] = c["a"][:2] }, error: `2 checksums for section "a"`},
		{name: "a section missing", flip: -1, crcs: func(c map[string][]uint32) { delete(c, "b") }, error: `0 checksums for section "b"`},
	} {
		for _, workers := range []int{1, 3} {
			t.Run(fmt.Sprintf("%s/workers=%d", tc.name, workers), func(t *testing.T) {
				c := &Client{layout: &proto.RegisterReply{ChunkSize: cs}, bufs: []buffer{
					{name: "w", data: make([]byte, w)}, {name: "m", data: make([]byte, m)}}}
				sizes := map[string]int64{"w": int64(w), "m": int64(m)}
				arena := make([]byte, 16_384)
				for i := range arena {
					arena[i] = byte(i*7 + i>>8)
				}
				if err := proto.CheckLayout(sizes, int64(len(arena)), secs, regs, false); err != nil {
					t.Fatalf("the test's layout: %v", err)
				}
				crcs := map[string][]uint32{}
				for _, s := range secs {
					crcs[s.Name] = tmpfs.ChunkCRCs(arena[s.ArenaOffset:s.ArenaOffset+s.Size], cs, 1)
				}
				if tc.crcs != nil {
					tc.crcs(crcs)
				}
				if tc.flip >= 0 {
					arena[tc.flip] ^= 0x10
				}
				tasks, check, err := c.verifiedRestoreTasks(arena, regs, secs, cs, crcs)
				if tc.error != "" {
					if err == nil || !strings.Contains(err.Error(), tc.error) {
						t.Fatalf("error %v, want one containing %q", err, tc.error)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if err := copyChunks(tasks, workers, nil); err != nil {
					t.Fatal(err)
				}
				for _, rg := range regs {
					if !bytes.Equal(c.data()[rg.Buffer][rg.Offset:rg.Offset+rg.Size], arena[rg.ArenaOffset:rg.ArenaOffset+rg.Size]) {
						t.Fatalf("region %+v: the buffer does not hold the arena's bytes", rg)
					}
				}
				bad := check()
				for i := range bad {
					bad[i].Got = 0 // the CRC read depends on the flip; the chunk is the point
				}
				if fmt.Sprint(bad) != fmt.Sprint(tc.bad) {
					t.Fatalf("bad chunks %v, want %v", bad, tc.bad)
				}
			})
		}
	}
}
