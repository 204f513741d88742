//go:build e2e

package e2e

import (
	"fmt"
	"math"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkGoodput (make bench-goodput, part of make bench;
// docs/BENCHMARKS.md, "Goodput against the status quo"): how much more
// training a job gets through node failures with reft than with what jobs
// do without it. For each trainer (go: reft-train; torch:
// examples/torch_ddp.py, DDP over gloo), the same run (DP 3, one rank per
// node, the same flags, so both arms must end with the same final
// parameters) and the same two node kills, twice on this cluster:
//
//   - the status quo: a synchronous, fsynced checkpoint to files on the
//     host's disk (the scratch directory, standing in for a shared
//     filesystem; --ckpt-dir: reft-train's per-rank files, torch.save on
//     rank 0) every N steps, N the Young/Daly optimum sqrt(2*C*MTBF) for
//     the checkpoint cost C measured first and the schedule's failure
//     rate; a node loss makes Slurm requeue the batch job (--requeue; the
//     script also requeues itself when srun fails first, as users' scripts
//     do), and the rerun loads the newest complete checkpoint;
//   - reft: --reft=arc,spares=2 under reft run, -N5 with two spare nodes
//     (a snapshot every step, --save-every 1).
//
// The failure schedule is fixed before the run, in training progress: the
// node holding rank 1 dies once rank 0 first logs step K1, the one holding
// rank 2 once it first logs step K2 (BENCH_GOODPUT_KILLS, fractions of the
// steps). Progress rather than wall time keeps the failures at the same
// point of training in both arms; with failures in wall time the slower
// arm would meet more of them, so this favours the status quo. Rank 0's
// node, which runs the batch script, is never killed.
//
// It reports each arm's goodput (steps per wall-clock second from sbatch
// to the final line), steps lost (work redone), time blocked per
// checkpoint or snapshot and each kill's time to the first step after the
// resume, and the ratio of reft's goodput to the status quo's. Each
// trainer takes about 11 minutes (make bench-goodput
// BENCH_GOODPUT=BenchmarkGoodput/go runs one).
func BenchmarkGoodput(b *testing.B) {
	enableReft(b)
	b.Run("go", func(b *testing.B) {
		flags := strings.Fields(goodputEnv("BENCH_GOODPUT_GO_FLAGS", "--size 8MiB --layers 4 --compute 150ms --batch 24 --micro 8 --optimizer adam --seed 5 --log-every 1"))
		goodputBench(b, flags, func(f ...string) []string { return append([]string{bin("reft-train")}, f...) })
	})
	b.Run("torch", func(b *testing.B) {
		flags := strings.Fields(goodputEnv("BENCH_GOODPUT_TORCH_FLAGS", "--size 1024 --layers 4 --batch 32 --optimizer adam --seed 5 --log-every 1"))
		goodputBench(b, flags, torchTask)
	})
}

// goodputBench calibrates, then runs both arms of one trainer; task makes
// a rank's command line from the trainer's flags.
func goodputBench(b *testing.B, flags []string, task func(flags ...string) []string) {
	length, err := time.ParseDuration(goodputEnv("BENCH_GOODPUT_LENGTH", "100s"))
	if err != nil || length <= 0 {
		b.Fatalf("BENCH_GOODPUT_LENGTH %q: want a duration, the failure-free run's length (e.g. 100s)", os.Getenv("BENCH_GOODPUT_LENGTH"))
	}
	var killAt []float64
	for _, f := range strings.Split(goodputEnv("BENCH_GOODPUT_KILLS", "0.3,0.65"), ",") {
		x, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || x <= 0 || x >= 1 || len(killAt) > 0 && x <= killAt[len(killAt)-1] {
			b.Fatalf("BENCH_GOODPUT_KILLS %q: want increasing fractions of the run in (0, 1), e.g. 0.3,0.65", os.Getenv("BENCH_GOODPUT_KILLS"))
		}
		killAt = append(killAt, x)
	}
	const dp = 3 // rank r on the r-th node; two spares with reft
	if len(killAt) > len(clusterNodes)-dp {
		b.Fatalf("%d kills: the cluster's %d nodes leave %d spares for DP %d", len(killAt), len(clusterNodes), len(clusterNodes)-dp, dp)
	}
	for _, n := range clusterNodes {
		reviveNode(b, n)
	}

	// The checkpoint's cost C and the step time without it, from a
	// failure-free run that checkpoints every 5 steps.
	cal := goodputArm(b, "calibration", task(append(slices.Clone(flags), "--steps", "30")...), 5, nil)
	if len(cal.saveMs) == 0 || cal.stepMs <= 0 {
		b.Fatalf("the calibration run logged no checkpoint or step time:\n%s", cal.out)
	}
	c := median(cal.saveMs) / 1e3
	step := cal.stepMs/1e3 - c/5 // its mean step includes a save every 5 steps
	steps := int64(math.Round(length.Seconds() / step))
	mtbf := length.Seconds() / float64(len(killAt))
	every := max(1, int64(math.Round(math.Sqrt(2*c*mtbf)/step)))
	var kills []int64
	for _, f := range killAt {
		kills = append(kills, int64(math.Round(f*float64(steps))))
	}
	b.Logf("calibration (job %s): checkpoint C = %.1f ms (median of %d), step %.1f ms without it; %d steps (%.0f s failure-free), kills after steps %v, MTBF %.0f s: Young/Daly N = sqrt(2*C*MTBF)/step = %d steps",
		cal.job, c*1e3, len(cal.saveMs), step*1e3, steps, length.Seconds(), kills, mtbf, every)
	flags = append(flags, "--steps", strconv.FormatInt(steps, 10))

	for i := 0; i < b.N; i++ {
		sq := goodputArm(b, "status quo", task(flags...), every, kills)
		rf := goodputArm(b, "reft", task(flags...), 0, kills)
		if sq.hash != rf.hash {
			b.Errorf("the arms ended with different parameters: status quo %s, reft %s", sq.hash, rf.hash)
		}
		for _, a := range []goodputResult{sq, rf} {
			b.Logf("%s", a.summary(steps))
		}
		ratio := rf.goodput(steps) / sq.goodput(steps)
		b.ReportMetric(sq.goodput(steps), "steps/s_statusquo")
		b.ReportMetric(rf.goodput(steps), "steps/s_reft")
		b.ReportMetric(ratio, "x_goodput")
		if h := sq.held(); h > 0 {
			// What the ratio would be against a status quo that waited for
			// no requeue hold (resubmission instead of requeue): computed,
			// not run.
			b.ReportMetric(rf.goodput(steps)*(sq.wall-h).Seconds()/float64(steps), "x_goodput_nohold")
		}
		b.Logf("goodput reft / status quo: %.2f (%d steps, kills after steps %v, checkpoint every %d steps at C = %.1f ms)", ratio, steps, kills, every, c*1e3)
	}
}

// goodputResult is one arm's run.
type goodputResult struct {
	name, job, out string
	wall           time.Duration // sbatch to the final line
	hash           string
	saveMs         []float64 // the status quo's per-checkpoint lines
	blockedMs      float64   // the last run's save-blocked-ms (per save)
	blockedSeen    bool      // a save-blocked-ms line was seen
	stepMs         float64   // the last run's mean-step-ms
	recoveries     []goodputRecovery
	// requeues are the status quo's job's requeues, by restart count.
	requeues map[int]requeue
}

// requeue is when slurmctld requeued a job (its new SubmitTime), when the
// job became eligible to start again (EligibleTime: Slurm holds a requeued
// job, whatever the free nodes) and when it started (StartTime, once
// running), to scontrol's second.
type requeue struct {
	restarts                  int
	submit, eligible, started time.Time
}

// goodputRecovery is one failure: the node killed, rank 0's last step
// logged before the restart, the step resumed from, and the kill's time to
// the first step logged after the resume.
type goodputRecovery struct {
	node           string
	killed         time.Time
	killStep, last int64
	resumed        int64
	toStep         time.Duration
}

func (g goodputResult) goodput(steps int64) float64 { return float64(steps) / g.wall.Seconds() }

// held is the sum of Slurm's requeue holds.
func (g goodputResult) held() time.Duration {
	var h time.Duration
	for _, q := range g.requeues {
		h += q.eligible.Sub(q.submit)
	}
	return h
}

func (g goodputResult) summary(steps int64) string {
	var lost int64
	var rec []string
	for _, r := range g.recoveries {
		// A JIT flush may save a step newer than the last one logged.
		l := max(0, r.last-r.resumed)
		lost += l
		rec = append(rec, fmt.Sprintf("%s killed at %s after step %d: resumed from step %d (%d lost), first step %.1f s after the kill", r.node, r.killed.Format("15:04:05.0"), r.killStep, r.resumed, l, r.toStep.Seconds()))
	}
	blocked := "time blocked per snapshot not reported by this trainer"
	if g.blockedSeen {
		blocked = fmt.Sprintf("%.1f ms blocked per snapshot", g.blockedMs)
	}
	if len(g.saveMs) > 0 {
		blocked = fmt.Sprintf("%.1f ms blocked per checkpoint (median of %d; %.1f ms mean in the last run)", median(g.saveMs), len(g.saveMs), g.blockedMs)
	}
	held := ""
	if h := g.held(); h > 0 {
		held = fmt.Sprintf(" (%.0f s of it Slurm's hold on %d requeues: %.3f steps/s without it)", h.Seconds(), len(g.requeues), float64(steps)/(g.wall-h).Seconds())
	}
	for k := 1; k <= len(g.requeues); k++ {
		if q, ok := g.requeues[k]; ok {
			started := "not seen running"
			if !q.started.IsZero() {
				started = fmt.Sprintf("started %.0f s after that", q.started.Sub(q.eligible).Seconds())
			}
			rec = append(rec, fmt.Sprintf("requeue %d at %s: eligible %.0f s later, %s", k, q.submit.Format("15:04:05"), q.eligible.Sub(q.submit).Seconds(), started))
		}
	}
	return fmt.Sprintf("%s (job %s): %d steps in %.1f s%s = %.3f steps/s; %d steps lost; %s; mean step %.1f ms; %s",
		g.name, g.job, steps, g.wall.Seconds(), held, g.goodput(steps), lost, blocked, g.stepMs, strings.Join(rec, "; "))
}

var (
	goodputStepRe  = regexp.MustCompile(`^step (\d+) loss `)
	goodputSaveRe  = regexp.MustCompile(`^checkpoint step \d+: \d+ bytes to \S+, blocked ([0-9.]+) ms$`)
	goodputStartRe = regexp.MustCompile(`^(reft-train: \d+ layers|torch_ddp: \d+ ranks on)`)
	goodputMeanRe  = regexp.MustCompile(`^mean-step-ms: ([0-9.]+)$`)
)

// goodputArm runs one arm of cmd (a rank's command line) to its end:
// every > 0 is the status quo (--ckpt-dir, a checkpoint every that many
// steps), 0 reft. kills lists the steps after which the node of rank 1,
// 2, ... dies. It watches rank 0's output (polled every 20 ms), kills on
// schedule and returns the figures; the killed nodes are revived after
// the run.
func goodputArm(b *testing.B, name string, cmd []string, every int64, kills []int64) goodputResult {
	b.Helper()
	dir := sharedDir(b, alice)
	u, err := user.Lookup(alice)
	if err != nil {
		b.Fatal(err)
	}
	var script string
	if every > 0 {
		ckpt := filepath.Join(dir, "ckpt")
		// What users do: srun the trainer; when it fails before Slurm
		// noticed the node (then Slurm requeues the job itself), requeue.
		script = fmt.Sprintf(`#!/bin/bash
#SBATCH -N%d --ntasks-per-node=1 --requeue --open-mode=append
echo "run ${SLURM_RESTART_COUNT:-0} on $SLURM_JOB_NODELIST"
srun --reft=off --mpi=pmix -K1 -N%d -n%d %s --ckpt-dir %s --save-every %d
rc=$?
echo "srun exit $rc"
if [ $rc != 0 ]; then scontrol requeue $SLURM_JOB_ID; sleep 600; fi
exit $rc
`, 3, 3, 3, strings.Join(cmd, " "), ckpt, every)
	} else {
		conf := filepath.Join(clusterDir, "etc", "reft-e2e.toml")
		script = fmt.Sprintf(`#!/bin/bash
#SBATCH -N%d --ntasks-per-node=1 --reft=arc,spares=%d --no-kill --requeue --open-mode=append
%s run --config %s --backoff 500ms -- %s --save-every 1
rc=$?
echo "reft run exit $rc"
[ $rc = 5 ] || srun --reft=off -N "$(squeue -h -j $SLURM_JOB_ID -o %%D)" --ntasks-per-node=1 rm -rf %s
exit $rc
`, len(clusterNodes), len(clusterNodes)-3, bin("reft"), conf, strings.Join(cmd, " "), filepath.Join(reftStoreRoot, u.Uid, "$SLURM_JOB_ID"))
	}
	submitted := time.Now()
	job := sbatchIn(b, dir, script)
	res := goodputResult{name: name, job: job, requeues: map[int]requeue{}}
	var killed []string
	defer func() {
		for _, n := range killed {
			reviveNode(b, n)
		}
	}()
	outPath := filepath.Join(dir, "slurm-"+job+".out")
	var (
		done        int              // bytes of the output consumed
		newest      int64            // the highest step rank 0 has logged
		last        int64            // the last step logged by the current run
		resumed     int64            // the step the current run resumed from
		resumedLine int64            // a "resumed from step" line before the run's banner; -1: none
		pending     *goodputRecovery // a kill whose first step after the resume is not seen yet
		restarted   bool             // pending's job has started training again
		killTime    time.Time
		finished    bool
		ended       string // the job's final state, seen before its final line
		polled      time.Time
	)
	resumedLine = -1
	deadline := time.Now().Add(12 * time.Minute)
	for !finished {
		if time.Now().After(deadline) {
			b.Fatalf("%s (job %s) did not finish in 12 minutes:\n%s", name, job, jobState(b, job))
		}
		time.Sleep(20 * time.Millisecond)
		data, _ := os.ReadFile(outPath)
		lastLook := ended != "" // the output is read once more after the job ended
		now := time.Now()
		for {
			i := strings.IndexByte(string(data[done:]), '\n')
			if i < 0 {
				break
			}
			line := string(data[done : done+i])
			done += i + 1
			switch {
			case goodputStartRe.MatchString(line): // a run (the first, or after a failure) starts training
				resumed, resumedLine = max(0, resumedLine), -1
				if pending != nil && !restarted {
					pending.last, pending.resumed, restarted = last, resumed, true
				}
				last = resumed
			case strings.HasPrefix(line, "resumed from step "):
				resumedLine, _ = strconv.ParseInt(strings.TrimPrefix(line, "resumed from step "), 10, 64)
			case goodputStepRe.MatchString(line):
				s, _ := strconv.ParseInt(goodputStepRe.FindStringSubmatch(line)[1], 10, 64)
				if pending != nil && restarted && s > pending.resumed {
					pending.toStep = now.Sub(killTime)
					res.recoveries = append(res.recoveries, *pending)
					pending = nil
				}
				last = s
				newest = max(newest, s)
			case goodputSaveRe.MatchString(line):
				v, _ := strconv.ParseFloat(goodputSaveRe.FindStringSubmatch(line)[1], 64)
				res.saveMs = append(res.saveMs, v)
			case saveBlockedRe.MatchString(line):
				res.blockedMs, _ = strconv.ParseFloat(saveBlockedRe.FindStringSubmatch(line)[1], 64)
				res.blockedSeen = true
			case goodputMeanRe.MatchString(line):
				res.stepMs, _ = strconv.ParseFloat(goodputMeanRe.FindStringSubmatch(line)[1], 64)
			case hashRe.MatchString(line + "\n"):
				res.hash = hashRe.FindStringSubmatch(line + "\n")[1]
				res.wall = now.Sub(submitted)
				finished = true
			}
		}
		if k := len(killed); !finished && pending == nil && k < len(kills) && newest >= kills[k] {
			node := rankNode(b, job, every == 0, k+1)
			killTime = time.Now()
			pending, restarted = &goodputRecovery{node: node, killStep: newest, killed: killTime}, false
			cluster(b, "kill-node", node)
			killed = append(killed, node)
		}
		if lastLook && !finished {
			b.Fatalf("%s (job %s) ended %s before its final line:\n%s", name, job, ended, data)
		}
		// NODE_FAIL is not an end here: the status quo's job is requeued.
		if !finished && time.Since(polled) > time.Second {
			polled = time.Now()
			if st := strings.Fields(jobState(b, job) + " x")[0]; st != "NODE_FAIL" && finalStates[st] {
				ended = st
			} else if every > 0 {
				if q, ok := requeueTimes(b, job); ok && q.restarts > 0 {
					res.requeues[q.restarts] = q
				}
			}
		}
	}
	if pending != nil || len(res.recoveries) != len(kills) {
		b.Fatalf("%s (job %s): %d kills, %d resumes seen:\n%s", name, job, len(kills), len(res.recoveries), jobOutput(b, dir, job))
	}
	if st := waitJob(b, job, 2*time.Minute); !strings.HasPrefix(st, "COMPLETED") {
		b.Fatalf("%s (job %s) ended %s:\n%s", name, job, st, jobOutput(b, dir, job))
	}
	res.out = jobOutput(b, dir, job)
	return res
}

var (
	restartsRe = regexp.MustCompile(` Restarts=(\d+) `)
	jobStateRe = regexp.MustCompile(` JobState=(\S+) `)
	submitRe   = regexp.MustCompile(` SubmitTime=(\S+) `)
	eligibleRe = regexp.MustCompile(` EligibleTime=(\S+) `)
	startRe    = regexp.MustCompile(` StartTime=(\S+) `)
)

// requeueTimes reads a job's restart count and requeue times from
// scontrol; ok is false when it does not say. started is zero until the
// job runs.
func requeueTimes(b *testing.B, job string) (q requeue, ok bool) {
	b.Helper()
	info := run(b, 30*time.Second, root, "scontrol", "-o", "show", "job", job).Stdout
	r, st, s, e, a := restartsRe.FindStringSubmatch(info), jobStateRe.FindStringSubmatch(info), submitRe.FindStringSubmatch(info), eligibleRe.FindStringSubmatch(info), startRe.FindStringSubmatch(info)
	if r == nil || st == nil || s == nil || e == nil || a == nil {
		return q, false
	}
	q.restarts, _ = strconv.Atoi(r[1])
	parse := func(v string) (time.Time, bool) {
		t, err := time.ParseInLocation("2006-01-02T15:04:05", v, time.Local)
		return t, err == nil
	}
	var ok1, ok2 bool
	q.submit, ok1 = parse(s[1])
	q.eligible, ok2 = parse(e[1])
	if st[1] == "RUNNING" {
		q.started, _ = parse(a[1])
	}
	return q, ok1 && ok2
}

// rankNode is the node that holds rank of job now: under reft run the
// newest hostfile's line (a spare takes a lost node's rank), else the
// job's nodes in order (srun's block placement, one task per node).
func rankNode(b *testing.B, job string, reft bool, rank int) string {
	b.Helper()
	var nodes []string
	if reft {
		files, _ := filepath.Glob(filepath.Join(clusterDir, "log", "reft", job, "hostfile.*"))
		best := -1
		for _, f := range files {
			if n, err := strconv.Atoi(strings.TrimPrefix(filepath.Ext(f), ".")); err == nil && n > best {
				best = n
				data, err := os.ReadFile(f)
				if err != nil {
					b.Fatal(err)
				}
				nodes = lines(string(data))
			}
		}
	} else {
		list := strings.TrimSpace(run(b, 30*time.Second, root, "squeue", "-h", "-j", job, "-o", "%N").Stdout)
		nodes = lines(run(b, 30*time.Second, root, "scontrol", "show", "hostnames", list).Stdout)
	}
	if rank >= len(nodes) {
		b.Fatalf("job %s: no node for rank %d in %v", job, rank, nodes)
	}
	return nodes[rank]
}

// reviveNode brings a killed node back (reviveIfDead for a benchmark).
func reviveNode(b testing.TB, node string) {
	b.Helper()
	out := run(b, time.Minute, root, repo+"/tests/cluster/cluster", "status").Stdout
	for _, l := range lines(out) {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "slurmd-"+node && f[1] == "down" {
			cluster(b, "revive", node)
		}
	}
}

func goodputEnv(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func median(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	if len(v) == 0 {
		return 0
	}
	if len(v)%2 == 0 {
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return v[len(v)/2]
}
