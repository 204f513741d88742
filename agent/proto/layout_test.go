package proto

import (
	"strings"
	"testing"
)

func TestCheckLayout(t *testing.T) {
	sizes := map[string]int64{"w": 10000, "m": 5000, "empty": 0}
	// Two sections of 8192 and 6808 bytes at 0 and 8192 in a 16384-byte
	// arena, filled by pieces of both buffers in a permuted order.
	secs := []Section{{Name: "a", ArenaOffset: 0, Size: 8192}, {Name: "b", ArenaOffset: 8192, Size: 6808}, {Name: "z", ArenaOffset: 16384}}
	regs := []Region{
		{Buffer: "m", Offset: 0, Size: 5000, ArenaOffset: 0},
		{Buffer: "w", Offset: 7000, Size: 3000, ArenaOffset: 5000},
		{Buffer: "w", Offset: 0, Size: 192, ArenaOffset: 8000},
		{Buffer: "w", Offset: 192, Size: 6808, ArenaOffset: 8192},
	}
	with := func(f func(s []Section, r []Region) ([]Section, []Region)) ([]Section, []Region) {
		return f(append([]Section(nil), secs...), append([]Region(nil), regs...))
	}
	for _, tc := range []struct {
		name    string
		f       func(s []Section, r []Region) ([]Section, []Region)
		save    string // "" valid on save, else a part of the error
		restore string
	}{
		{"valid", func(s []Section, r []Region) ([]Section, []Region) { return s, r }, "", ""},
		{"nothing registered is empty", func([]Section, []Region) ([]Section, []Region) { return []Section{{Name: "empty"}}, []Region{} }, "", ""},
		{"unknown buffer", func(s []Section, r []Region) ([]Section, []Region) { r[0].Buffer = "x"; return s, r }, "not registered", "not registered"},
		{"empty region", func(s []Section, r []Region) ([]Section, []Region) { r[0].Size = 0; return s, r }, "is empty", "is empty"},
		{"region leaves its buffer", func(s []Section, r []Region) ([]Section, []Region) { r[1].Offset = 7001; return s, r }, "leaves the buffer", "leaves the buffer"},
		{"negative buffer offset", func(s []Section, r []Region) ([]Section, []Region) { r[1].Offset = -1; return s, r }, "leaves the buffer", "leaves the buffer"},
		{"region leaves the arena", func(s []Section, r []Region) ([]Section, []Region) { r[3].ArenaOffset = 1 << 62; return s, r }, "leaves the arena", "leaves the arena"},
		{"regions overlap in the arena", func(s []Section, r []Region) ([]Section, []Region) { r[1].ArenaOffset = 4999; return s, r }, "overlap in the arena", "overlap in the arena"},
		{"region spans two sections", func(s []Section, r []Region) ([]Section, []Region) {
			r[2].Size, r[3].Offset, r[3].ArenaOffset, r[3].Size = 292, 292, 8292, 6708
			return s, r
		}, "not inside one section", "not inside one section"},
		{"region outside every section", func(s []Section, r []Region) ([]Section, []Region) {
			r[3].ArenaOffset = 15100
			r[3].Size = 100
			return s, r
		}, "not inside one section", "not inside one section"},
		{"gap in a section", func(s []Section, r []Region) ([]Section, []Region) { return s, r[1:] }, "fill 3192 of its 8192", ""},
		{"overlap in a buffer", func(s []Section, r []Region) ([]Section, []Region) { r[2].Offset = 100; return s, r }, "", "must not overlap in a buffer"},
		{"duplicate section", func(s []Section, r []Region) ([]Section, []Region) { s[1].Name = "a"; return s, r }, "not unique", "not unique"},
		{"section leaves the arena", func(s []Section, r []Region) ([]Section, []Region) { s[2].Size = 1; return s, r }, "does not fit", "does not fit"},
		{"sections overlap", func(s []Section, r []Region) ([]Section, []Region) { s[1].ArenaOffset = 8000; return s, r }, "overlap", "overlap"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, mode := range []struct {
				save bool
				want string
			}{{true, tc.save}, {false, tc.restore}} {
				s, r := with(tc.f)
				err := CheckLayout(sizes, 16384, s, r, mode.save)
				if mode.want == "" && err != nil || mode.want != "" && (err == nil || !strings.Contains(err.Error(), mode.want)) {
					t.Errorf("save %v: %v, want %q", mode.save, err, mode.want)
				}
			}
		})
	}
}
