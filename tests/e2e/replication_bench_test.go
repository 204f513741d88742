//go:build e2e && e2enet

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkReplicationInterference (make bench-gemini; docs/BENCHMARKS.md):
// GEMINI's question, whether background replication slows training down
// where the network is the bottleneck. Four nodes of a --net cluster, each
// link capped by tc (cluster rate, BENCH_GEMINI_RATE), run reft-train with
// DP 4, ZeRO-1 AdamW (the moments are unreplicated: each rank's shard is
// copied to its GEMINI placement peer after every commit), --save-every 1
// and --compute (a GPU's forward and backward passes stand-in: an idle
// network span before each all-reduce), so replication and the gradient
// all-reduce compete on every step. The ranks model a GPU job's host: a
// small batch keeps their own CPU work short, and --comm-wait makes them
// sleep between tests of their collectives instead of polling in MPI's
// blocking calls. Four polling ranks on two cores leave the machine no
// idle CPU, and then what competes is the CPU, not the network
// (docs/BENCHMARKS.md, run 8; BENCH_GEMINI_FLAGS="--size 4MiB --compute
// 60ms --steps 32 --measure-from 17 --zero1 --optimizer adamw --save-every
// 1 --log-every 32 --batch 64 --micro 8" measures that case). Variants,
// each round in a rotated order:
//
//   - --reft=off: the baseline;
//   - --reft=arc with background replication throttled to nothing
//     ([protect] background_rate = 1 byte/s, background_burst = 1: the
//     first chunk sleeps off its debt for the rest of the job): what arc
//     costs besides replication (the snapshot every step, the agents), so
//     that replication's own interference is the others' distance from it;
//   - --reft=arc with [protect] background_schedule = "unscheduled",
//     "paused" (the default) and "idle" (agent/netsched), the latter
//     also with link_bandwidth set to the cap ("idle-link": the schedule
//     plans with the link's known rate instead of measuring it).
//
// BENCH_GEMINI_VARIANTS (names, comma-separated) runs a subset, beside
// "off". BENCH_GEMINI_RANK_ENV (NAME=VALUE,...) goes into every variant's
// ranks' environment, e.g. OMPI_MCA_mpi_yield_when_idle=1: four ranks on
// two cores are oversubscribed, and Open MPI polls in its collectives
// unless told to yield. Each job's line also says what the machine's CPUs did (from
// /proc/stat), what the agents and the ranks used (CPU time and context
// switches, sampled from /proc) and sacct's CPU per step: on two cores
// shared by four nodes, replication's cost is the CPU's as much as the
// link's.
//
// It reports each variant's median over the rounds of the per-round ratio
// of the slowest rank's mean step time to the baseline's, in the steady
// state (the steps from --measure-from on, after the idle schedule's
// profile of the first steps; the whole run's ratios are logged beside
// them), and checks that every
// --reft=arc run but the throttled one committed replicas (else it
// measured nothing), that the throttled one committed none, and that
// "idle" learned a timeline.
func BenchmarkReplicationInterference(b *testing.B) {
	if !clusterNet() {
		b.Fatal("needs the nodes' own networks: bring the cluster up with 'tests/cluster/cluster up --net --no-reft'")
	}
	rate := envOr("BENCH_GEMINI_RATE", "200mbit")
	rounds, _ := strconv.Atoi(envOr("BENCH_GEMINI_ROUNDS", "5"))
	rankEnv := os.Getenv("BENCH_GEMINI_RANK_ENV")
	flags := strings.Fields(envOr("BENCH_GEMINI_FLAGS", "--size 4MiB --compute 150ms --steps 48 --measure-from 17 --zero1 --optimizer adamw --save-every 1 --log-every 48 --batch 32 --micro 8 --comm-wait 200us"))
	nodes := []string{"n1", "n2", "n3", "n4"}
	for _, n := range nodes {
		cluster(b, "rate", n, rate)
		b.Cleanup(func() { cluster(b, "rate", n, "off") })
	}
	conf := filepath.Join(clusterDir, "etc", "reft-gemini-bench.toml")
	enableReftArgs(b, "config="+conf)
	type variant struct{ name, reft, schedule string }
	variants := []variant{
		{"off", "--reft=off", ""},
		{"norepl", "--reft=arc", "norepl"},
		{"unscheduled", "--reft=arc", "unscheduled"},
		{"paused", "--reft=arc", "paused"},
		{"idle", "--reft=arc", "idle"},
		{"idle-link", "--reft=arc", "idle-link"},
	}
	if only := os.Getenv("BENCH_GEMINI_VARIANTS"); only != "" { // a subset, for a closer look; off stays the baseline
		keep := strings.Split(only, ",")
		variants = slices.DeleteFunc(variants, func(v variant) bool {
			return v.name != "off" && !slices.Contains(keep, v.name)
		})
	}
	norepl := slices.IndexFunc(variants, func(v variant) bool { return v.name == "norepl" })
	for i := 0; i < b.N; i++ {
		ratios := make([][]float64, len(variants))
		whole := make([][]float64, len(variants))
		for r := range rounds {
			ms, all := make([]float64, len(variants)), make([]float64, len(variants))
			for k := range variants {
				v := (r + k) % len(variants)
				vr := variants[v]
				writeBenchConf(b, conf, vr.schedule, linkBytes(b, rate))
				cpu0 := readCPUStat(b)
				use := sampleProcs("reft-agent", "reft-train")
				job, stepMs, out := benchTrainEnv(b, nodes, vr.reft, rankEnv, flags)
				cpu := readCPUStat(b).sub(cpu0)
				used := use()
				all[v], ms[v] = stepMs, stepMs
				if s, ok := slowest(steadyStepRe, out); ok {
					ms[v] = s
				}
				what := fmt.Sprintf("round %d %s (job %s): %.1f ms/step in the steady state, %.1f over the whole run; %s; the agents %s; the ranks %s; %s", r, vr.name, job, ms[v], all[v], cpu, used["reft-agent"], used["reft-train"], stepsCPU(b, job))
				if blocked, ok := slowest(saveBlockedRe, out); ok {
					what += fmt.Sprintf("; rank 0 blocked %.1f ms per save", blocked)
				}
				if vr.schedule != "" {
					what += "; " + replicationSummary(b, job, nodes, vr.schedule)
				}
				b.Log(what)
			}
			for v := range variants {
				ratios[v] = append(ratios[v], ms[v]/ms[0])
				whole[v] = append(whole[v], all[v]/all[0])
			}
		}
		med := func(v []float64) float64 {
			v = slices.Clone(v)
			slices.Sort(v)
			if len(v)%2 == 0 {
				return (v[len(v)/2-1] + v[len(v)/2]) / 2
			}
			return v[len(v)/2]
		}
		var sum, sumAll []string
		for v := 1; v < len(variants); v++ {
			b.ReportMetric(med(ratios[v]), "x_"+variants[v].name)
			sum = append(sum, fmt.Sprintf("%s %.3f %.3f", variants[v].name, med(ratios[v]), ratios[v]))
			sumAll = append(sumAll, fmt.Sprintf("%s %.3f %.3f", variants[v].name, med(whole[v]), whole[v]))
		}
		b.Logf("the whole run's step time against --reft=off (median, per round): %s", strings.Join(sumAll, "; "))
		b.Logf("links capped at %s; reft-train %s (ranks' added environment: %q); steady-state step time against --reft=off, median of %d rounds (per round): %s",
			rate, strings.Join(flags, " "), rankEnv, rounds, strings.Join(sum, "; "))
		// Replication's own interference: each schedule against arc
		// without replication, per round.
		var own []string
		for v := 1; v < len(variants) && norepl > 0; v++ {
			if v == norepl {
				continue
			}
			var rs []float64
			for r := range ratios[v] {
				rs = append(rs, ratios[v][r]/ratios[norepl][r])
			}
			b.ReportMetric(med(rs), "x_"+variants[v].name+"_vs_norepl")
			own = append(own, fmt.Sprintf("%s %.3f %.3f", variants[v].name, med(rs), rs))
		}
		b.Logf("replication's own interference, step time against arc without replication (median, per round): %s", strings.Join(own, "; "))
	}
}

// cpuStat is the machine's CPU time by kind (/proc/stat's first line, in
// clock ticks): where a variant's extra step time goes on a machine whose
// cores the nodes share.
type cpuStat struct{ user, system, softirq, idle, total int64 }

func readCPUStat(t testing.TB) cpuStat {
	t.Helper()
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0]) // cpu user nice system idle iowait irq softirq steal ...
	var v []int64
	for _, x := range f[1:] {
		n, _ := strconv.ParseInt(x, 10, 64)
		v = append(v, n)
	}
	s := cpuStat{user: v[0] + v[1], system: v[2] + v[5], softirq: v[6], idle: v[3] + v[4]}
	for _, n := range v[:min(len(v), 8)] {
		s.total += n
	}
	return s
}

func (s cpuStat) sub(o cpuStat) cpuStat {
	return cpuStat{s.user - o.user, s.system - o.system, s.softirq - o.softirq, s.idle - o.idle, s.total - o.total}
}

func (s cpuStat) String() string {
	pct := func(n int64) float64 { return 100 * float64(n) / float64(max(s.total, 1)) }
	return fmt.Sprintf("machine CPU %.0f%% user, %.0f%% system, %.0f%% softirq, %.0f%% idle", pct(s.user), pct(s.system), pct(s.softirq), pct(s.idle))
}

// clockTicks is USER_HZ, /proc's unit of CPU time (100 on Linux).
const clockTicks = 100

// procUse is what a set of processes used: CPU time in clock ticks
// (utime+stime) and context switches, voluntary (it slept) and not (it
// was preempted), summed over their threads.
type procUse struct{ ticks, vol, invol int64 }

func (u procUse) String() string {
	return fmt.Sprintf("%.1f s CPU, %d voluntary and %d involuntary context switches", float64(u.ticks)/clockTicks, u.vol, u.invol)
}

// sampleProcs samples, every 200 ms until the returned function is
// called, what the processes named by comms use (utime+stime and their
// threads' context switches), in one scan of /proc for them all, and that
// function returns the sums per name as last seen: what a process used in its last 200 ms is missed, and processes
// that ran before the call (another job's, exiting) are not counted.
func sampleProcs(comms ...string) func() map[string]procUse {
	stop, done := make(chan struct{}), make(chan map[string]procUse)
	before := map[string]bool{} // another job's processes, still exiting
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		before[e.Name()] = true
	}
	go func() {
		seen := map[string]procUse{} // by pid
		name := map[string]string{}  // pid -> comm
		for {
			ents, _ := os.ReadDir("/proc")
			for _, e := range ents {
				if before[e.Name()] {
					continue
				}
				c, err := os.ReadFile("/proc/" + e.Name() + "/comm")
				if err != nil || !slices.Contains(comms, strings.TrimSpace(string(c))) {
					continue
				}
				st, err := os.ReadFile("/proc/" + e.Name() + "/stat")
				if err != nil {
					continue
				}
				var u procUse
				f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+1:])) // state is f[0]; utime f[11], stime f[12]
				if len(f) > 12 {
					ut, _ := strconv.ParseInt(f[11], 10, 64)
					s, _ := strconv.ParseInt(f[12], 10, 64)
					u.ticks = ut + s
				}
				tasks, _ := os.ReadDir("/proc/" + e.Name() + "/task")
				for _, t := range tasks {
					b, err := os.ReadFile("/proc/" + e.Name() + "/task/" + t.Name() + "/status")
					if err != nil {
						continue
					}
					for _, l := range strings.Split(string(b), "\n") {
						k, v, _ := strings.Cut(l, ":")
						n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
						switch k {
						case "voluntary_ctxt_switches":
							u.vol += n
						case "nonvoluntary_ctxt_switches":
							u.invol += n
						}
					}
				}
				if u.ticks >= seen[e.Name()].ticks {
					seen[e.Name()], name[e.Name()] = u, strings.TrimSpace(string(c))
				}
			}
			select {
			case <-stop:
				sum := map[string]procUse{}
				for pid, v := range seen {
					t := sum[name[pid]]
					sum[name[pid]] = procUse{t.ticks + v.ticks, t.vol + v.vol, t.invol + v.invol}
				}
				done <- sum
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return func() map[string]procUse { close(stop); return <-done }
}

// stepsCPU is what sacct says each of job's steps used of the CPU (the
// extern step holds the agents; jobacct_gather/linux).
func stepsCPU(t testing.TB, job string) string {
	t.Helper()
	r := run(t, 30*time.Second, root, "sacct", "-n", "-P", "-j", job, "-o", "JobID,TotalCPU,UserCPU,SystemCPU")
	return "sacct " + strings.Join(lines(r.Stdout), " ")
}

// linkBytes is tc's rate (as "200mbit") in bytes per second.
func linkBytes(t testing.TB, rate string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(strings.TrimSuffix(rate, "mbit"), 10, 64)
	if err != nil || !strings.HasSuffix(rate, "mbit") {
		t.Fatalf("BENCH_GEMINI_RATE %q: want N mbit, e.g. 200mbit", rate)
	}
	return n * 1e6 / 8
}

// writeBenchConf writes the e2e reft.toml with background_schedule
// (empty: the default; "norepl": replication throttled to nothing;
// "idle-link": idle with link_bandwidth = link); the agents read it at the
// job's start.
func writeBenchConf(t testing.TB, path, schedule string, link int64) {
	t.Helper()
	base, err := os.ReadFile(writeReftConf(t))
	if err != nil {
		t.Fatal(err)
	}
	switch schedule {
	case "":
	case "norepl":
		base = append(base, "[protect]\nbackground_rate = 1\nbackground_burst = 1\n"...)
	case "idle-link":
		base = append(base, fmt.Sprintf("[protect]\nbackground_schedule = \"idle\"\nlink_bandwidth = %d\n", link)...)
	default:
		base = append(base, fmt.Sprintf("[protect]\nbackground_schedule = %q\n", schedule)...)
	}
	if err := os.WriteFile(path, base, 0o644); err != nil {
		t.Fatal(err)
	}
}

// replicationSummary checks that job's agents committed replicas and, for
// "idle", learned a timeline, and says what they did.
func replicationSummary(t testing.TB, job string, nodes []string, schedule string) string {
	t.Helper()
	var committed, learned int
	var stats []string
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range nodes {
		var ev map[string][]map[string]any
		for { // the agent logs its schedule's stats as it exits, after the job
			ev = agentEvents(t, job, n)
			if !strings.HasPrefix(schedule, "idle") || len(ev["replication_schedule_stats"]) > 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		committed += len(ev["replica_committed"])
		learned += len(ev["replication_schedule_learned"])
		for _, s := range ev["replication_schedule_stats"] {
			stats = append(stats, fmt.Sprintf("%s: %v chunks in idle spans, %v unplanned, %v spans skipped, %v phases overrun, %v oversize, %v re-profiles, %.0f MB/s",
				n, s["chunks_in_idle_spans"], s["chunks_unplanned"], s["idle_spans_skipped"], s["phases_overrun"], s["chunks_oversize"], s["reprofiles"], num(s["bandwidth_bytes_per_s"])/1e6))
		}
	}
	switch {
	case schedule == "norepl" && committed > 0:
		t.Errorf("job %s (norepl): %d replicas committed at 1 byte/s: the variant measured replication", job, committed)
	case schedule != "norepl" && committed == 0:
		t.Errorf("job %s (%s): no replica committed: the run measured no replication", job, schedule)
	}
	if strings.HasPrefix(schedule, "idle") && learned == 0 {
		t.Errorf("job %s (idle): no agent learned a communication timeline", job)
	}
	return fmt.Sprintf("%d replicas committed, %d timelines learned; %s", committed, learned, strings.Join(stats, "; "))
}

func num(v any) float64 { f, _ := v.(float64); return f }
