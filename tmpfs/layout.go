package tmpfs

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// DefaultShard names a rank's own state.
const DefaultShard = "state"

// DefaultChunkSize is the checksum granularity: a corrupt chunk can be
// fetched again from elsewhere without refetching its whole buffer.
const DefaultChunkSize = 4 << 20

// Key names the generations of one rank's shard: its own state, or a shard
// it protects for a peer (e.g. "arc-r3", "xor-2").
type Key struct {
	Rank  int
	Shard string
}

func (k Key) String() string { return fmt.Sprintf("rank %d shard %s", k.Rank, k.Shard) }

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

func (k Key) check() error {
	if k.Rank < 0 {
		return fmt.Errorf("tmpfs: rank %d must not be negative", k.Rank)
	}
	if !nameRE.MatchString(k.Shard) {
		return fmt.Errorf("tmpfs: shard name %q: use 1 to 64 letters, digits, '.', '_' or '-'", k.Shard)
	}
	return nil
}

func (k Key) rel() string { return fmt.Sprintf("r%d/%s", k.Rank, k.Shard) }

func genName(step int64, seq uint64) string { return fmt.Sprintf("g%d-%d", step, seq) }

// parseGenName reads "g<step>-<seq>".
func parseGenName(s string) (step int64, seq uint64, ok bool) {
	a, b, found := strings.Cut(strings.TrimPrefix(s, "g"), "-")
	if !found || !strings.HasPrefix(s, "g") {
		return 0, 0, false
	}
	st, err1 := strconv.ParseInt(a, 10, 64)
	sq, err2 := strconv.ParseUint(b, 10, 64)
	return st, sq, err1 == nil && err2 == nil && st >= 0 && genName(st, sq) == s
}

func arenaName(n int) string { return "arena-" + strconv.Itoa(n) }

func parseArenaName(s string) (int, bool) {
	n, err := strconv.Atoi(strings.TrimPrefix(s, "arena-"))
	return n, err == nil && n >= 0 && arenaName(n) == s
}

// BufferSpec is one registered buffer.
type BufferSpec struct {
	Name       string
	Size       int64
	Replicated bool // identical across the rank's DP group (recorded for redundancy planning)
}

// Spec describes a generation to be written.
type Spec struct {
	Step   int64
	Layout string // the job's parallel layout, recorded as given
	// Buffers are the arena's checksummed sections, laid out in order.
	// Without Regions each is the registered buffer of its name, whole.
	Buffers   []BufferSpec
	ChunkSize int64 // 0: the store's
	// Sources and Regions, when set, are recorded in the manifest: the
	// rank's registered buffers and which of their bytes lie where in the
	// arena (every region inside one of Buffers), so that a restore copies
	// back exactly what the save copied in.
	Sources []Source
	Regions []Region
	// Ring, when set, is recorded in the manifest: the ranks of the
	// sharding group in the ring order the sharded layout used, so that a
	// restore reads the generation with the ring it was saved with.
	Ring []int
}

// bufferAlign keeps every buffer page-aligned in the arena, so a client can
// view it as a typed array (numpy, torch.frombuffer) without a copy.
var bufferAlign = int64(os.Getpagesize())

// plan lays the buffers out in order and returns their manifest entries
// (without checksums) and the bytes the arena needs.
func plan(spec Spec) ([]Buffer, int64, error) {
	if len(spec.Buffers) == 0 {
		return nil, 0, fmt.Errorf("tmpfs: step %d has no buffers; register at least one before saving", spec.Step)
	}
	if spec.Step < 0 {
		return nil, 0, fmt.Errorf("tmpfs: step %d must not be negative", spec.Step)
	}
	seen := map[string]bool{}
	var off int64
	out := make([]Buffer, 0, len(spec.Buffers))
	for _, b := range spec.Buffers {
		if b.Name == "" || len(b.Name) > 256 || seen[b.Name] {
			return nil, 0, fmt.Errorf("tmpfs: buffer name %q is empty, too long or registered twice", b.Name)
		}
		if b.Size < 0 {
			return nil, 0, fmt.Errorf("tmpfs: buffer %q has negative size %d", b.Name, b.Size)
		}
		seen[b.Name] = true
		out = append(out, Buffer{Name: b.Name, Offset: off, Size: b.Size, Replicated: b.Replicated})
		off += (b.Size + bufferAlign - 1) / bufferAlign * bufferAlign
	}
	if off == 0 {
		off = bufferAlign // every buffer is empty; an arena still needs a page
	}
	return out, off, nil
}

// chunks is how many chunks of size cs a buffer of n bytes has.
// chunks is how many chunks of cs bytes hold n bytes, without the
// overflow of (n+cs-1)/cs for sizes near the int64 limit.
func chunks(n, cs int64) int {
	c := n / cs
	if n%cs != 0 {
		c++
	}
	return int(c)
}

// Plan is the arena layout every generation of spec uses: each buffer's
// offset (page-aligned, in the order given) and the arena's size. Clients
// learn it at registration, before any save.
func Plan(spec Spec) ([]Buffer, int64, error) { return plan(spec) }
