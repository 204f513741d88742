package client_test

import (
	"context"
	"fmt"
	"hash/crc32"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/client"
	"github.com/reft-hpc/reft/tests/conformance-agent/agenttest"
	"github.com/reft-hpc/reft/tmpfs"
)

// Benchmarks of the client through a real in-process agent against
// memmove, measured in the same run (the method of docs/BENCHMARKS.md):
//
//   - memmove_GB/s: plain copy() of the same 256 MiB between two
//     pre-faulted anonymous mappings, in the client's 4 MiB chunks on as
//     many goroutines as the client's Workers.
//   - Save: Save + Wait of four 64 MiB buffers: the save request, the
//     client's chunked copy into the mapped arena, and the commit, in which
//     the agent checksums every chunk and writes the manifest. Steady
//     state: the arenas are mapped and reused, as in training.
//   - Every measured round runs next to a baseline round (alternating
//     which goes first); x_memmove is the median of the per-pair
//     throughput ratios (save / memmove), so load from elsewhere on the
//     machine hits both alike. copy_x_memmove is the client's copy alone
//     against the same baseline, agent_crc_share the part of a save the
//     agent spends checksumming at commit, and save_call_us how long Save
//     itself blocks the caller (the copy and commit run behind it).
//   - layout=scatter: the agent's test layout, every buffer in three
//     regions at odd offsets, dealt across two sections. Most of its cost
//     is the copies' misalignment (source and destination at different
//     offsets mod 8 slow memmove and the CRC by about a quarter), which a
//     sharded layout avoids by cutting at aligned offsets.

const benchSize = 256 << 20

func anon(b *testing.B, n int) []byte {
	p, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		b.Fatalf("mapping %d bytes: %v", n, err)
	}
	b.Cleanup(func() { unix.Munmap(p) })
	return p
}

// plainCopy is the baseline: copy() per chunk on workers goroutines.
func plainCopy(dst, src []byte, chunk, workers int) {
	var wg sync.WaitGroup
	n := (len(src) + chunk - 1) / chunk
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				lo, hi := i*chunk, min((i+1)*chunk, len(src))
				copy(dst[lo:hi], src[lo:hi])
			}
		}()
	}
	wg.Wait()
}

func gbps(n int, d time.Duration) float64 { return float64(n) / d.Seconds() / 1e9 }

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func mean(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func BenchmarkSave256MiB(b *testing.B) {
	for _, bc := range []struct {
		workers int
		layout  string // "": the agent's; scatter: 12 regions across two sections (agenttest)
	}{{1, ""}, {2, ""}, {1, "scatter"}} {
		workers, name := bc.workers, fmt.Sprintf("workers=%d", bc.workers)
		if bc.layout != "" {
			name += ",layout=" + bc.layout
		}
		b.Run(name, func(b *testing.B) {
			src, dst := anon(b, benchSize), anon(b, benchSize)
			for i := range src {
				src[i] = byte(i>>12) ^ byte(i)
			}
			a := startAgentWith(b, agenttest.Options{Layout: bc.layout})
			ctx := context.Background()
			c := open(b, a, client.Options{Workers: workers})
			q := benchSize / 4
			for i, name := range []string{"params", "grads", "adam.m", "adam.v"} {
				if err := c.Register(name, src[i*q:(i+1)*q], client.Kind(i%2)); err != nil {
					b.Fatal(err)
				}
			}
			step := int64(0)
			save := func() (time.Duration, client.SaveStats) {
				t := time.Now()
				h := c.Save(step)
				call := time.Since(t)
				if err := h.Wait(ctx); err != nil {
					b.Fatal(err)
				}
				step++
				return call, h.Stats()
			}
			for range 3 { // map every arena the agent rotates through
				save()
			}
			var memmove, rates, ratios, copyRatios, crcShare, calls []float64
			base := func() {
				t := time.Now()
				plainCopy(dst, src, client.DefaultChunkSize, workers)
				memmove = append(memmove, gbps(benchSize, time.Since(t)))
			}
			timed := func() {
				t := time.Now()
				call, st := save()
				d := time.Since(t)
				rates = append(rates, gbps(benchSize, d))
				calls = append(calls, float64(call.Microseconds()))
				copyRatios = append(copyRatios, gbps(benchSize, st.Copy))
				crcShare = append(crcShare, st.Checksum.Seconds()/d.Seconds())
			}
			const pairs = 4
			b.SetBytes(benchSize * pairs)
			for i := 0; b.Loop(); {
				for range pairs {
					b.StopTimer()
					if i%2 == 0 {
						base()
					}
					b.StartTimer()
					timed()
					b.StopTimer()
					if i%2 == 1 {
						base()
					}
					b.StartTimer()
					ratios = append(ratios, rates[len(rates)-1]/memmove[len(memmove)-1])
					copyRatios[len(copyRatios)-1] /= memmove[len(memmove)-1]
					i++
				}
			}
			b.ReportMetric(mean(memmove), "memmove_GB/s")
			b.ReportMetric(mean(rates), "save_GB/s")
			b.ReportMetric(median(ratios), "x_memmove")
			b.ReportMetric(median(copyRatios), "copy_x_memmove")
			b.ReportMetric(median(crcShare), "agent_crc_share")
			b.ReportMetric(median(calls), "save_call_us")
		})
	}
}

// BenchmarkRestore is the product's local restore: RestoreStep through a
// real in-process agent over its Unix socket (restore request, the
// generation's checksums verified, copy-out of the mapped arena into the
// registered buffers, release), against memmove measured in the same run.
//
//   - memmove_GB/s: copy() of the same bytes from the same arena mapping
//     (the generation's, mapped read-only as the client maps it) into the
//     same registered buffers, in the same 4 MiB chunks on as many
//     goroutines as the client's RestoreWorkers (workers= in the name; the
//     default is GOMAXPROCS): the copy a restore cannot avoid.
//   - restore_GB/s and x_memmove: as in BenchmarkSave256MiB, each restore
//     paired with a baseline round, x_memmove the median of the ratios.
//   - A state of four equal buffers; 4 GiB skips, saying why, without the
//     memory for it (three arenas, as the agent preallocates, and the
//     buffers).
func BenchmarkRestore(b *testing.B) {
	for _, size := range []int{256 << 20, 1 << 30, 4 << 30} {
		for _, workers := range []int{1, 2} {
			b.Run(fmt.Sprintf("%s/workers=%d", sizeName(size), workers), func(b *testing.B) {
				benchRestore(b, size, workers)
			})
		}
	}
}

func sizeName(n int) string {
	if n >= 1<<30 {
		return fmt.Sprintf("%dGiB", n>>30)
	}
	return fmt.Sprintf("%dMiB", n>>20)
}

// roomForRestore skips when the machine cannot hold the state: three
// arenas in /dev/shm and the registered buffers, 1 GiB spare.
func roomForRestore(b *testing.B, size int) {
	mi, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		b.Fatal(err)
	}
	var avail int64
	for _, line := range strings.Split(string(mi), "\n") {
		if kb, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			fmt.Sscan(strings.TrimSuffix(strings.TrimSpace(kb), " kB"), &avail)
			avail <<= 10
		}
	}
	if need := int64(4*size) + 1<<30; avail < need {
		b.Skipf("a %s state needs %s of available memory (three arenas, as the agent preallocates, the buffers, 1 GiB spare); only %d MiB is available now",
			sizeName(size), sizeName(int(need)), avail>>20)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(agenttest.DefaultDir(), &fs); err != nil {
		b.Fatal(err)
	}
	if free := int64(fs.Bavail) * fs.Bsize; free < int64(3*size) {
		b.Skipf("a %s state needs %s free in %s for three arenas; only %d MiB is free", sizeName(size), sizeName(3*size), agenttest.DefaultDir(), free>>20)
	}
}

func benchRestore(b *testing.B, size, workers int) {
	roomForRestore(b, size)
	a := startAgent(b)
	ctx := context.Background()
	c := open(b, a, client.Options{Workers: workers, RestoreWorkers: workers})
	state := anon(b, size)
	q := size / 4
	names := []string{"params", "grads", "adam.m", "adam.v"}
	for i, name := range names {
		if err := c.Register(name, state[i*q:(i+1)*q], client.Kind(i%2)); err != nil {
			b.Fatal(err)
		}
	}
	pattern(state[:1<<20], 7)
	for off := 1 << 20; off < size; off += 1 << 20 {
		copy(state[off:off+1<<20], state[:1<<20])
		state[off] = byte(off >> 20) // no two MiB alike
	}
	want := crc32.Checksum(state, crc32.MakeTable(crc32.Castagnoli))
	if err := c.Save(1).Wait(ctx); err != nil {
		b.Fatal(err)
	}
	clear(state)
	if err := c.RestoreStep(ctx, 1); err != nil { // maps the arena, as every later restore finds it
		b.Fatal(err)
	}
	if got := crc32.Checksum(state, crc32.MakeTable(crc32.Castagnoli)); got != want {
		b.Fatalf("the restored state's CRC-32C is %#x, the saved one's %#x", got, want)
	}
	// The baseline reads the same arena, mapped as the client maps it.
	g, ok := a.Store.Latest(tmpfs.Key{Rank: 0, Shard: tmpfs.DefaultShard})
	if !ok {
		b.Fatal("no committed generation in the agent's store")
	}
	f, err := os.Open(g.ArenaPath)
	if err != nil {
		b.Fatal(err)
	}
	arena, err := unix.Mmap(int(f.Fd()), 0, int(g.Manifest.ArenaSize), unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
	f.Close()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unix.Munmap(arena) })
	type span struct{ dst, src []byte }
	var spans []span
	for _, buf := range g.Manifest.Buffers {
		i := slices.Index(names, buf.Name)
		spans = append(spans, span{state[i*q : (i+1)*q], arena[buf.Offset : buf.Offset+buf.Size]})
	}
	base := func() {
		for _, s := range spans {
			plainCopy(s.dst, s.src, client.DefaultChunkSize, workers)
		}
	}
	var memmove, rates, ratios []float64
	pairs := max(3, (2<<30)/size)
	b.SetBytes(int64(size * pairs))
	for i := 0; b.Loop(); {
		for range pairs {
			timeBase := func() {
				t := time.Now()
				base()
				memmove = append(memmove, gbps(size, time.Since(t)))
			}
			if i%2 == 0 {
				timeBase()
			}
			t := time.Now()
			if err := c.RestoreStep(ctx, 1); err != nil {
				b.Fatal(err)
			}
			rates = append(rates, gbps(size, time.Since(t)))
			if i%2 == 1 {
				timeBase()
			}
			ratios = append(ratios, rates[len(rates)-1]/memmove[len(memmove)-1])
			i++
		}
	}
	b.ReportMetric(mean(memmove), "memmove_GB/s")
	b.ReportMetric(mean(rates), "restore_GB/s")
	b.ReportMetric(median(ratios), "x_memmove")
}
