package tmpfs

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/reft-hpc/reft/hostmem"
)

const manifestFormat = 1

const (
	manifestFile = "MANIFEST"
	markerFile   = "COMMITTED"
	badFile      = "BAD"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Manifest describes one generation: what a restore needs to find and
// verify every byte.
type Manifest struct {
	Format    int    `json:"format"`
	JobID     string `json:"job_id"`
	Rank      int    `json:"rank"`
	Shard     string `json:"shard"`
	Step      int64  `json:"step"`
	Seq       uint64 `json:"seq"`
	Layout    string `json:"layout,omitempty"`
	Arena     string `json:"arena"` // file name in the shard directory
	ArenaSize int64  `json:"arena_size"`
	ChunkSize int64  `json:"chunk_size"`
	// Buffers are the arena's checksummed sections (the name is from
	// before regions, when each was one registered buffer, as it still is
	// in a manifest without Regions).
	Buffers []Buffer  `json:"buffers"`
	Created time.Time `json:"created"`
	// Sources are the rank's registered buffers, in registration order;
	// Regions place byte ranges of them in the arena, each inside one of
	// Buffers. Both absent (manifests from before regions): each buffer is
	// a source, whole; see SourceList and RegionList.
	Sources []Source `json:"sources,omitempty"`
	Regions []Region `json:"regions,omitempty"`
	// Ring is the sharding group's ranks in the ring order of a sharded
	// layout (ring position i owns shard i); absent for other layouts and
	// in manifests from before rings, which used dp order.
	Ring []int `json:"ring,omitempty"`
}

// Source is a buffer the rank registered, as a generation saw it.
type Source struct {
	Name       string `json:"name"`
	Size       int64  `json:"size"`
	Replicated bool   `json:"replicated,omitempty"`
}

// Region is a byte range [Offset, Offset+Size) of source Buffer and its
// place in the arena, at ArenaOffset.
type Region struct {
	Buffer      string `json:"buffer"`
	Offset      int64  `json:"offset"`
	Size        int64  `json:"size"`
	ArenaOffset int64  `json:"arena_offset"`
}

// SourceList is the generation's registered buffers.
func (m *Manifest) SourceList() []Source {
	if m.Sources != nil || m.Regions != nil {
		return m.Sources
	}
	out := make([]Source, len(m.Buffers))
	for i, b := range m.Buffers {
		out[i] = Source{Name: b.Name, Size: b.Size, Replicated: b.Replicated}
	}
	return out
}

// RegionList is where the generation's source bytes lie in the arena:
// Regions, or for a manifest from before regions each non-empty buffer
// whole at its offset.
func (m *Manifest) RegionList() []Region {
	if m.Sources != nil || m.Regions != nil {
		return m.Regions
	}
	out := make([]Region, 0, len(m.Buffers))
	for _, b := range m.Buffers {
		if b.Size > 0 {
			out = append(out, Region{Buffer: b.Name, Size: b.Size, ArenaOffset: b.Offset})
		}
	}
	return out
}

// checkRegions checks that every region lies within its source and
// inside one of bufs (laid out by plan: in arena order, not overlapping),
// and that no two overlap in the arena. It runs at every save, so it
// sorts and searches rather than compare all pairs (a model may register
// thousands of tensors).
func checkRegions(sources []Source, bufs []Buffer, regions []Region) error {
	size := make(map[string]int64, len(sources))
	for _, s := range sources {
		size[s.Name] = s.Size
	}
	regs := slices.Clone(regions)
	slices.SortFunc(regs, func(a, b Region) int { return cmp.Compare(a.ArenaOffset, b.ArenaOffset) })
	secs := slices.DeleteFunc(slices.Clone(bufs), func(b Buffer) bool { return b.Size == 0 })
	slices.SortFunc(secs, func(a, b Buffer) int { return cmp.Compare(a.Offset, b.Offset) })
	for i, r := range regs {
		n, ok := size[r.Buffer]
		if !ok || r.Size <= 0 || r.Offset < 0 || r.Offset > n || r.Size > n-r.Offset {
			return fmt.Errorf("region [%d, +%d) of %q is empty or not within a source buffer", r.Offset, r.Size, r.Buffer)
		}
		if i > 0 && regs[i-1].ArenaOffset+regs[i-1].Size > r.ArenaOffset {
			return fmt.Errorf("regions of %q and %q overlap at arena offset %d", regs[i-1].Buffer, r.Buffer, r.ArenaOffset)
		}
		// The last section starting at or before the region must hold it.
		j, found := slices.BinarySearchFunc(secs, r.ArenaOffset, func(b Buffer, at int64) int { return cmp.Compare(b.Offset, at) })
		if !found {
			j--
		}
		if j < 0 || r.ArenaOffset < secs[j].Offset || r.Size > secs[j].Offset+secs[j].Size-r.ArenaOffset {
			return fmt.Errorf("region [%d, +%d) of %q at arena offset %d is not inside one section", r.Offset, r.Size, r.Buffer, r.ArenaOffset)
		}
	}
	return nil
}

// Buffer is one buffer's place in the arena and its chunk checksums:
// CRC32C[i] covers bytes [i*ChunkSize, min((i+1)*ChunkSize, Size)).
type Buffer struct {
	Name   string   `json:"name"`
	Offset int64    `json:"offset"`
	Size   int64    `json:"size"`
	CRC32C []uint32 `json:"crc32c"`
	// Replicated: the buffer is identical across the rank's DP group.
	Replicated bool `json:"replicated,omitempty"`
}

// marker is the COMMITTED file. It pins the manifest by length and
// checksum, so a torn or altered manifest never reads as committed.
type marker struct {
	Step          int64  `json:"step"`
	Seq           uint64 `json:"seq"`
	ManifestBytes int    `json:"manifest_bytes"`
	ManifestCRC   uint32 `json:"manifest_crc32c"`
}

func (m *Manifest) buffer(name string) *Buffer {
	for i := range m.Buffers {
		if m.Buffers[i].Name == name {
			return &m.Buffers[i]
		}
	}
	return nil
}

// check validates a manifest read from disk against where it was found.
func (m *Manifest) check(step int64, seq uint64, arenaSize int64) error {
	switch {
	case m.Format != manifestFormat:
		return fmt.Errorf("format %d, this reft reads %d", m.Format, manifestFormat)
	case m.Step != step || m.Seq != seq:
		return fmt.Errorf("manifest says step %d seq %d, directory says %d %d", m.Step, m.Seq, step, seq)
	case m.ChunkSize <= 0:
		return fmt.Errorf("chunk size %d", m.ChunkSize)
	case m.ArenaSize != arenaSize:
		return fmt.Errorf("arena %s is %d bytes, manifest says %d", m.Arena, arenaSize, m.ArenaSize)
	}
	var end int64
	for _, b := range m.Buffers {
		// Offset >= end >= 0, so ArenaSize-Offset cannot overflow, where
		// Offset+Size could wrap past the check (a crafted manifest).
		if b.Offset < end || b.Size < 0 || b.Offset > m.ArenaSize || b.Size > m.ArenaSize-b.Offset {
			return fmt.Errorf("buffer %q at %d+%d overlaps or leaves the arena", b.Name, b.Offset, b.Size)
		}
		if len(b.CRC32C) != chunks(b.Size, m.ChunkSize) {
			return fmt.Errorf("buffer %q has %d checksums for %d chunks", b.Name, len(b.CRC32C), chunks(b.Size, m.ChunkSize))
		}
		end = b.Offset + b.Size
	}
	if err := checkRegions(m.SourceList(), m.Buffers, m.RegionList()); err != nil {
		return err
	}
	return nil
}

// readGeneration reads a generation directory's marker and manifest. It
// returns an error when the generation is not completed.
func readGeneration(dir string, step int64, seq uint64) (*Manifest, error) {
	mb, err := os.ReadFile(filepath.Join(dir, markerFile))
	if err != nil {
		return nil, fmt.Errorf("no commit marker: %w", err)
	}
	var mk marker
	if err := json.Unmarshal(mb, &mk); err != nil {
		return nil, fmt.Errorf("unreadable commit marker: %w", err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, manifestFile))
	if err != nil {
		return nil, fmt.Errorf("no manifest: %w", err)
	}
	if len(raw) != mk.ManifestBytes || crc32.Checksum(raw, castagnoli) != mk.ManifestCRC || mk.Step != step || mk.Seq != seq {
		return nil, errors.New("manifest does not match its commit marker (torn or altered)")
	}
	m := new(Manifest)
	if err := json.Unmarshal(raw, m); err != nil {
		return nil, fmt.Errorf("unreadable manifest: %w", err)
	}
	return m, nil
}

// writeAtomic writes data to dir/name through a temporary file and a
// rename, so the name never holds a partial file.
func writeAtomic(dir, name string, data []byte, o hostmem.Owner) error {
	tmp := filepath.Join(dir, ".tmp-"+name+"-"+strconv.Itoa(os.Getpid()))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = own(f, o)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, name))
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

func own(f *os.File, o hostmem.Owner) error {
	if err := f.Chmod(0o600); err != nil {
		return err
	}
	if o.UID >= 0 && o.UID != os.Geteuid() {
		return f.Chown(o.UID, o.GID)
	}
	return nil
}
