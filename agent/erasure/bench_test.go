package erasure

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Benchmarks of the codes against a baseline measured in the same run, on
// the same machine (docs/BENCHMARKS.md records the figures):
//
//   - XOR/RS member encode (Codec.Encode, and Codec.EncodeInputs from the
//     gathered scratch) against memmove_GB/s: copy() of the same input
//     bytes (the m-K pieces per parity unit the member reads) into one
//     buffer, in 4 MiB chunks on as many goroutines as the codec (workers=
//     in the name), so neither side gains parallelism the other lacks.
//     Rates count input bytes. The agent's own aec:K encode against
//     klauspost is agent.BenchmarkAECEncode.
//   - Reconstruct of one lost member's shard against memmove of a shard
//     (what a replacement pays to take an ARC copy); rebuild_GB/s counts
//     the rebuilt bytes. Decoding must read m-K units per rebuilt piece,
//     (m-K)·S bytes for a shard of S, so read_GB/s and x_memmove_read show
//     the kernel's speed on what it actually reads.
//
// Every measured round is paired with a baseline round next to it,
// alternating which goes first, and x_* is the median of the per-pair
// ratios, so load from elsewhere on the machine hits both sides alike.

var benchSlices = []int{64 << 20, 256 << 20}

// encodeWorkers are the goroutine counts of the encode benchmarks: 1, what
// the agent's commit encodes with (agent/shard's EncodeWorkers), and
// GOMAXPROCS. Reconstruct runs on GOMAXPROCS, as the agent's restore does.
func encodeWorkers() []int {
	if n := runtime.GOMAXPROCS(0); n > 1 {
		return []int{1, n}
	}
	return []int{1}
}

// pairsFor is how many measured rounds one benchmark op makes for an op
// of n bytes: about 512 MiB per op, at least 7, so a burst of load from
// elsewhere moves few of the ratios the median is taken over.
func pairsFor(n int) int { return min(32, max(7, (512<<20)/max(n, 1))) }

func mib(n int) string { return fmt.Sprintf("%dMiB", n>>20) }

// benchSlice is one random slice per size, shared by all benchmarks.
var benchSlice = func() func(n int) []byte {
	var mu sync.Mutex
	cache := map[int][]byte{}
	return func(n int) []byte {
		mu.Lock()
		defer mu.Unlock()
		if cache[n] == nil {
			cache[n] = randBytes(uint64(n), n)
		}
		return cache[n]
	}
}()

func gbps(n int, d time.Duration) float64 { return float64(n) / d.Seconds() / 1e9 }

// chunkedCopy is the baseline: copy() of srcs, concatenated into dst, in
// 4 MiB chunks on workers goroutines.
func chunkedCopy(dst []byte, srcs [][]byte, workers int) {
	type job struct{ d, s []byte }
	var jobs []job
	off := 0
	for _, s := range srcs {
		for lo := 0; lo < len(s); lo += 4 << 20 {
			hi := min(lo+4<<20, len(s))
			jobs = append(jobs, job{dst[off+lo : off+hi], s[lo:hi]})
		}
		off += len(s)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < len(jobs); i = int(next.Add(1) - 1) {
				copy(jobs[i].d, jobs[i].s)
			}
		}()
	}
	wg.Wait()
}

// pairs times op against base, alternating which runs first.
type pairs struct {
	op, base, ratio []float64
}

func (p *pairs) run(b *testing.B, i, opBytes, baseBytes int, op, base func()) {
	timeOp := func() {
		t := time.Now()
		op()
		p.op = append(p.op, gbps(opBytes, time.Since(t)))
	}
	// No StopTimer around the baseline: it reads memory statistics with the
	// world stopped, right next to the other side's window. ns/op and MB/s
	// therefore cover both sides; the figures to read are the metrics.
	timeBase := func() {
		t := time.Now()
		base()
		p.base = append(p.base, gbps(baseBytes, time.Since(t)))
	}
	if i%2 == 0 {
		timeBase()
		timeOp()
	} else {
		timeOp()
		timeBase()
	}
	p.ratio = append(p.ratio, p.op[len(p.op)-1]/p.base[len(p.base)-1])
}

func (p *pairs) report(b *testing.B, opName, baseName, ratioName string) {
	b.ReportMetric(median(p.op), opName+"_GB/s")
	b.ReportMetric(median(p.base), baseName+"_GB/s")
	b.ReportMetric(median(p.ratio), ratioName)
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

type codeCase struct{ m, k int }

func (c codeCase) String() string {
	if c.k == 1 {
		return fmt.Sprintf("xor/m=%d", c.m)
	}
	return fmt.Sprintf("aec%d/m=%d", c.k, c.m)
}

var codeCases = []codeCase{{4, 1}, {8, 1}, {4, 2}, {8, 2}}

// BenchmarkEncode: one member's parity from the replicated slice.
func BenchmarkEncode(b *testing.B) {
	for _, workers := range encodeWorkers() {
		for _, w := range benchSlices {
			for _, cc := range codeCases {
				b.Run(fmt.Sprintf("%s/W=%s/workers=%d", cc, mib(w), workers), func(b *testing.B) {
					slice := benchSlice(w)
					l, err := NewLayout(Params{Members: cc.m, Parity: cc.k, Size: w})
					if err != nil {
						b.Fatal(err)
					}
					c, err := NewCodec(l, workers)
					if err != nil {
						b.Fatal(err)
					}
					parity := make([]byte, l.ParitySize())
					// The baseline copies exactly the pieces member 0 reads.
					var srcs [][]byte
					in := 0
					for t := range cc.k {
						s := l.UnitStripe(0, t)
						for _, i := range l.StripeData(s) {
							r := l.Piece(i, l.PieceIn(i, s))
							srcs = append(srcs, slice[r.Off:r.End()])
							in += r.Len
						}
					}
					encodeVsMemmove(b, in, srcs, workers, func() error { return c.Encode(0, slice, parity) })
				})
			}
		}
	}
}

// BenchmarkEncodeInputs: one member's parity from its gathered scratch
// section (the sharded snapshot path), against memmove of the same input
// bytes, as in BenchmarkEncode. The scratch is what the client copies, so
// the baseline here is also that copy's cost.
func BenchmarkEncodeInputs(b *testing.B) {
	for _, workers := range encodeWorkers() {
		for _, w := range benchSlices {
			for _, cc := range codeCases {
				b.Run(fmt.Sprintf("%s/W=%s/workers=%d", cc, mib(w), workers), func(b *testing.B) {
					slice := benchSlice(w)
					l, err := NewLayout(Params{Members: cc.m, Parity: cc.k, Size: w})
					if err != nil {
						b.Fatal(err)
					}
					c, err := NewCodec(l, workers)
					if err != nil {
						b.Fatal(err)
					}
					parity := make([]byte, l.ParitySize())
					var srcs [][]byte
					for _, in := range l.Inputs(0) {
						srcs = append(srcs, slice[in.Range.Off:in.Range.End()])
					}
					in := l.InputSize(0)
					scratch := make([]byte, in)
					chunkedCopy(scratch, srcs, workers) // the client's gather
					encodeVsMemmove(b, in, srcs, workers, func() error { return c.EncodeInputs(0, scratch, parity) })
				})
			}
		}
	}
}

// encodeVsMemmove times encode against memmove of the in bytes it reads
// (srcs gathered into one buffer, on the same workers), in alternating
// pairs, and reports x_memmove. One encode and one copy run first, so
// every page is faulted in before timing.
func encodeVsMemmove(b *testing.B, in int, srcs [][]byte, workers int, encode func() error) {
	dst := make([]byte, in)
	chunkedCopy(dst, srcs, workers)
	if err := encode(); err != nil {
		b.Fatal(err)
	}
	var p pairs
	for i := 0; b.Loop(); {
		for range pairsFor(in) {
			p.run(b, i, in, in, func() {
				if err := encode(); err != nil {
					b.Fatal(err)
				}
			}, func() { chunkedCopy(dst, srcs, workers) })
			i++
		}
	}
	p.report(b, "encode", "memmove", "x_memmove")
}

// BenchmarkReconstruct: rebuild member 0's shard from the others.
func BenchmarkReconstruct(b *testing.B) {
	workers := runtime.GOMAXPROCS(0)
	for _, w := range benchSlices {
		for _, cc := range codeCases {
			b.Run(fmt.Sprintf("%s/W=%s", cc, mib(w)), func(b *testing.B) {
				slice := benchSlice(w)
				l, err := NewLayout(Params{Members: cc.m, Parity: cc.k, Size: w})
				if err != nil {
					b.Fatal(err)
				}
				c, err := NewCodec(l, workers)
				if err != nil {
					b.Fatal(err)
				}
				shards := make([][]byte, cc.m)
				parities := make([][]byte, cc.m)
				for j := range cc.m {
					r := l.Shard(j)
					shards[j] = slice[r.Off:r.End()] // survivors' shards are read only
					parities[j] = make([]byte, l.ParitySize())
					if err := c.Encode(j, slice, parities[j]); err != nil {
						b.Fatal(err)
					}
				}
				out := make([]byte, l.Shard(0).Len) // the replacement's arena
				shards[0] = out
				copyDst := make([]byte, len(out))
				src := [][]byte{slice[:len(out)]}
				chunkedCopy(copyDst, src, workers)
				clear(out)
				var p pairs
				for i := 0; b.Loop(); {
					for range pairsFor(len(out)) {
						p.run(b, i, len(out), len(out), func() {
							if err := c.Reconstruct([]int{0}, shards, parities); err != nil {
								b.Fatal(err)
							}
						}, func() { chunkedCopy(copyDst, src, workers) })
						i++
					}
				}
				if string(out) != string(slice[:len(out)]) {
					b.Fatal("rebuilt shard differs")
				}
				p.report(b, "rebuild", "memmove", "x_memmove")
				// Every rebuilt piece read m-K units of the same length.
				read := float64(l.DataPieces())
				b.ReportMetric(median(p.op)*read, "read_GB/s")
				b.ReportMetric(median(p.ratio)*read, "x_memmove_read")
			})
		}
	}
}
