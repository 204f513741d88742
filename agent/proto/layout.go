package proto

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
)

// CheckLayout checks the regions and sections of a save (save true) or
// restore reply against the rules of docs/PROTOCOL.md ("Regions and
// sections"); sizes are the registered buffers' sizes by name. Sections
// have unique names, lie in the arena and never overlap. Every region is
// non-empty, lies within its buffer and within one section, and no two
// regions overlap in the arena. A save's regions fill their sections
// exactly, so that the client's copy defines every checksummed byte (the
// arena is reused: a byte nobody copies holds an older generation's). A
// restore's regions never overlap within a buffer, so that every restored
// byte has one source.
func CheckLayout(sizes map[string]int64, arenaSize int64, sections []Section, regions []Region, save bool) error {
	if arenaSize < 0 { // without sections nothing else would catch it (found by FuzzCheckLayout)
		return fmt.Errorf("arena size %d is negative", arenaSize)
	}
	secs, err := checkSections(arenaSize, sections)
	if err != nil {
		return err
	}
	regs := slices.Clone(regions)
	slices.SortFunc(regs, func(a, b Region) int { return cmp.Compare(a.ArenaOffset, b.ArenaOffset) })
	filled := make([]int64, len(secs))
	for i, r := range regs {
		if err := checkRegion(sizes, arenaSize, regs, i); err != nil {
			return err
		}
		// The last section starting at or before the region must hold it.
		j := sort.Search(len(secs), func(k int) bool { return secs[k].ArenaOffset > r.ArenaOffset }) - 1
		if j < 0 || r.ArenaOffset+r.Size > secs[j].ArenaOffset+secs[j].Size {
			return fmt.Errorf("region [%d, +%d) of buffer %q at arena offset %d is not inside one section", r.Offset, r.Size, r.Buffer, r.ArenaOffset)
		}
		filled[j] += r.Size
	}
	if save {
		return checkFilled(secs, filled)
	}
	return checkOneSource(regs)
}

// checkSections checks that the sections have unique names, lie in the
// arena and do not overlap, and returns the non-empty ones by arena
// offset.
func checkSections(arenaSize int64, sections []Section) ([]Section, error) {
	names := make(map[string]bool, len(sections))
	secs := make([]Section, 0, len(sections))
	for _, s := range sections {
		switch {
		case s.Name == "" || names[s.Name]:
			return nil, fmt.Errorf("section name %q is empty or not unique", s.Name)
		case s.Size < 0 || s.ArenaOffset < 0 || s.ArenaOffset > arenaSize || s.Size > arenaSize-s.ArenaOffset:
			return nil, fmt.Errorf("section %q at [%d, +%d) does not fit the arena of %d bytes", s.Name, s.ArenaOffset, s.Size, arenaSize)
		}
		names[s.Name] = true
		if s.Size > 0 {
			secs = append(secs, s)
		}
	}
	slices.SortFunc(secs, func(a, b Section) int { return cmp.Compare(a.ArenaOffset, b.ArenaOffset) })
	for i := 1; i < len(secs); i++ {
		if p := secs[i-1]; p.ArenaOffset+p.Size > secs[i].ArenaOffset {
			return nil, fmt.Errorf("sections %q and %q overlap in the arena", p.Name, secs[i].Name)
		}
	}
	return secs, nil
}

// checkRegion checks regs[i] (regs by arena offset): a registered buffer,
// not empty, inside its buffer and the arena, not overlapping the region
// before it in the arena.
func checkRegion(sizes map[string]int64, arenaSize int64, regs []Region, i int) error {
	r := regs[i]
	n, ok := sizes[r.Buffer]
	switch {
	case !ok:
		return fmt.Errorf("a region names buffer %q, which is not registered", r.Buffer)
	case r.Size <= 0:
		return fmt.Errorf("a region of buffer %q is empty (%d bytes)", r.Buffer, r.Size)
	case r.Offset < 0 || r.Offset > n || r.Size > n-r.Offset:
		return fmt.Errorf("region [%d, +%d) of buffer %q leaves the buffer of %d bytes", r.Offset, r.Size, r.Buffer, n)
	case r.ArenaOffset < 0 || r.ArenaOffset > arenaSize || r.Size > arenaSize-r.ArenaOffset:
		return fmt.Errorf("region [%d, +%d) of buffer %q at arena offset %d leaves the arena of %d bytes", r.Offset, r.Size, r.Buffer, r.ArenaOffset, arenaSize)
	case i > 0 && regs[i-1].ArenaOffset+regs[i-1].Size > r.ArenaOffset:
		return fmt.Errorf("regions of buffers %q and %q overlap in the arena at offset %d", regs[i-1].Buffer, r.Buffer, r.ArenaOffset)
	}
	return nil
}

// checkFilled: a save's regions fill every section exactly, so the
// client's copy defines every checksummed byte.
func checkFilled(secs []Section, filled []int64) error {
	for j, s := range secs {
		if filled[j] != s.Size {
			return fmt.Errorf("section %q: the regions fill %d of its %d bytes; a save's regions must fill every section", s.Name, filled[j], s.Size)
		}
	}
	return nil
}

// checkOneSource: a restore's regions do not overlap within a buffer, so
// every restored byte has one source. It sorts regs.
func checkOneSource(regs []Region) error {
	slices.SortFunc(regs, func(a, b Region) int { return cmp.Or(cmp.Compare(a.Buffer, b.Buffer), cmp.Compare(a.Offset, b.Offset)) })
	for i := 1; i < len(regs); i++ {
		if p, r := regs[i-1], regs[i]; p.Buffer == r.Buffer && p.Offset+p.Size > r.Offset {
			return fmt.Errorf("two regions restore bytes %d.. of buffer %q; a restore's regions must not overlap in a buffer", r.Offset, r.Buffer)
		}
	}
	return nil
}
