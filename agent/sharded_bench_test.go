package agent

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// BenchmarkRestoreReplacement: the restore of a replacement rank from its
// peers' memory against the same rank's restore from the persistent tier
// (docs/BENCHMARKS.md, "Restore of a replacement rank").
//
// Four agents of the sharded harness (sharded_test.go), one rank each,
// DP = 4, --reft=arc,persist=1, stores in /dev/shm, the production chunk
// size (4 MiB), a replicated state of restoreBenchBytes per rank. Every op:
// save steps 1 and 2 (each persisted), lose rank 1's node, relaunch, and
// restore step 2 on every rank (restoreAll): peer_s is the replacement
// rank's RestoreStep (watermarks cached, plan, shards fetched from three
// peers and verified, arena committed, client copy-out). Then lose the
// replacement's node and its ring successor's, beyond arc's tolerance, so
// that every rank of the group restores step 2 from the persistent tier;
// persistent_s is rank 1's RestoreStep again. Its work does not depend on
// which nodes were lost: a persistent restore loads every member's
// persisted generation. The persistent directory is under b.TempDir(),
// local disk, where production has a shared filesystem; as root the page
// cache is dropped before this restore (cold_cache = 1), else the files
// are read warm from the page cache (cold_cache = 0).
//
// REFT_BENCH_RESTORE_MIB sets the state per rank (default 256);
// REFT_BENCH_RESTORE_CPUPROFILE=file writes a CPU profile of the first
// op's restore from peers alone (all four ranks' restores, every agent).
func BenchmarkRestoreReplacement(b *testing.B) {
	size := int64(restoreBenchBytes) // per rank, replicated
	if v := os.Getenv("REFT_BENCH_RESTORE_MIB"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("REFT_BENCH_RESTORE_MIB=%q: want a number of MiB", v)
		}
		size = int64(n) << 20
	}
	// Peak: client buffers and arenas of four ranks, each node loading
	// every member's persisted generation, the two steps' contents.
	if need := 32 * size; memAvailable() < need {
		b.Skipf("needs %d MiB of available memory (MemAvailable %d MiB)", need>>20, memAvailable()>>20)
	}
	sizes := restoreBenchSizes(size)
	steps := map[int64]map[string][]byte{}
	for st := int64(1); st <= 2; st++ {
		steps[st] = map[string][]byte{}
		for i, name := range shOrder[:len(sizes)] {
			p := make([]byte, sizes[i])
			var seed [32]byte
			binary.LittleEndian.PutUint64(seed[:], uint64(st))
			seed[8] = byte(i)
			rand.NewChaCha8(seed).Read(p)
			steps[st][name] = p
		}
	}
	bufs := func(step int64, rank int, withLocal bool) map[string][]byte {
		if step > 0 {
			return steps[step] // read only: saveSteps copies from it
		}
		out := map[string][]byte{}
		for i, name := range shOrder[:len(sizes)] {
			out[name] = make([]byte, sizes[i])
		}
		return out
	}
	opt := shOpts{chunk: 4 << 20, bufs: bufs}
	shm, err := os.MkdirTemp("/dev/shm", "reft-bench-restore-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(shm) })
	var peerS, persS float64
	cold := 1.0
	b.ResetTimer()
	b.StopTimer()
	for i := range b.N {
		iter := filepath.Join(shm, strconv.Itoa(i))
		pdir := b.TempDir()
		roots := map[string]string{}
		for _, nm := range []string{"n1", "n2", "n3", "n4", "s1", "s2"} {
			roots[nm] = filepath.Join(iter, nm)
		}
		j := startJob(b, "arc,persist=1", []string{"n1", "n2", "n3", "n4"}, roots, pdir, opt)
		j.saveSteps(2, false)

		j = j.relaunch(roots, []int{1})
		stopProf := profilePeerRestore(b, i)
		b.StartTimer()
		step, errs, got := j.restoreAll(false)
		b.StopTimer()
		stopProf()
		checkBenchRestore(b, "peers", step, errs, got, steps[2])
		checkBenchEvent(b, j.nodes[1], "restore_peer")
		peerS += j.took[1].Seconds()

		j = j.relaunch(roots, []int{1, 2})
		if !dropPageCache() {
			cold = 0
		}
		b.StartTimer()
		step, errs, got = j.restoreAll(false)
		b.StopTimer()
		checkBenchRestore(b, "persistent tier", step, errs, got, steps[2])
		checkBenchEvent(b, j.nodes[1], "restore_persistent")
		persS += j.took[1].Seconds()

		j.stop()
		os.RemoveAll(iter)
		os.RemoveAll(pdir)
	}
	n := float64(b.N)
	mb := float64(size) / 1e6
	b.ReportMetric(peerS/n, "peer_s")
	b.ReportMetric(persS/n, "persistent_s")
	b.ReportMetric(persS/peerS, "ratio")
	b.ReportMetric(mb*n/peerS, "peer_MB/s")
	b.ReportMetric(mb*n/persS, "persistent_MB/s")
	b.ReportMetric(cold, "cold_cache")
}

const restoreBenchBytes = 256 << 20

// restoreBenchSizes cuts a replicated state of total bytes into buffers
// of odd sizes, named as shOrder's first four.
func restoreBenchSizes(total int64) []int64 {
	small := []int64{4097, 16}
	w := (total - small[0] - small[1]) * 3 / 4
	return []int64{w, small[0], small[1], total - w - small[0] - small[1]}
}

// profilePeerRestore starts the CPU profile REFT_BENCH_RESTORE_CPUPROFILE
// names in op 0 and returns what stops it.
func profilePeerRestore(b *testing.B, op int) func() {
	path := os.Getenv("REFT_BENCH_RESTORE_CPUPROFILE")
	if path == "" || op > 0 {
		return func() {}
	}
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatalf("%v (not with go test -cpuprofile)", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}

func checkBenchRestore(b *testing.B, what string, step int64, errs []error, got []map[string][]byte, want map[string][]byte) {
	b.Helper()
	if step != 2 {
		b.Fatalf("restore from %s: agreed on step %d, want 2 (%v)", what, step, errs)
	}
	for r, err := range errs {
		if err != nil {
			b.Fatalf("restore from %s: rank %d: %v", what, r, err)
		}
	}
	for name, p := range got[1] {
		if !bytes.Equal(p, want[name]) {
			b.Fatalf("restore from %s: rank 1's %s differs from step 2", what, name)
		}
	}
}

func checkBenchEvent(b *testing.B, n *shNode, want string) {
	b.Helper()
	for _, ev := range []string{"restore_local", "restore_peer", "decode", "restore_persistent"} {
		if got := len(n.log.Events(ev)); (ev == want) != (got == 1) {
			b.Fatalf("the replacement rank logged %d %s events, want its one restore to be %s", got, ev, want)
		}
	}
}

// dropPageCache writes back dirty pages and drops the clean page cache, so
// that the persistent files are read from disk; false when it may not
// (not root, or /proc/sys read only).
func dropPageCache() bool {
	syscall.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("1\n"), 0) == nil
}

func memAvailable() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}
