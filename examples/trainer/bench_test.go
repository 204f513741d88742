package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
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
func benchConfig(b *testing.B) train.Config {
	c := train.Defaults()
	c.SizeBytes, c.Steps, c.SaveEvery, c.LogEvery = 96<<20, 8, 1, 1
	if s := os.Getenv("REFT_BENCH_TRAIN_SIZE"); s != "" {
		n, err := train.ParseSize(s)
		if err != nil {
			b.Fatalf("REFT_BENCH_TRAIN_SIZE: %v", err)
		}
		c.SizeBytes = n
	}
	if s := os.Getenv("REFT_BENCH_TRAIN_STEPS"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= benchWarmup {
			b.Fatalf("REFT_BENCH_TRAIN_STEPS=%q: want more than %d steps", s, benchWarmup)
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

// stepClock is the trainer's log: rank 0 writes one "step N loss X" line at
// the end of every step (LogEvery 1), and the clock notes at each the wall
// time, this process's CPU time (every thread: trainer, copier and the
// in-process agent) and the whole machine's busy time, so that steps during
// which other processes ran can be told apart.
type stepClock struct {
	wall      []time.Time
	cpu, busy []time.Duration
	blocked   time.Duration // in Wait for saves during the measured steps
}

func (c *stepClock) Write(p []byte) (int, error) {
	if !bytes.HasPrefix(p, []byte("step ")) {
		return len(p), nil
	}
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	busy, err := machineBusy()
	if err != nil {
		return 0, err
	}
	c.wall = append(c.wall, time.Now())
	c.cpu = append(c.cpu, time.Duration(ru.Utime.Nano()+ru.Stime.Nano()))
	c.busy = append(c.busy, busy)
	return len(p), nil
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

// stepTimes are one step's wall and CPU milliseconds, and the CPU
// milliseconds other processes used meanwhile.
type stepTimes struct{ wall, cpu, others float64 }

// quiet reports whether other processes left the step alone: they used
// under 5 % of the machine's cores for its duration.
func (s stepTimes) quiet() bool { return s.others < 0.05*s.wall*float64(runtime.NumCPU()) }

// steps returns every step after the warm-up, each from the end of the one
// before, so nothing between steps goes unmeasured.
func (c *stepClock) steps() []stepTimes {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
	var out []stepTimes
	for i := benchWarmup; i < len(c.wall); i++ {
		cpu := c.cpu[i] - c.cpu[i-1]
		out = append(out, stepTimes{wall: ms(c.wall[i].Sub(c.wall[i-1])), cpu: ms(cpu), others: ms(c.busy[i] - c.busy[i-1] - cpu)})
	}
	return out
}

// Variants of a round: no snapshots, and Save every step with and without
// the trainer's idle-window hints.
const (
	snapOff = iota
	snapOn
	snapNoHints
	variants
)

var variantName = [variants]string{"off", "on", "on-nohints"}

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

// trainRound trains cfg once, with a reft client on a fresh in-process
// agent unless v is snapOff, and returns the clock of its steps.
func trainRound(b *testing.B, cfg train.Config, v int) *stepClock {
	b.Helper()
	runtime.GC() // the previous round's garbage is not this round's cost
	clock := &stepClock{}
	o := train.Options{Comm: soloComm{}, Log: clock}
	var s *reftSnap
	if v != snapOff {
		a, err := agenttest.Start(agenttest.Options{})
		if err != nil {
			b.Fatal(err)
		}
		defer a.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if s, err = openReft(ctx, client.Options{Socket: a.Socket, World: 1}); err != nil {
			b.Fatal(err)
		}
		defer s.Close()
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
		b.Fatal(err)
	}
	if len(clock.wall) != int(cfg.Steps) {
		b.Fatalf("%d step lines for %d steps", len(clock.wall), cfg.Steps)
	}
	if s != nil {
		// Every step was saved: the agent lists the last one as committed.
		gens, err := s.c.Generations(context.Background())
		if err != nil || len(gens) == 0 || gens[0] != cfg.Steps {
			b.Fatalf("after %d steps the agent holds generations %v (%v)", cfg.Steps, gens, err)
		}
	}
	return clock
}

func median(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	n := len(v)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

// BenchmarkSnapshotOverhead is the per-iteration cost of snapshotting the
// whole training state every step (issue 5, target <= 1.03 x_off): the
// reference trainer's step with Save(step) every step into a real agent
// and store over the socket, against the same trainer without snapshots.
// Every op is one round of each variant (off, on, on without hints), in an
// order that rotates from op to op, and gives one ratio per variant: its
// median step over the off round's. Wall-time ratios (x_off,
// x_off_nohints) use only the steps that other processes left alone
// (quiet_steps is their share) and need 2 in each round of the op;
// CPU-time ratios (_cpu) use every step. The metrics are the medians of the
// ops' ratios; 0 when no op qualified. See docs/BENCHMARKS.md.
func BenchmarkSnapshotOverhead(b *testing.B) {
	cfg := benchConfig(b)
	state := 3 * cfg.SizeBytes // parameters, Adam's m and v; the step counter aside
	b.Logf("state %d MiB per rank, %d layers of width %d, batch %d, GOMAXPROCS %d, %d steps per round (%d measured)",
		state>>20, cfg.Layers, cfg.Width(), cfg.Batch, runtime.GOMAXPROCS(0), cfg.Steps, cfg.Steps-benchWarmup)
	var wallX, cpuX, waitMs, stepMs [variants][]float64
	quiet, total := 0, 0
	for i := range b.N {
		var wall, cpu [variants][]float64
		var blocked [variants]time.Duration
		for k := range variants {
			v := (i + k) % variants
			// Labelled, so that a -cpuprofile splits by variant (pprof
			// -tagfocus 'snapshots=^on$'): goroutines inherit labels, the
			// in-process agent's and the copier's included.
			pprof.Do(context.Background(), pprof.Labels("snapshots", variantName[v]), func(context.Context) {
				c := trainRound(b, cfg, v)
				for _, st := range c.steps() {
					cpu[v] = append(cpu[v], st.cpu)
					if st.quiet() {
						wall[v] = append(wall[v], st.wall)
					}
				}
				blocked[v] = c.blocked
			})
			quiet, total = quiet+len(wall[v]), total+len(cpu[v])
			stepMs[v] = append(stepMs[v], wall[v]...)
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
	for v := snapOn; v < variants; v++ {
		if len(wallX[v]) == 0 {
			b.Logf("%s: the machine was too busy in every op for a wall-time ratio", variantName[v])
		}
	}
	b.ReportMetric(median(wallX[snapOn]), "x_off")
	b.ReportMetric(median(wallX[snapNoHints]), "x_off_nohints")
	b.ReportMetric(median(cpuX[snapOn]), "x_off_cpu")
	b.ReportMetric(median(cpuX[snapNoHints]), "x_off_nohints_cpu")
	b.ReportMetric(float64(len(wallX[snapOn])), "ops_used")
	b.ReportMetric(median(stepMs[snapOff]), "off_ms/step")
	b.ReportMetric(median(waitMs[snapOn]), "on_wait_ms/step")
	b.ReportMetric(float64(quiet)/float64(max(total, 1)), "quiet_steps")
	b.ReportMetric(float64(state)/(1<<20), "state_MiB")
}
