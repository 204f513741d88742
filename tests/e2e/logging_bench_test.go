//go:build e2e

package e2e

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// BenchmarkLoggingOverhead (make bench; docs/BENCHMARKS.md, "Message
// logging"): the steady-state cost of SWIFT's message logging (issue 20).
// reft-train --pp 4 (dp 1, one stage per node on n1-n4, real Open MPI)
// with --compute (a GPU's forward and backward stand-in, which leaves the
// stages' CPUs idle for the bubble-time copies) runs, each round in a
// rotated order:
//
//   - --reft=off: the baseline;
//   - --reft=arc, a snapshot every BENCH_LOG_EVERY steps, no logging;
//   - the same with --log-messages=sync (each message copied into the node
//     agent's log right after its send);
//   - the same with --log-messages=bubble (copied while the rank waits for
//     a message; what a step sent after its last wait, at the step's end).
//
// It reports each variant's median over the rounds of its per-round ratio
// of the slowest rank's mean step time to the baseline's (x_arc, x_sync,
// x_bubble), and checks that the logging runs logged.
func BenchmarkLoggingOverhead(b *testing.B) {
	enableReft(b)
	rounds, _ := strconv.Atoi(envOr("BENCH_LOG_ROUNDS", "2"))
	every := envOr("BENCH_LOG_EVERY", "4")
	flags := strings.Fields(envOr("BENCH_LOG_FLAGS", "--pp 4 --dp 1 --size 4MiB --layers 8 --compute 40ms --steps 24 --log-every 24 --batch 256 --micro 32"))
	nodes := []string{"n1", "n2", "n3", "n4"}
	variants := []struct {
		name, reft string
		extra      []string
	}{
		{"off", "--reft=off", nil},
		{"arc", "--reft=arc", []string{"--save-every", every}},
		{"sync", "--reft=arc", []string{"--save-every", every, "--log-messages", "sync"}},
		{"bubble", "--reft=arc", []string{"--save-every", every, "--log-messages", "bubble"}},
	}
	for i := 0; i < b.N; i++ {
		ratios := make([][]float64, len(variants))
		for r := range rounds {
			ms := make([]float64, len(variants))
			for k := range variants {
				v := (r + k) % len(variants)
				vr := variants[v]
				job, stepMs, out := benchTrainOut(b, nodes, vr.reft, append(slices.Clone(flags), vr.extra...))
				ms[v] = stepMs
				note := ""
				if strings.Contains(strings.Join(vr.extra, " "), "--log-messages") {
					if !strings.Contains(out, "message-log:") && vr.name == "bubble" {
						b.Fatalf("round %d %s (job %s): no message-log line: did it log?\n%s", r, vr.name, job, out)
					}
					note = logLine(out)
				}
				b.Logf("round %d %s (job %s): %.1f ms/step %s", r, vr.name, job, stepMs, note)
			}
			for v := range variants {
				ratios[v] = append(ratios[v], ms[v]/ms[0])
			}
		}
		var sum []string
		for v := 1; v < len(variants); v++ {
			b.ReportMetric(medianOf(ratios[v]), "x_"+variants[v].name)
			sum = append(sum, fmt.Sprintf("%s %.3f %.3f", variants[v].name, medianOf(ratios[v]), ratios[v]))
		}
		b.Logf("reft-train %s, snapshots every %s; step time against --reft=off, median of %d rounds (per round): %s",
			strings.Join(flags, " "), every, rounds, strings.Join(sum, "; "))
	}
}

// logLine is reft-train's message-log summary line, if any.
func logLine(out string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "message-log:") {
			return "(" + l + ")"
		}
	}
	return ""
}

func medianOf(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	if len(v)%2 == 0 {
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return v[len(v)/2]
}
