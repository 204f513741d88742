package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/client"
	"github.com/reft-hpc/reft/examples/trainer/train"
	"github.com/reft-hpc/reft/tests/conformance-agent/agenttest"
)

// soloComm is the communicator of a one-rank job. Its collectives cost
// nothing, so the baseline step is pure training work and the overhead
// ratio is not diluted by communication.
type soloComm struct{}

func (soloComm) Rank() int                             { return 0 }
func (soloComm) Size() int                             { return 1 }
func (soloComm) AllReduceSumI64([]int64) error         { return nil }
func (soloComm) AllGatherF32(dst, src []float32) error { copy(dst, src); return nil }
func (soloComm) Barrier() error                        { return nil }
func (soloComm) Sub([]int) (train.Comm, error)         { return soloComm{}, nil }
func (soloComm) SendF32(int, int, []float32) error     { return errors.New("send in a one-rank job") }
func (soloComm) RecvF32(int, int, []float32) error     { return errors.New("recv in a one-rank job") }

// benchConfig is the trainer of the overhead benchmark: 96 MiB of float32
// parameters under Adam, so 288 MiB of registered state (parameters and
// both moments) is snapshotted every step. REFT_BENCH_TRAIN_SIZE (e.g.
// 256MiB) changes the parameter size, REFT_BENCH_TRAIN_STEPS the steps per
// round.
func benchConfig(b *testing.B, steps int64) train.Config {
	c := train.Defaults()
	c.SizeBytes, c.Steps, c.SaveEvery, c.LogEvery = 96<<20, steps, 1, 1
	if s := os.Getenv("REFT_BENCH_TRAIN_SIZE"); s != "" {
		n, err := train.ParseSize(s)
		if err != nil {
			b.Fatalf("REFT_BENCH_TRAIN_SIZE: %v", err)
		}
		c.SizeBytes = n
	}
	if s := os.Getenv("REFT_BENCH_TRAIN_STEPS"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= benchWarmup+1 {
			b.Fatalf("REFT_BENCH_TRAIN_STEPS=%q: want more than %d steps", s, benchWarmup+1)
		}
		c.Steps = n
	}
	if err := c.Validate(1); err != nil {
		b.Fatal(err)
	}
	return c
}

// benchWarmup steps of each round are not measured: the first save maps
// the arena, and both sides fault in their fresh allocations.
const benchWarmup = 2

// sample is one reading of the clocks: wall time, this process's CPU time
// (every thread: trainers, copier and the in-process agent) and the whole
// machine's busy time.
type sample struct {
	wall      time.Time
	cpu, busy time.Duration
}

func now() (sample, error) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return sample{}, fmt.Errorf("getrusage: %w", err)
	}
	busy, err := machineBusy()
	if err != nil {
		return sample{}, err
	}
	return sample{time.Now(), time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), busy}, nil
}

// machineBusy is the CPU time all processes have used since boot, from the
// cpu line of /proc/stat (user nice system idle iowait irq softirq steal
// ..., in USER_HZ ticks): everything but idle and iowait. Steal counts as
// busy: the hypervisor gave the time to another guest.
func machineBusy() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, fmt.Errorf("machine busy time: %w", err)
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 9 || f[0] != "cpu" {
		return 0, fmt.Errorf("machine busy time: /proc/stat starts with %q", line)
	}
	var ticks int64
	for i, v := range f[1:9] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("machine busy time: /proc/stat field %d: %w", i+1, err)
		}
		if i != 3 && i != 4 { // idle, iowait
			ticks += n
		}
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// userHZ is the unit of /proc/stat: 100 on every Linux architecture Go
// supports.
const userHZ = 100

// stepClock is the trainer's log: rank 0 writes one "step N loss X" line at
// the end of every step (LogEvery 1), and the clock reads the clocks there.
// With a baton, the trainer then waits for its next turn, and the next step
// starts when it has it.
type stepClock struct {
	steps      int64 // the round's steps: the last one passes the baton for good
	baton      *baton
	me         int
	start, end []sample // start[i] begins step i+2; end[i] ends step i+1
	blocked    time.Duration
}

func (c *stepClock) Write(p []byte) (int, error) {
	if !bytes.HasPrefix(p, []byte("step ")) {
		return len(p), nil
	}
	s, err := now()
	if err != nil {
		return 0, err
	}
	c.end = append(c.end, s)
	if c.baton != nil {
		c.baton.pass(c.me, int64(len(c.end)) == c.steps)
		if s, err = now(); err != nil {
			return 0, err
		}
	}
	c.start = append(c.start, s)
	return len(p), nil
}

// stepTimes are one step's wall and CPU milliseconds, and the CPU
// milliseconds other processes used meanwhile.
type stepTimes struct{ wall, cpu, others float64 }

// quiet reports whether other processes left the step alone: they used
// under 5 % of the machine's cores for its duration.
func (s stepTimes) quiet() bool { return s.others < 0.05*s.wall*float64(runtime.NumCPU()) }

// times returns every step after the warm-up, but the last n.
func (c *stepClock) times(dropLast int) []stepTimes {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
	var out []stepTimes
	for i := benchWarmup; i < len(c.end)-dropLast; i++ {
		a, e := c.start[i-1], c.end[i]
		cpu := e.cpu - a.cpu
		out = append(out, stepTimes{wall: ms(e.wall.Sub(a.wall)), cpu: ms(cpu), others: ms(e.busy - a.busy - cpu)})
	}
	return out
}

// baton lets trainers take turns, one step each.
type baton struct {
	mu   sync.Mutex
	cond sync.Cond
	turn int
	done []bool
}

func newBaton(n int) *baton {
	b := &baton{done: make([]bool, n)}
	b.cond.L = &b.mu
	return b
}

// pass gives the turn to the next trainer that has steps left and waits
// for this one's, unless this one has finished.
func (b *baton) pass(me int, finished bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.done[me] = finished
	b.turn = -1
	for k := 1; k <= len(b.done); k++ {
		if i := (me + k) % len(b.done); !b.done[i] {
			b.turn = i
			break
		}
	}
	b.cond.Broadcast()
	for !finished && b.turn != me {
		b.cond.Wait()
	}
}

// Variants of a round: no snapshots, and Save every step with and without
// the trainer's idle-window hints.
const (
	snapOff = iota
	snapOn
	snapNoHints
	variants
	// snapEvery0 (BenchmarkEvery0Overhead only): --reft=arc,every=0 with
	// --undo, whose saves are progress heartbeats.
	snapEvery0 = variants
)

var variantName = [variants + 1]string{"off", "on", "on-nohints", "every0-undo"}

// timedSnap measures how long the trainer is blocked waiting for saves:
// the part of the copy that did not overlap its work.
type timedSnap struct {
	*reftSnap
	waits []time.Duration // one per Wait: for save k in step k+1, the last after the loop
}

func (s *timedSnap) Save(step int64) (train.Waiter, error) {
	w, err := s.reftSnap.Save(step)
	return timedWait{w, s}, err
}

type timedWait struct {
	w train.Waiter
	s *timedSnap
}

func (w timedWait) Wait() error {
	t0 := time.Now()
	err := w.w.Wait()
	w.s.waits = append(w.s.waits, time.Since(t0))
	return err
}

// trainRound trains cfg once into clock, with a reft client on a fresh
// in-process agent unless v is snapOff. It may run on any goroutine.
func trainRound(cfg train.Config, v int, clock *stepClock) (err error) {
	clock.steps = cfg.Steps
	o := train.Options{Comm: soloComm{}, Log: clock}
	var s *reftSnap
	if v != snapOff {
		spec := ""
		if v == snapEvery0 {
			spec, cfg.Undo = "arc,every=0", true
		}
		a, err := agenttest.Start(agenttest.Options{Spec: spec})
		if err != nil {
			return err
		}
		defer a.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if s, err = openReft(ctx, client.Options{Socket: a.Socket, World: 1}); err != nil {
			return err
		}
		defer func() { err = errors.Join(err, s.Close()) }()
		ts := &timedSnap{reftSnap: s}
		o.Snap = ts
		cfg.Hints = v != snapNoHints
		defer func() {
			// The waits inside the measured steps: for saves benchWarmup
			// to Steps-1 (the last save is waited for after the loop).
			for _, d := range ts.waits[benchWarmup-1 : cfg.Steps-1] {
				clock.blocked += d
			}
		}()
	}
	if _, err := train.Run(cfg, o); err != nil {
		return err
	}
	if len(clock.end) != int(cfg.Steps) {
		return fmt.Errorf("%d step lines for %d steps", len(clock.end), cfg.Steps)
	}
	if s != nil && v == snapEvery0 {
		// every=0: the saves were heartbeats, nothing is committed.
		gens, err := s.c.Generations(context.Background())
		if err != nil || len(gens) != 0 {
			return fmt.Errorf("every=0: after %d steps the agent holds generations %v (%v), want none", cfg.Steps, gens, err)
		}
	} else if s != nil {
		// Every step was saved: the agent lists the last one as committed.
		gens, err := s.c.Generations(context.Background())
		if err != nil || len(gens) == 0 || gens[0] != cfg.Steps {
			return fmt.Errorf("after %d steps the agent holds generations %v (%v)", cfg.Steps, gens, err)
		}
	}
	return nil
}

func median(v []float64) float64 { return quantile(v, 0.5) }

// medianCI is the distribution-free 95 % confidence interval of the
// median: the order statistics n/2 -+ 0.98 sqrt(n); 0s for fewer than 6.
func medianCI(v []float64) (lo, hi float64) {
	n := len(v)
	if n < 6 {
		return 0, 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	d := 0.98 * math.Sqrt(float64(n))
	return v[max(int(math.Floor(float64(n)/2-d)), 0)], v[min(int(math.Ceil(float64(n)/2+d)), n-1)]
}

// quantile interpolates linearly between the closest ranks; 0 for none.
func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	pos := q * float64(len(v)-1)
	i := int(pos)
	if i+1 >= len(v) {
		return v[len(v)-1]
	}
	return v[i] + (pos-float64(i))*(v[i+1]-v[i])
}

// labelled runs f with a profiler label naming the variant, so that a
// -cpuprofile splits by variant (pprof -tagfocus 'snapshots=^on$'):
// goroutines inherit labels, the in-process agent's and the copier's
// included.
func labelled(v int, f func()) {
	pprof.Do(context.Background(), pprof.Labels("snapshots", variantName[v]), func(context.Context) { f() })
}

func describe(b *testing.B, cfg train.Config, what string) {
	b.Logf("state %d MiB per rank (%d layers of width %d, Adam), batch %d, GOMAXPROCS %d, %d steps per round, %s",
		3*cfg.SizeBytes>>20, cfg.Layers, cfg.Width(), cfg.Batch, runtime.GOMAXPROCS(0), cfg.Steps, what)
}

// BenchmarkSnapshotOverhead is the per-iteration cost of snapshotting the
// whole training state every step (issue 5, target x_off <= 1.03):
// reft-train's step with Save(step) every step into a real agent and store
// over the socket, against the same trainer without snapshots. Each op
// runs the two trainers side by side in one process, taking turns step by
// step, so every step of one is measured next to the same step of the
// other, a second apart, and slow changes of the machine cancel. With
// hints a save's copy waits for the idle window of its trainer's next
// step, so it never runs in the other trainer's turn. x_off and x_off_cpu
// are the medians over the step pairs of on/off, in wall time (pairs that
// other processes left alone; _lo95 and _hi95 the median's 95 % confidence
// interval, _p25 and _p75 the quartiles; _all: every pair) and in this
// process's CPU time. See docs/BENCHMARKS.md.
func BenchmarkSnapshotOverhead(b *testing.B) { pairedOverhead(b, snapOn) }

// BenchmarkEvery0Overhead is BenchmarkSnapshotOverhead's pairing for issue
// 20's every=0 mode: the trainer with --undo under --reft=arc,every=0
// (each Save a progress heartbeat, the update recorded for undo) against
// the same trainer without reft, step by step. x_off should be the undo
// recording's share of the step and little else.
func BenchmarkEvery0Overhead(b *testing.B) { pairedOverhead(b, snapEvery0) }

// pairedOverhead runs the trainer without snapshots and as variant on
// side by side, taking turns step by step (BenchmarkSnapshotOverhead).
func pairedOverhead(b *testing.B, snapOn int) {
	cfg := benchConfig(b, 10)
	describe(b, cfg, fmt.Sprintf("%s against off, steps %d to %d measured", variantName[snapOn], benchWarmup+1, cfg.Steps-1))
	var wallX, allX, cpuX, offMs []float64
	pairs := 0
	for i := range b.N {
		runtime.GC() // the previous op's garbage is not this op's cost
		bt := newBaton(2)
		var clocks [variants + 1]*stepClock
		clocks[snapOff], clocks[snapOn] = &stepClock{baton: bt}, &stepClock{baton: bt}
		// Alternate which trainer goes first.
		clocks[snapOff].me, clocks[snapOn].me = i%2, 1-i%2
		var errs [variants + 1]error
		var wg sync.WaitGroup
		for _, v := range []int{snapOff, snapOn} {
			wg.Add(1)
			go labelled(v, func() {
				defer wg.Done()
				errs[v] = trainRound(cfg, v, clocks[v])
				if errs[v] != nil {
					bt.pass(clocks[v].me, true) // let the other one finish
				}
			})
		}
		wg.Wait()
		if err := errors.Join(errs[:]...); err != nil {
			b.Fatal(err)
		}
		// The last step of the second trainer overlaps the first one's
		// final save and hash: drop the last step of both.
		off, on := clocks[snapOff].times(1), clocks[snapOn].times(1)
		var opWall []float64
		for k := range off {
			pairs++
			cpuX = append(cpuX, on[k].cpu/off[k].cpu)
			allX = append(allX, on[k].wall/off[k].wall)
			if off[k].quiet() && on[k].quiet() {
				wallX = append(wallX, on[k].wall/off[k].wall)
				opWall = append(opWall, wallX[len(wallX)-1])
				offMs = append(offMs, off[k].wall)
			}
		}
		b.Logf("op %d: %d of %d step pairs quiet, median on/off wall x%.4f; waiting for saves %.1f ms/step", i,
			len(opWall), len(off), median(opWall), float64(clocks[snapOn].blocked.Microseconds())/1e3/float64(len(on)+1))
	}
	if len(wallX) == 0 {
		b.Log("the machine was too busy in every step for a wall-time ratio")
	}
	b.ReportMetric(median(wallX), "x_off")
	lo, hi := medianCI(wallX)
	b.ReportMetric(lo, "x_off_lo95")
	b.ReportMetric(hi, "x_off_hi95")
	b.ReportMetric(quantile(wallX, 0.25), "x_off_p25")
	b.ReportMetric(quantile(wallX, 0.75), "x_off_p75")
	b.ReportMetric(median(allX), "x_off_all")
	b.ReportMetric(median(cpuX), "x_off_cpu")
	b.ReportMetric(float64(len(wallX))/float64(max(pairs, 1)), "quiet_pairs")
	b.ReportMetric(median(offMs), "off_ms/step")
	b.ReportMetric(float64(3*cfg.SizeBytes)/(1<<20), "state_MiB")
}

// BenchmarkSnapshotOverheadRounds compares whole rounds instead: every op
// runs one round of each variant (off, on, on without hints) after the
// other, in an order that rotates from op to op, and gives one ratio per
// variant, its median step over the off round's. This is the only way to
// measure the copy without hints, which overlaps whatever runs next; it is
// also more exposed to the machine's drift between rounds. Wall-time
// ratios use the steps that other processes left alone and need 2 in each
// round of the op; CPU-time ratios (_cpu) use every step. The metrics are
// the medians of the ops' ratios; 0 when no op qualified.
func BenchmarkSnapshotOverheadRounds(b *testing.B) {
	cfg := benchConfig(b, 8)
	describe(b, cfg, fmt.Sprintf("steps %d to %d measured", benchWarmup+1, cfg.Steps))
	var wallX, cpuX, waitMs [variants][]float64
	for i := range b.N {
		var wall, cpu [variants][]float64
		var blocked [variants]time.Duration
		for k := range variants {
			v := (i + k) % variants
			runtime.GC()
			c := &stepClock{}
			var err error
			labelled(v, func() { err = trainRound(cfg, v, c) })
			if err != nil {
				b.Fatal(err)
			}
			for _, st := range c.times(0) {
				cpu[v] = append(cpu[v], st.cpu)
				if st.quiet() {
					wall[v] = append(wall[v], st.wall)
				}
			}
			blocked[v] = c.blocked
		}
		line := fmt.Sprintf("op %d: median step wall/CPU ms (quiet steps): off %.1f/%.1f (%d of %d)",
			i, median(wall[snapOff]), median(cpu[snapOff]), len(wall[snapOff]), len(cpu[snapOff]))
		for v := snapOn; v < variants; v++ {
			cpuX[v] = append(cpuX[v], median(cpu[v])/median(cpu[snapOff]))
			waitMs[v] = append(waitMs[v], float64(blocked[v].Microseconds())/1e3/float64(len(cpu[v])))
			wx := "-"
			if len(wall[v]) >= 2 && len(wall[snapOff]) >= 2 {
				wallX[v] = append(wallX[v], median(wall[v])/median(wall[snapOff]))
				wx = fmt.Sprintf("%.4f", wallX[v][len(wallX[v])-1])
			}
			line += fmt.Sprintf(", %s %.1f/%.1f (%d of %d) x%s/x%.4f, waiting %.1f ms/step", variantName[v],
				median(wall[v]), median(cpu[v]), len(wall[v]), len(cpu[v]), wx, cpuX[v][i], waitMs[v][i])
		}
		b.Log(line)
	}
	b.ReportMetric(median(wallX[snapOn]), "x_off")
	b.ReportMetric(median(wallX[snapNoHints]), "x_off_nohints")
	b.ReportMetric(median(cpuX[snapOn]), "x_off_cpu")
	b.ReportMetric(median(cpuX[snapNoHints]), "x_off_nohints_cpu")
	b.ReportMetric(float64(len(wallX[snapOn])), "ops_used")
	b.ReportMetric(float64(3*cfg.SizeBytes)/(1<<20), "state_MiB")
}
