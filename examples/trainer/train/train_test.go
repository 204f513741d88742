package train

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

// small is a quick configuration: 3 layers of width 30 (2790 parameters, not
// a multiple of 4, so ZeRO-1 padding is exercised).
func small() Config {
	c := Defaults()
	c.SizeBytes, c.Layers, c.Steps, c.Batch, c.LR, c.LogEvery, c.Threads = 11400, 3, 8, 16, 1e-2, 2, 1
	return c
}

func runOK(t *testing.T, c Config, n int, opts func(int) Options) *Result {
	t.Helper()
	res, errs := RunLocal(c, n, opts)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	if res[0].Hash == "" {
		t.Fatal("rank 0 returned no hash")
	}
	return res[0]
}

func TestWidthFromSize(t *testing.T) {
	for _, tc := range []struct {
		size   int64
		layers int
		want   int
	}{{11400, 3, 30}, {4 << 20, 4, 511}, {1 << 30, 4, 8191}, {96, 4, 2}} {
		c := Config{SizeBytes: tc.size, Layers: tc.layers}
		if got := c.Width(); got != tc.want {
			t.Errorf("size %d layers %d: width %d, want %d", tc.size, tc.layers, got, tc.want)
		}
		if p := int64(tc.layers) * int64(c.Width()*(c.Width()+1)) * 4; p > tc.size {
			t.Errorf("size %d: %d parameter bytes exceed it", tc.size, p)
		}
	}
}

// TestGradientsFiniteDifference checks backward against central differences
// of the forward pass for every weight, bias and input of a 3-layer MLP.
func TestGradientsFiniteDifference(t *testing.T) {
	const h, n = 5, 3
	layers := make([]*layer, 3)
	for i := range layers {
		l := &layer{global: i, in: h, out: h, linear: i == 2,
			w: make([]float32, h*h), b: make([]float32, h), gw: make([]float32, h*h), gb: make([]float32, h)}
		initLayer(7, l, 1)
		for j := range l.b {
			l.b[j] = 0.1 * float32(j-2)
		}
		layers[i] = l
	}
	x := make([]float32, n*h)
	for s := 0; s < n; s++ {
		sampleInput(7, 1, s, x[s*h:(s+1)*h])
	}
	target := make([]float32, n*h)
	for i := range target {
		target[i] = float32(i%3) - 1
	}
	acts := make([][]float32, 4)
	forward := func() float64 {
		acts[0] = x
		for k, l := range layers {
			acts[k+1] = make([]float32, n*h)
			l.forward(acts[k], acts[k+1], n, 1)
		}
		var loss float64
		for i, y := range acts[3] {
			d := float64(y) - float64(target[i])
			loss += 0.5 * d * d
		}
		return loss
	}
	forward()
	gy := make([]float32, n*h)
	for i := range gy {
		gy[i] = acts[3][i] - target[i]
	}
	var gx []float32
	for k := 2; k >= 0; k-- {
		gx = make([]float32, n*h)
		layers[k].backward(acts[k], acts[k+1], gy, gx, n, 1)
		gy = gx
	}
	check := func(name string, v []float32, i int, analytic float32) {
		const eps = 1e-2
		old := v[i]
		v[i] = old + eps
		up := forward()
		v[i] = old - eps
		down := forward()
		v[i] = old
		num := (up - down) / (2 * eps)
		if diff := math.Abs(num - float64(analytic)); diff > 1e-3+1e-2*math.Abs(num) {
			t.Errorf("%s[%d]: analytic %.6g, finite difference %.6g", name, i, analytic, num)
		}
	}
	for k, l := range layers {
		for i := range l.w {
			check(fmt.Sprintf("layer%d.w", k), l.w, i, l.gw[i])
		}
		for i := range l.b {
			check(fmt.Sprintf("layer%d.b", k), l.b, i, l.gb[i])
		}
	}
	for i := range x {
		check("x", x, i, gx[i])
	}
}

// TestOptimizers runs each optimizer three steps on two parameters against
// values worked out by hand (float64, PyTorch formulas; lr 0.1, momentum 0.9,
// betas 0.9/0.999, eps 1e-8, weight decay 0.01).
func TestOptimizers(t *testing.T) {
	grads := [][]float32{{0.5, -1}, {0.25, 0.5}, {-1, 2}}
	for _, tc := range []struct {
		kind string
		want [][2]float64
	}{
		// p -= lr g
		{SGD, [][2]float64{{0.95, -1.9}, {0.925, -1.95}, {1.025, -2.15}}},
		// b = 0.9 b + g; p -= lr b
		{Momentum, [][2]float64{{0.95, -1.9}, {0.88, -1.86}, {0.917, -2.024}}},
		// step 1 moves each weight by lr against the gradient's sign
		{Adam, [][2]float64{{0.9, -1.9}, {0.806782, -1.873366}, {0.8274177, -1.919099}}},
		// as adam after p *= 1 - lr*wd
		{AdamW, [][2]float64{{0.899, -1.898}, {0.804883, -1.869468}, {0.8247139, -1.913332}}},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			c := Config{Optimizer: tc.kind, LR: 0.1, Momentum: 0.9, WeightDecay: 0.01}
			o := newOptimizer(&c, 2)
			p := []float32{1, -2}
			for step, g := range grads {
				o.prepare(int64(step + 1))
				o.update(p, g, 0, 2)
				for i := range p {
					if d := math.Abs(float64(p[i]) - tc.want[step][i]); d > 2e-6 {
						t.Errorf("step %d p[%d] = %.7g, want %.7g", step+1, i, p[i], tc.want[step][i])
					}
				}
			}
		})
	}
}

func TestFixedPoint(t *testing.T) {
	acc := make([]int64, 5)
	g := []float32{0.5, -0.25, fixLimit * 2, float32(math.NaN()), -fixLimit * 4}
	if got := addFixed(acc, g); got != 3 {
		t.Errorf("clamped %d values, want 3", got)
	}
	out := make([]float32, 5)
	fromFixed(acc, out)
	want := []float32{0.5, -0.25, fixLimit, 0, -fixLimit}
	for i := range want {
		if out[i] != want[i] {
			t.Errorf("value %d: %v, want %v", i, out[i], want[i])
		}
	}
	// The worst case sum stays in range.
	if float64(maxMicrobatches)*fixLimit*fixScale >= math.MaxInt64 {
		t.Error("maxMicrobatches clamped values can overflow int64")
	}
}

// TestDeterministicAcrossLayouts: the same global batch and microbatch size
// give bit-identical parameters and losses for every dp, pp and zero1 choice
// and thread count, because per-microbatch gradients are summed in integers.
func TestDeterministicAcrossLayouts(t *testing.T) {
	base := small()
	base.Micro = 4
	ref := runOK(t, base, 1, nil)
	again := runOK(t, base, 1, nil)
	if again.Hash != ref.Hash || fmt.Sprint(again.Losses) != fmt.Sprint(ref.Losses) {
		t.Fatalf("two identical runs differ: %s %v vs %s %v", ref.Hash, ref.Losses, again.Hash, again.Losses)
	}
	for _, tc := range []struct {
		dp, pp  int
		zero1   bool
		threads int
	}{
		{2, 1, false, 1}, {4, 1, false, 1}, {1, 2, false, 1}, {1, 3, false, 1},
		{2, 2, false, 1}, {4, 1, true, 1}, {2, 3, true, 1}, {1, 1, false, 3},
	} {
		t.Run(fmt.Sprintf("dp%d-pp%d-zero1=%v-threads%d", tc.dp, tc.pp, tc.zero1, tc.threads), func(t *testing.T) {
			c := base
			c.DP, c.PP, c.Zero1, c.Threads = tc.dp, tc.pp, tc.zero1, tc.threads
			got := runOK(t, c, tc.dp*tc.pp, nil)
			if got.Hash != ref.Hash {
				t.Errorf("hash %s, want %s (dp1 pp1)", got.Hash, ref.Hash)
			}
			if fmt.Sprint(got.Losses) != fmt.Sprint(ref.Losses) {
				t.Errorf("losses %v, want %v", got.Losses, ref.Losses)
			}
		})
	}
}

// TestThreadsAboveThreshold: goroutine splitting of large layers does not
// change a bit.
func TestThreadsAboveThreshold(t *testing.T) {
	c := Defaults()
	c.SizeBytes, c.Steps, c.Batch, c.Threads = 264192, 2, 8, 1 // width 128
	one := runOK(t, c, 1, nil)
	c.Threads = 3
	if three := runOK(t, c, 1, nil); three.Hash != one.Hash {
		t.Errorf("threads 3: %s, threads 1: %s", three.Hash, one.Hash)
	}
}

// TestZero1MatchesReplicated for every optimizer.
func TestZero1MatchesReplicated(t *testing.T) {
	for _, opt := range []string{SGD, Momentum, Adam, AdamW} {
		t.Run(opt, func(t *testing.T) {
			c := small()
			c.Optimizer, c.DP = opt, 4
			plain := runOK(t, c, 4, nil)
			c.Zero1 = true
			if z := runOK(t, c, 4, nil); z.Hash != plain.Hash {
				t.Errorf("zero1 %s, replicated %s", z.Hash, plain.Hash)
			}
		})
	}
}

func TestLearns(t *testing.T) {
	c := small()
	c.Steps, c.LogEvery = 30, 30
	c.Optimizer = Adam
	r := runOK(t, c, 1, nil)
	c.Steps = 1
	r1 := runOK(t, c, 1, nil)
	if !(r.Losses[0].Loss < r1.Losses[0].Loss) {
		t.Errorf("loss after 30 steps %v not below loss after 1 step %v", r.Losses[0].Loss, r1.Losses[0].Loss)
	}
}

// TestCrashResume: a run killed by --fail-at and relaunched against the same
// snapshot store ends bit-identical to an uninterrupted run, for every
// optimizer, with and without ZeRO-1, with and without pipeline stages.
func TestCrashResume(t *testing.T) {
	for _, opt := range []string{SGD, Momentum, Adam, AdamW} {
		for _, lay := range []struct {
			dp, pp int
			zero1  bool
		}{{2, 1, false}, {2, 1, true}, {2, 2, true}} {
			t.Run(fmt.Sprintf("%s-dp%d-pp%d-zero1=%v", opt, lay.dp, lay.pp, lay.zero1), func(t *testing.T) {
				c := small()
				c.Optimizer, c.DP, c.PP, c.Zero1, c.LogEvery = opt, lay.dp, lay.pp, lay.zero1, 1
				n := lay.dp * lay.pp
				want := runOK(t, c, n, nil)

				c.SaveEvery, c.FailStep, c.FailRank = 3, 8, n-1
				store := NewMemStore(n)
				snaps := make([]Snapshotter, n)
				for r := range snaps {
					snaps[r] = store.Rank(r)
				}
				_, errs := RunLocal(c, n, func(r int) Options { return Options{Snap: snaps[r]} })
				if !errors.Is(errs[n-1], ErrKilled) {
					t.Fatalf("rank %d: %v, want ErrKilled", n-1, errs[n-1])
				}
				for r := range snaps {
					if err := snaps[r].Close(); err != nil {
						t.Fatal(err)
					}
				}
				if g := store.Generations(); fmt.Sprint(g) != "[3 6]" {
					t.Fatalf("generations %v, want [3 6]", g)
				}
				// The relaunch keeps --fail-at; it must not fire after a restore.
				got := runOK(t, c, n, func(r int) Options { return Options{Snap: store.Rank(r)} })
				if got.ResumedFrom != 6 {
					t.Errorf("resumed from %d, want 6", got.ResumedFrom)
				}
				if got.Hash != want.Hash {
					t.Errorf("resumed hash %s, uninterrupted %s", got.Hash, want.Hash)
				}
				if fmt.Sprint(got.Losses) != fmt.Sprint(want.Losses[6:]) {
					t.Errorf("resumed losses %v, want %v", got.Losses, want.Losses[6:])
				}
			})
		}
	}
}

// phaseSnap records the communication phases a trainer reports.
type phaseSnap struct {
	Snapshotter
	phases []string
}

func (p *phaseSnap) CommPhase(active bool, op string) {
	p.phases = append(p.phases, fmt.Sprintf("%v %s", active, op))
}

// TestCommPhases: every step's gradient all-reduce, and under ZeRO-1 its
// parameter all-gather, is bracketed by a communication phase, on every
// rank, and nothing else is.
func TestCommPhases(t *testing.T) {
	for _, zero1 := range []bool{false, true} {
		c := small()
		c.DP, c.SaveEvery, c.Zero1 = 2, 1, zero1
		store := NewMemStore(2)
		snaps := []*phaseSnap{{Snapshotter: store.Rank(0)}, {Snapshotter: store.Rank(1)}}
		runOK(t, c, 2, func(r int) Options { return Options{Snap: snaps[r]} })
		want := make([]string, 0, 4*c.Steps)
		for range c.Steps {
			want = append(want, "true gradient all-reduce", "false ")
			if zero1 {
				want = append(want, "true parameter all-gather", "false ")
			}
		}
		for r, s := range snaps {
			if fmt.Sprint(s.phases) != fmt.Sprint(want) {
				t.Errorf("zero1 %v: rank %d reported phases %v, want %v", zero1, r, s.phases, want)
			}
		}
	}
}

// TestCrashResumeJIT: with a snapshot every 5 steps and a rank lost at
// the start of step 13, the ranks' JIT flush (after the failure, of the
// step each declared consistent) saves step 12, and the relaunch resumes
// there, not at 10, with the uninterrupted run's bits.
func TestCrashResumeJIT(t *testing.T) {
	for _, lay := range []struct {
		dp, pp int
		zero1  bool
	}{{2, 1, false}, {2, 1, true}, {2, 2, false}} {
		t.Run(fmt.Sprintf("dp%d-pp%d-zero1=%v", lay.dp, lay.pp, lay.zero1), func(t *testing.T) {
			c := small()
			c.Optimizer, c.DP, c.PP, c.Zero1, c.LogEvery, c.Steps = AdamW, lay.dp, lay.pp, lay.zero1, 1, 16
			n := lay.dp * lay.pp
			want := runOK(t, c, n, nil)

			c.SaveEvery, c.FailStep, c.FailRank = 5, 13, n-1
			store := NewMemStore(n)
			snaps := make([]Snapshotter, n)
			for r := range snaps {
				snaps[r] = store.Rank(r)
			}
			_, errs := RunLocal(c, n, func(r int) Options { return Options{Snap: snaps[r]} })
			if !errors.Is(errs[n-1], ErrKilled) {
				t.Fatalf("rank %d: %v, want ErrKilled", n-1, errs[n-1])
			}
			for r, s := range snaps {
				step, ok, err := s.(*memSnap).Flush()
				if err != nil || !ok || step != 12 {
					t.Fatalf("rank %d: JIT flush = step %d, %v, %v; want step 12", r, step, ok, err)
				}
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
			}
			if g := store.Generations(); fmt.Sprint(g) != "[5 10 12]" {
				t.Fatalf("generations %v, want [5 10 12]", g)
			}
			got := runOK(t, c, n, func(r int) Options { return Options{Snap: store.Rank(r)} })
			if got.ResumedFrom != 12 {
				t.Errorf("resumed from %d, want 12", got.ResumedFrom)
			}
			if got.Hash != want.Hash {
				t.Errorf("resumed hash %s, uninterrupted %s", got.Hash, want.Hash)
			}
		})
	}
}

func TestRestoreRejectsOtherFlags(t *testing.T) {
	c := small()
	c.SaveEvery, c.Steps = 2, 2
	store := NewMemStore(1)
	s := store.Rank(0)
	runOK(t, c, 1, func(int) Options { return Options{Snap: s} })
	s.Close()
	c.LR *= 2
	_, errs := RunLocal(c, 1, func(int) Options { return Options{Snap: store.Rank(0)} })
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "different model/optimizer/layout flags") {
		t.Errorf("restore under another --lr: %v", errs[0])
	}
}

func TestMemStoreRules(t *testing.T) {
	s := NewMemStore(2).Rank(0)
	buf := make([]byte, 4)
	if err := s.Register("a", buf, true); err != nil {
		t.Fatal(err)
	}
	if err := s.Register("a", buf, true); err == nil {
		t.Error("duplicate name accepted")
	}
	w, err := s.Save(1)
	if err != nil {
		t.Fatal(err)
	}
	w.Wait()
	if err := s.Register("b", buf, true); err == nil {
		t.Error("register after save accepted")
	}
	// Only rank 0 of 2 saved: nothing is restorable for the job.
	if _, ok, err := s.Restore(); ok || err != nil {
		t.Errorf("restore with one rank's generation: ok %v err %v", ok, err)
	}
}

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		bad  bool
	}{
		{"4MiB", 4 << 20, false}, {"256MiB", 256 << 20, false}, {"1GiB", 1 << 30, false},
		{"1.5GiB", 3 << 29, false}, {"500MB", 500e6, false}, {"64k", 64 << 10, false}, {"4096", 4096, false},
		{"", 0, true}, {"MiB", 0, true}, {"-1MiB", 0, true}, {"4XB", 0, true}, {"2TiB", 0, true},
	} {
		got, err := ParseSize(tc.in)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d, bad=%v", tc.in, got, err, tc.want, tc.bad)
		}
	}
}

func TestParseArgs(t *testing.T) {
	c, err := ParseArgs(strings.Fields("--steps 5 --size 1MiB --optimizer adamw --lr 0.01 --seed 9 --batch 8 --dp 2 --pp 2 --zero1 --save-every 2 --hints=false --jit=false --min-step 20ms --compute 7ms --comm-wait 200us --fail-at 3:1 --slow-at 4:1s --slow-rank 1:5ms --log-every 1 --log-messages bubble --log-cap 64MiB"), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Steps: 5, SizeBytes: 1 << 20, Layers: 4, Optimizer: AdamW, LR: 0.01, WeightDecay: 0.01, Momentum: 0.9,
		Seed: 9, Batch: 8, DP: 2, PP: 2, Zero1: true, SaveEvery: 2, FailStep: 3, FailRank: 1, LogEvery: 1, MinStep: 20 * time.Millisecond, Compute: 7 * time.Millisecond, CommWait: 200 * time.Microsecond,
		SlowAt: 4, SlowStep: time.Second, SlowRank: 1, SlowRankBy: 5 * time.Millisecond, LogMessages: LogBubble, LogCap: 64 << 20}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("got %+v\nwant %+v", c, want)
	}
}

// TestBadFlags: each mistake gets an error that names the flag or the fix.
func TestBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args  string
		world int
		want  string
	}{
		{"--optimizer rmsprop", 1, "use sgd, momentum, adam or adamw"},
		{"--size lots", 1, "--size"},
		{"--size 64", 1, "too small"},
		{"--steps 0", 1, "--steps"},
		{"--lr -1", 1, "--lr"},
		{"--lr NaN", 1, "--lr"},
		{"--fail-at 5", 1, "STEP:RANK"},
		{"--fail-at x:1", 1, "STEP:RANK"},
		{"--fail-at 5:4", 4, "rank 4 does not exist"},
		{"--pp 5", 5, "exceeds --layers"},
		{"--dp 3", 4, "launch 3 ranks or change --dp/--pp"},
		{"--pp 3", 4, "not a multiple of --pp"},
		{"--batch 30", 4, "not divisible by --dp"},
		{"--batch 32 --micro 5", 1, "not a multiple of --micro"},
		{"--batch 4096 --micro 1", 1, "raise --micro"},
		{"--bogus", 1, "flag provided but not defined"},
		{"extra", 1, "unexpected argument"},
		{"--log-every 0", 1, "--log-every"},
		{"--min-step -1s", 1, "--min-step"},
		{"--compute -1s", 1, "--compute"},
		{"--comm-wait -1us", 1, "--comm-wait"},
		{"--comm-wait 2s", 1, "between 0 (MPI's blocking calls) and 1s"},
		{"--slow-at 4", 1, "STEP:DURATION"},
		{"--slow-at 0:1s", 1, "STEP:DURATION"},
		{"--slow-at 3:-1s", 1, "STEP:DURATION"},
		{"--slow-at 3:soon", 1, "STEP:DURATION"},
		{"--slow-rank 2", 1, "RANK:DURATION"},
		{"--slow-rank 1:0s", 2, "RANK:DURATION"},
		{"--slow-rank 4:1ms", 4, "rank 4 does not exist"},
		{"--hold-in-update 5", 1, "STEP:TENSOR"},
		{"--hold-in-update 0:1 --undo", 1, "STEP:TENSOR"},
		{"--hold-in-update 5:-1 --undo", 1, "STEP:TENSOR"},
		{"--hold-in-update 5:1", 1, "needs --undo and --jit"},
		{"--hold-in-update 5:1 --undo --jit=false", 1, "needs --undo and --jit"},
		{"--hold-before-update 5", 2, "STEP:RANK[,RANK...]"},
		{"--hold-before-update 0:1 --undo", 2, "STEP:RANK[,RANK...]"},
		{"--hold-before-update 5:1,x --undo", 2, "STEP:RANK[,RANK...]"},
		{"--hold-before-update 5:1", 2, "needs --undo and --jit"},
		{"--hold-before-update 5:2 --undo", 2, "the job has ranks 0..1, and at least one must finish the step"},
		{"--hold-before-update 5:0,1 --undo", 2, "at least one must finish the step"},
		{"--hold-before-update 5:1 --undo --zero1", 2, "--hold-before-update with --zero1"},
		{"--log-messages always --pp 2", 2, "use off, sync or bubble"},
		{"--log-messages sync", 1, "needs --pp >= 2"},
		{"--log-messages bubble --pp 2 --save-every 0", 2, "needs --save-every >= 1"},
		{"--log-messages sync --pp 2 --log-cap 0", 2, "--log-cap"},
		{"--log-messages sync --pp 2", 4, "--dp 2: every pipeline stage has 2 data-parallel replicas"},
		{"--log-groups 0,1 --pp 2", 2, "--log-groups needs --log-messages"},
		{"--measure-from -1", 1, "--measure-from -1: must be 0 (off) or a step"},
		{"--steps 10 --measure-from 11", 1, "must be 0 (off) or a step in 1..10"},
		{"--log-messages sync --pp 3 --log-groups 0,1", 3, "the groups end at stage 1, but --pp 3 has stages 0..2"},
		{"--log-messages sync --pp 2 --log-groups 0-1", 2, "one group logs nothing"},
		{"--log-messages sync --pp 2 --log-groups 0,2", 2, "starts at stage 2, want 1"},
	} {
		t.Run(tc.args, func(t *testing.T) {
			c, err := ParseArgs(strings.Fields(tc.args), nil)
			if err == nil {
				err = c.Validate(tc.world)
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestMeasureFrom: --measure-from N prints the mean step time over steps
// N.. (the steady state) beside the whole run's, and leaves it unset
// without the flag.
func TestMeasureFrom(t *testing.T) {
	for _, from := range []int64{0, 4} {
		cfg := small()
		cfg.Steps, cfg.MeasureFrom = 6, from
		var log bytes.Buffer
		res, errs := RunLocal(cfg, 1, func(int) Options { return Options{Log: &log} })
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		line := regexp.MustCompile(`(?m)^mean-step-ms-from-4: \S+ \(3 steps\)$`).MatchString(log.String())
		if got := res[0].SteadyMs > 0; got != (from > 0) || line != (from > 0) {
			t.Errorf("--measure-from %d: SteadyMs %v, line %v\n%s", from, res[0].SteadyMs, line, log.String())
		}
	}
}
