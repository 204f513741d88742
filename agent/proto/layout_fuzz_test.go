package proto

import (
	"encoding/json"
	"testing"
)

// layoutCase is FuzzCheckLayout's input, as JSON so the fuzzer can mutate
// the structure.
type layoutCase struct {
	Sizes     map[string]int64 `json:"sizes"`
	ArenaSize int64            `json:"arena_size"`
	Sections  []Section        `json:"sections"`
	Regions   []Region         `json:"regions"`
}

// FuzzCheckLayout: both sides trust CheckLayout with the other's layout
// (the client a reply's, the agent its own). Whatever it accepts is
// checked here again byte by byte on a small arena: sections inside the
// arena and apart, regions inside their buffer and one section and apart
// in the arena, a save's regions filling its sections, a restore's never
// writing a buffer byte twice.
func FuzzCheckLayout(f *testing.F) {
	add := func(c layoutCase, save bool) {
		b, err := json.Marshal(c)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, save)
	}
	sizes := map[string]int64{"a": 100, "b": 50, "e": 0}
	add(layoutCase{sizes, 300, []Section{{Name: "s0", Size: 150}, {Name: "s1", ArenaOffset: 200, Size: 100}, {Name: "z"}},
		[]Region{{Buffer: "a", Size: 100}, {Buffer: "b", ArenaOffset: 100, Size: 50}, {Buffer: "a", ArenaOffset: 200, Size: 100}}}, true)
	add(layoutCase{sizes, 300, []Section{{Name: "s0", Size: 300}},
		[]Region{{Buffer: "a", Offset: 10, Size: 20, ArenaOffset: 5}, {Buffer: "a", Offset: 0, Size: 20, ArenaOffset: 40}}}, false)
	add(layoutCase{sizes, 100, []Section{{Name: "s", ArenaOffset: 9223372036854775807, Size: 1}},
		[]Region{{Buffer: "a", Offset: 9223372036854775807, Size: 9223372036854775807}}}, true)
	add(layoutCase{sizes, -1, nil, []Region{{Buffer: "x", Size: 1}}}, false)
	f.Fuzz(func(t *testing.T, in []byte, save bool) {
		var c layoutCase
		if json.Unmarshal(in, &c) != nil || CheckLayout(c.Sizes, c.ArenaSize, c.Sections, c.Regions, save) != nil {
			return
		}
		if c.ArenaSize < 0 {
			t.Fatalf("accepted an arena of %d bytes", c.ArenaSize)
		}
		if c.ArenaSize > 1<<14 {
			return // too big to check byte by byte
		}
		sec := make([]int, c.ArenaSize) // 1 + index of the section holding each byte
		for i, s := range c.Sections {
			if s.ArenaOffset < 0 || s.Size < 0 || s.ArenaOffset > c.ArenaSize || s.Size > c.ArenaSize-s.ArenaOffset {
				t.Fatalf("accepted section %+v outside the %d-byte arena", s, c.ArenaSize)
			}
			for k := s.ArenaOffset; k < s.ArenaOffset+s.Size; k++ {
				if sec[k] != 0 {
					t.Fatalf("accepted overlapping sections at %d", k)
				}
				sec[k] = i + 1
			}
		}
		covered := make([]bool, c.ArenaSize)
		written := map[string][]bool{}
		for _, r := range c.Regions {
			n, ok := c.Sizes[r.Buffer]
			if !ok || r.Size <= 0 || r.Offset < 0 || r.Offset > n || r.Size > n-r.Offset || r.ArenaOffset < 0 || r.ArenaOffset > c.ArenaSize || r.Size > c.ArenaSize-r.ArenaOffset {
				t.Fatalf("accepted region %+v outside its buffer or the arena", r)
			}
			for k := r.ArenaOffset; k < r.ArenaOffset+r.Size; k++ {
				if covered[k] || sec[k] == 0 || sec[k] != sec[r.ArenaOffset] {
					t.Fatalf("accepted region %+v: arena byte %d overlaps, or is in no or another section", r, k)
				}
				covered[k] = true
			}
			if !save {
				if written[r.Buffer] == nil {
					written[r.Buffer] = make([]bool, n)
				}
				for k := r.Offset; k < r.Offset+r.Size; k++ {
					if written[r.Buffer][k] {
						t.Fatalf("accepted a restore writing byte %d of %q twice", k, r.Buffer)
					}
					written[r.Buffer][k] = true
				}
			}
		}
		if save {
			for k := range covered {
				if sec[k] != 0 && !covered[k] {
					t.Fatalf("accepted a save leaving byte %d of section %q uncopied", k, c.Sections[sec[k]-1].Name)
				}
			}
		}
	})
}
