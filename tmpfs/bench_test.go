package tmpfs

import (
	"fmt"
	"github.com/reft-hpc/reft/internal/crc32c"
	"hash/crc32"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/procfs"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// Benchmarks of the store against memmove, measured in the same run on the
// same machine (docs/BENCHMARKS.md records the figures):
//
//   - memmove_GB/s: the baseline, plain copy() of the same bytes between two
//     pre-faulted anonymous mappings, split into the same chunks on the same
//     GOMAXPROCS goroutines as the store (so neither side gains from
//     parallelism the other lacks); memmove1_GB/s is one copy() call on one
//     goroutine, for reference. Every measured round is paired with a
//     baseline round next to it (alternating which goes first), and
//     x_memmove is the median of the per-pair ratios, so load from
//     elsewhere on the machine hits both sides alike.
//   - Snapshot: Begin + CopyIn (copy fused with CRC-32C per chunk) + Commit
//     (manifest, marker, release of the previous generation) into a store
//     on /dev/shm, steady state: arenas are reused as in training.
//   - Restore: RestoreGeneration with every chunk verified.
//   - avx512_crc: 1 where CopyCRC runs its one-pass AVX-512 VPCLMULQDQ
//     path (crc32c_amd64.s), 0 where hash/crc32 checksums blocks in cache.

var benchSizes = []int64{256 << 20, 1 << 30, 4 << 30}

func sizeName(n int64) string {
	if n >= 1<<30 {
		return fmt.Sprintf("%dGiB", n>>30)
	}
	return fmt.Sprintf("%dMiB", n>>20)
}

// benchFixture holds a state of size bytes, a copy target, and a store.
type benchFixture struct {
	size     int64
	src, dst []byte
	specs    []BufferSpec
	state    map[string][]byte
	into     map[string][]byte
	store    *Store
	root     string
	memmove  []float64 // GB/s per baseline round
	memmove1 []float64
	rates    []float64 // GB/s per measured round
	ratios   []float64 // each round against its own baseline
}

func anon(b *testing.B, n int64) []byte {
	p, err := unix.Mmap(-1, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		b.Fatalf("map %s: %v", sizeName(n), err)
	}
	b.Cleanup(func() { unix.Munmap(p) })
	return p
}

// roomFor skips (with the reason) only when the machine cannot hold the
// state, its copy and two arenas.
func roomFor(b *testing.B, size int64) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		b.Fatal(err)
	}
	mi, err := fs.Meminfo()
	if err != nil {
		b.Fatal(err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &st); err != nil {
		b.Fatal(err)
	}
	needMem, needShm := 4*size+(1<<30), 2*size
	if avail := int64(*mi.MemAvailableBytes); avail < needMem {
		b.Skipf("%s state needs %s of memory (state, copy, two arenas, 1 GiB spare); only %s is available now",
			sizeName(size), sizeName(needMem), sizeName(avail))
	}
	if free := int64(st.Bavail) * st.Bsize; free < needShm {
		b.Skipf("%s state needs %s free in /dev/shm for two arenas; only %s is free", sizeName(size), sizeName(needShm), sizeName(free))
	}
}

func newFixture(b *testing.B, size int64) *benchFixture {
	roomFor(b, size)
	f := &benchFixture{size: size, src: anon(b, size), dst: anon(b, size)}
	// Four buffers, like parameters and optimizer moments.
	q := size / 4
	f.state, f.into = map[string][]byte{}, map[string][]byte{}
	for i, name := range []string{"params", "grads", "adam.m", "adam.v"} {
		f.specs = append(f.specs, BufferSpec{Name: name, Size: q})
		f.state[name] = f.src[int64(i)*q : int64(i+1)*q]
		f.into[name] = f.dst[int64(i)*q : int64(i+1)*q]
	}
	pattern(f.src[:1<<20], 1, "seed")
	for off := int64(1 << 20); off < size; off += 1 << 20 {
		copy(f.src[off:off+1<<20], f.src[:1<<20])
		f.src[off] = byte(off >> 20) // no two MiB alike
	}
	f.root = filepath.Join("/dev/shm", fmt.Sprintf("reft-bench-%d", os.Getpid()))
	s, err := Open(Options{Root: f.root, JobID: "bench", Log: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	f.store = s
	b.Cleanup(func() { s.Close(); os.RemoveAll(f.root) })
	return f
}

func gbps(n int64, d time.Duration) float64 { return float64(n) / d.Seconds() / 1e9 }

// baseline times one plain copy of the state, chunked and parallel like
// the store, and every few calls one single-goroutine copy() too.
func (f *benchFixture) baseline() {
	t := time.Now()
	CopyChunksPlain(f.dst, f.src, DefaultChunkSize, runtime.GOMAXPROCS(0))
	f.memmove = append(f.memmove, gbps(f.size, time.Since(t)))
	if len(f.memmove)%3 == 1 {
		t = time.Now()
		copy(f.dst, f.src)
		f.memmove1 = append(f.memmove1, gbps(f.size, time.Since(t)))
	}
}

// paired runs op and a baseline round next to each other, alternating
// which goes first, and records op's rate against that round's baseline,
// so load from elsewhere on the machine hits both alike.
func (f *benchFixture) paired(b *testing.B, i int, op func()) {
	timed := func() {
		t := time.Now()
		op()
		f.rates = append(f.rates, gbps(f.size, time.Since(t)))
	}
	base := func() {
		b.StopTimer()
		f.baseline()
		b.StartTimer()
	}
	if i%2 == 0 {
		base()
		timed()
	} else {
		timed()
		base()
	}
	f.ratios = append(f.ratios, f.rates[len(f.rates)-1]/f.memmove[len(f.memmove)-1])
}

// CopyChunksPlain is the baseline: copy() per chunk on workers goroutines.
func CopyChunksPlain(dst, src []byte, chunk int64, workers int) {
	parallel(int((int64(len(src))+chunk-1)/chunk), workers, func(i int) {
		lo := int64(i) * chunk
		hi := min(lo+chunk, int64(len(src)))
		copy(dst[lo:hi], src[lo:hi])
	})
}

func mean(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func (f *benchFixture) save(b *testing.B, step int64) {
	o, err := f.store.Begin(Key{Shard: DefaultShard}, Spec{Step: step, Buffers: f.specs})
	if err != nil {
		b.Fatal(err)
	}
	if err := o.CopyIn(f.state); err != nil {
		b.Fatal(err)
	}
	if _, err := o.Commit(); err != nil {
		b.Fatal(err)
	}
}

// pairs is how many measured rounds one benchmark op makes: enough
// samples for a steady median at every size, about 2 GiB per op.
func (f *benchFixture) pairs() int { return max(3, int((2<<30)/f.size)) }

// report prints the baseline, the rate and their ratio: the median of
// the per-round ratios.
func (f *benchFixture) report(b *testing.B, name string) {
	b.ReportMetric(mean(f.memmove), "memmove_GB/s")
	b.ReportMetric(mean(f.memmove1), "memmove1_GB/s")
	b.ReportMetric(mean(f.rates), name+"_GB/s")
	b.ReportMetric(median(f.ratios), "x_memmove")
	b.ReportMetric(b2f(crc32c.Accelerated()), "avx512_crc")
}

// b2f labels which CRC-32C path ran (1: the one-pass AVX-512 VPCLMULQDQ
// copy, 0: hash/crc32 on blocks in cache), next to go test's "cpu:" line.
func b2f(v bool) float64 {
	if v {
		return 1
	}
	return 0
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func BenchmarkSnapshot(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(sizeName(size), func(b *testing.B) {
			f := newFixture(b, size)
			f.baseline()
			t := time.Now()
			f.save(b, 1) // allocates the first arena
			first := gbps(size, time.Since(t)) / f.memmove[0]
			f.save(b, 2) // and the second; from here on they alternate
			b.SetBytes(size * int64(f.pairs()))
			step := int64(3)
			for i := 0; b.Loop(); {
				for range f.pairs() {
					f.paired(b, i, func() { f.save(b, step) })
					step++
					i++
				}
			}
			f.report(b, "snapshot")
			b.ReportMetric(first, "first_x_memmove")
		})
	}
}

func BenchmarkRestore(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(sizeName(size), func(b *testing.B) {
			f := newFixture(b, size)
			f.save(b, 1)
			g, _ := f.store.Latest(Key{Shard: DefaultShard})
			b.SetBytes(size * int64(f.pairs()))
			for i := 0; b.Loop(); {
				for range f.pairs() {
					f.paired(b, i, func() {
						if err := f.store.RestoreGeneration(g, f.into); err != nil {
							b.Fatal(err)
						}
					})
					i++
				}
			}
			f.report(b, "restore")
		})
	}
}

// BenchmarkCRC32C is the checksum alone, so its share of a snapshot is
// visible: over a 256 MiB buffer in memory, on one goroutine and on all,
// and over a 16 KiB block in cache (the fused copy's case below 1 MiB);
// hash-crc32-16KiB is Go's hash/crc32 (SSE4.2) on the same block, the
// baseline of updateCRC's AVX-512 VPCLMULQDQ path in the same run.
func BenchmarkCRC32C(b *testing.B) {
	p := make([]byte, 256<<20)
	pattern(p, 1, "crc")
	for _, tc := range []struct {
		name    string
		n       int
		workers int
	}{
		{"memory-1", len(p), 1},
		{fmt.Sprintf("memory-%d", runtime.GOMAXPROCS(0)), len(p), 0},
		{"cache-16KiB", crc32c.FuseBlock, 1},
		{"hash-crc32-16KiB", crc32c.FuseBlock, -1},
	} {
		b.Run(tc.name, func(b *testing.B) {
			// Each op checksums 256 MiB: the whole buffer, or the block
			// again and again.
			q, passes := p[:tc.n], len(p)/tc.n
			b.SetBytes(int64(len(p)))
			t := time.Now()
			for b.Loop() {
				for range passes {
					if tc.workers < 0 {
						crc32.Checksum(q, castagnoli)
						continue
					}
					ChunkCRCs(q, DefaultChunkSize, tc.workers)
				}
			}
			b.ReportMetric(gbps(int64(len(p))*int64(b.N), time.Since(t)), "GB/s")
		})
	}
}
