package detect

import (
	"testing"
	"time"

	"github.com/reft-hpc/reft/agent/config"
)

// BenchmarkDetectNodeLoss measures the time from a node's death to the
// coordinator's publication with reft.toml's default timers, for four
// agents on the tests' in-memory network, in real time: "reset" is a death
// the other agents' kernels see (connections refused: a killed process, or
// the test cluster's kill-node), "silent" one they do not (a node that
// vanishes: detect.timeout, then the whole detect.window). Reported as
// ms/kill; the budget is 2 s, which the silent case exceeds by design
// (docs/BENCHMARKS.md).
func BenchmarkDetectNodeLoss(b *testing.B) {
	d := config.Default().Detect
	for _, how := range []string{"node", "silent"} {
		name := map[string]string{"node": "reset", "silent": "silent"}[how]
		b.Run(name, func(b *testing.B) {
			var total time.Duration
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				j := newJobTimed(b, 4, nil, d.Interval.D(), d.Timeout.D(), d.Confirm.D())
				b.StartTimer()
				killed := time.Now()
				j.kill("n3", how)
				for len(j.agents["n1"].failures()) == 0 {
					if time.Since(killed) > 10*time.Second {
						b.Fatalf("no failure published 10 s after killing n3 (%s)", how)
					}
					time.Sleep(time.Millisecond)
				}
				total += j.agents["n1"].failures()[0].DetectedAt.Sub(killed)
				b.StopTimer()
				for _, n := range j.names {
					j.kill(n, "agent")
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/kill")
		})
	}
}
