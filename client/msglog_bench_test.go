package client_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/reft-hpc/reft/client"
	"github.com/reft-hpc/reft/tests/conformance-agent/agenttest"
)

// BenchmarkLog is the message log's data path through a real in-process
// agent over its Unix socket, against memmove measured in the same run
// (the method of BenchmarkSave256MiB):
//
//   - memmove_GB/s: copy() of the same message between two pre-faulted
//     anonymous mappings on one goroutine (LogAppend and LogRead copy on
//     the caller's goroutine).
//   - append: LogAppend of a new step's message in steady state: each
//     round truncates the step two back first, so the agent reuses a freed
//     arena, as under a trainer that truncates at its snapshots. It costs
//     the client's CRC-32C pass, the log_append round trip, mapping the
//     arena, the copy, unmapping, and log_commit, in which the agent
//     checksums the bytes it holds. append_x_memmove: the median of the
//     per-pair ratios (append / memmove).
//   - read: LogRead of the message just appended: the agent's CRC-32C
//     pass, the round trip, mapping, and the client's fused copy and
//     checksum. read_x_memmove likewise.
func BenchmarkLog(b *testing.B) {
	for _, size := range []int{1 << 20, 16 << 20, 64 << 20} {
		b.Run(fmt.Sprintf("msg=%dMiB", size>>20), func(b *testing.B) {
			src, dst := anon(b, size), anon(b, size)
			for i := range src {
				src[i] = byte(i>>12) ^ byte(i)
			}
			a := startAgentWith(b, agenttest.Options{MemoryBudget: 64 * uint64(size)})
			c := open(b, a, client.Options{})
			if err := c.Register("w", make([]byte, 4096), client.Sharded); err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			step := int64(0)
			appendOne := func() time.Duration {
				step++
				if err := c.LogTruncate(step - 3); err != nil {
					b.Fatal(err)
				}
				src[0] = byte(step) // a new message each step
				t := time.Now()
				if err := c.LogAppend("act>1", step, 0, src); err != nil {
					b.Fatal(err)
				}
				return time.Since(t)
			}
			readOne := func() time.Duration {
				t := time.Now()
				if err := c.LogRead(ctx, "act>1", step, 0, dst); err != nil {
					b.Fatal(err)
				}
				return time.Since(t)
			}
			for range 3 { // the arenas the steady state rotates through
				appendOne()
			}
			var memmove, appendRates, readRates, appendRatios, readRatios []float64
			base := func() float64 {
				t := time.Now()
				copy(dst, src)
				r := gbps(size, time.Since(t))
				memmove = append(memmove, r)
				return r
			}
			const pairs = 4
			b.SetBytes(int64(size) * pairs)
			for i := 0; b.Loop(); {
				for range pairs {
					b.StopTimer()
					var m float64
					if i%2 == 0 {
						m = base()
					}
					b.StartTimer()
					ar, rr := gbps(size, appendOne()), gbps(size, readOne())
					b.StopTimer()
					if i%2 == 1 {
						m = base()
					}
					b.StartTimer()
					appendRates, readRates = append(appendRates, ar), append(readRates, rr)
					appendRatios, readRatios = append(appendRatios, ar/m), append(readRatios, rr/m)
					i++
				}
			}
			b.ReportMetric(mean(memmove), "memmove_GB/s")
			b.ReportMetric(mean(appendRates), "append_GB/s")
			b.ReportMetric(mean(readRates), "read_GB/s")
			b.ReportMetric(median(appendRatios), "append_x_memmove")
			b.ReportMetric(median(readRatios), "read_x_memmove")
		})
	}
}
