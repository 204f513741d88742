// Package train is the reference trainer behind reft-train: an MLP on
// deterministic synthetic data, trained data parallel (optionally pipeline
// parallel and with ZeRO-1 sharded optimizer state), bit-for-bit
// reproducible. It talks to other ranks only through Comm, so it needs no
// MPI: cmd reft-train supplies an MPI Comm, the tests an in-process one.
package train

import (
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Optimizer names accepted by --optimizer.
const (
	SGD      = "sgd"
	Momentum = "momentum"
	Adam     = "adam"
	AdamW    = "adamw"
)

// maxMicrobatches bounds the number of microbatches summed per step; the
// fixed-point gradient scale is chosen so that this many clamped values cannot
// overflow an int64 (see fixed.go).
const maxMicrobatches = 1 << 10

// Config is everything that decides what the trainer computes.
type Config struct {
	Steps       int64   // optimizer steps, numbered 1..Steps
	SizeBytes   int64   // target parameter bytes; layers are shaped from it
	Layers      int     // MLP layers (all width x width)
	Optimizer   string  // sgd, momentum, adam, adamw
	LR          float64 // learning rate
	WeightDecay float64 // adamw only
	Momentum    float64 // momentum only
	Seed        uint64
	Batch       int   // global batch, samples per step
	Micro       int   // samples per microbatch; 0: Batch/DP
	DP, PP      int   // DP 0: world size / PP
	Zero1       bool  // shard optimizer state across the DP group
	SaveEvery   int64 // snapshot every N steps; 0: never
	// Hints announces the single-threaded gradient accumulation to the
	// snapshotter as an idle window (Hinter), so the copy runs there.
	Hints bool
	// JIT makes the snapshotter save the newest consistent step at once
	// when the agent reports a failed node or the step is killed
	// (SIGTERM), so a failure loses at most the step in progress whatever
	// SaveEvery is.
	JIT bool
	// Undo records what undoing each optimizer update needs (undo.go), so
	// that an update interrupted part way (some tensors at step t, some at
	// t-1) is returned to step t-1 and the JIT flush saves a consistent
	// state. It changes no result.
	Undo bool
	// FailUpdate (--fail-in-update STEP:RANK:TENSOR) makes that rank's
	// update of STEP fail before its tensor TENSOR, the ones before it
	// applied (only in a run that did not resume; needs Undo): a failure
	// injected inside the optimizer step.
	FailUpdateStep   int64
	FailUpdateRank   int
	FailUpdateTensor int
	// HoldUpdate (--hold-in-update STEP:TENSOR) makes every rank stop in
	// its update of STEP before its tensor TENSOR (only in a run that did
	// not resume; needs Undo and JIT) until a JIT flush interrupts the
	// update (HoldMax at most): an update that a failure keeps from ending,
	// e.g. a collective inside it, held open while a test kills a node.
	HoldUpdateStep   int64
	HoldUpdateTensor int
	// HoldBefore (--hold-before-update STEP:RANK[,RANK...]) makes those ranks stop
	// after the gradient all-reduce of STEP, before its update (only in a
	// run that did not resume; needs Undo and JIT, and no ZeRO-1)
	// until a JIT flush has stepped back (HoldMax at most), then stay
	// blocked until the job is torn down: a rank still blocked in the
	// all-reduce that the others finished (or, in a pipeline, a stage
	// still inside the step its neighbours finished), so that the
	// survivors' flushes straddle a step boundary (the others say
	// "hold-before-update: rank R finished step STEP").
	HoldBeforeStep  int64
	HoldBeforeRanks []int
	FailStep        int64 // --fail-at STEP:RANK; 0: off
	FailRank        int
	LogEvery        int64
	// MeasureFrom (--measure-from) makes rank 0 also print the mean step
	// time over steps >= MeasureFrom ("mean-step-ms-from-N"): the steady
	// state, after what the first steps learn (the agents' idle-span
	// profile). 0: not printed.
	MeasureFrom int64
	Threads     int // compute goroutines per rank; 0: GOMAXPROCS
	// MinStep pads every step to at least this wall time by sleeping at
	// its end: a stand-in for a bigger model, so that a demo or a failure
	// test can hit a chosen step. It changes no result.
	MinStep time.Duration
	// Compute makes every rank's every step compute Compute longer
	// (sleeping) before its gradient all-reduce: a stand-in for a GPU's
	// forward and backward passes, which leave the network idle, so that
	// a benchmark can give the step idle spans of a chosen length. Unlike
	// MinStep it adds to the step, so a slower all-reduce shows in the
	// step time. It changes no result.
	Compute time.Duration
	// CommWait (--comm-wait), when positive, makes MPI's collectives
	// nonblocking ones that the rank tests every CommWait and sleeps
	// between: the wait then leaves the CPU to others, as a GPU job's
	// host CPU is left while its collective runs on the device. 0: MPI's
	// blocking collectives, whose wait polls a core (Open MPI's TCP
	// progress); on a node with fewer cores than ranks and agents that
	// makes the CPU, not the network, what every process competes for.
	// It changes no result.
	CommWait time.Duration
	// SlowStep makes step SlowAt take SlowStep longer on every rank (after
	// the MinStep padding): a deliberately slow step, which hang
	// detection must not call a hang. It changes no result.
	SlowAt   int64
	SlowStep time.Duration
	// SlowRankBy makes rank SlowRank's every step compute SlowRankBy
	// longer before its gradient all-reduce: a straggler, which the
	// other ranks wait for in the all-reduce. It changes no result.
	SlowRank   int
	SlowRankBy time.Duration
	// CkptDir, when set, makes reft-train checkpoint to files there every
	// SaveEvery steps instead of snapshotting with reft (FileCheckpoint:
	// the status quo of the goodput benchmark).
	CkptDir string
	// LogMessages (--log-messages) makes every pipeline stage log the
	// activations and gradients it sends (LogSync or LogBubble; LogOff:
	// none), so that a stage lost with its node replays from its older
	// snapshot to the survivors' step (replay.go, docs/LOGGING.md). It
	// changes no result.
	LogMessages string
	// LogCap bounds the in-process message log's bytes (--log-cap).
	LogCap int64
	// LogGroups (--log-groups, SWIFT's selective logging, section 5.3;
	// `reft plan logging` chooses them) cuts the stages into groups of
	// consecutive stages, each [first, last]: only messages between
	// groups are logged, and a stage lost with its node replays with its
	// whole group. nil: every stage its own group (every boundary logged).
	LogGroups [][2]int
}

// Message logging modes (--log-messages).
const (
	LogOff = ""
	// LogSync appends each message to the log right after its send, on
	// the training goroutine.
	LogSync = "sync"
	// LogBubble hands each sent message to a background goroutine at the
	// rank's next wait for a message (a pipeline bubble), and waits for
	// the copy only before the send buffer is written again.
	LogBubble = "bubble"
)

// Defaults returns the configuration that ParseArgs starts from.
func Defaults() Config {
	return Config{
		Steps: 100, SizeBytes: 4 << 20, Layers: 4, Optimizer: Adam, LR: 1e-3,
		WeightDecay: 0.01, Momentum: 0.9, Seed: 1, Batch: 32, PP: 1, LogEvery: 10,
		SaveEvery: 1, // a failure then costs at most one step of work
		Hints:     true,
		JIT:       true,
		LogCap:    DefaultLogCap,
	}
}

// ParseArgs parses reft-train's command line. It returns flag.ErrHelp for
// -h/--help, after writing the usage to usage (which may be nil).
func ParseArgs(args []string, usage io.Writer) (Config, error) {
	c := Defaults()
	fs := flag.NewFlagSet("reft-train", flag.ContinueOnError)
	if usage == nil {
		usage = io.Discard
	}
	fs.SetOutput(usage)
	size := fs.String("size", "4MiB", "parameter bytes (e.g. 4MiB, 256MiB, 1GiB); layer width is derived from it")
	failUpd := fs.String("fail-in-update", "", "STEP:RANK:TENSOR: that rank's optimizer update of STEP fails before its tensor TENSOR "+
		"(0-based; the tensors before it applied), only in a run that did not resume; needs --undo, which undoes them")
	hold := fs.String("hold-in-update", "", "STEP:TENSOR: every rank stops in its optimizer update of STEP before its tensor TENSOR "+
		"until a JIT flush interrupts it (a failure inside the update, for tests), only in a run that did not resume; needs --undo and --jit")
	holdBefore := fs.String("hold-before-update", "", "STEP:RANK[,RANK...]: those ranks stop after the gradient all-reduce of STEP, before its update, "+
		"until a JIT flush steps back, and stay blocked until the job ends (survivors on either side of a step boundary, for tests), only in a run that did not resume; needs --undo and --jit")
	logMsgs := fs.String("log-messages", "off", "off, sync or bubble: every pipeline stage logs the activations and gradients it sends "+
		"(needs --pp >= 2 and --dp 1), so that a lost stage replays from its snapshot while the others keep their step (docs/LOGGING.md); "+
		"sync appends after each send, bubble while the rank waits for a message")
	logCap := fs.String("log-cap", "1GiB", "bound on the bytes of this rank's in-process message log (--log-messages)")
	logGroups := fs.String("log-groups", "", "GROUPS, e.g. 0,1-2,3: under --log-messages log only the messages between these groups of consecutive stages "+
		"(SWIFT's selective logging; `reft plan logging` prints them); a lost stage replays with its whole group. Default: every stage its own group")
	fail := fs.String("fail-at", "", "STEP:RANK: that rank SIGKILLs itself at the start of STEP (only in a run that did not resume)")
	slow := fs.String("slow-at", "", "STEP:DURATION: every rank sleeps DURATION more at the end of STEP (a slow step; e.g. 12:2s)")
	straggle := fs.String("slow-rank", "", "RANK:DURATION: that rank computes DURATION longer in every step, before the all-reduce (a straggler; e.g. 2:100ms)")
	seed := fs.Uint64("seed", c.Seed, "seed for data, teacher and initial weights")
	fs.Int64Var(&c.Steps, "steps", c.Steps, "optimizer steps")
	fs.IntVar(&c.Layers, "layers", c.Layers, "MLP layers (>= --pp)")
	fs.StringVar(&c.Optimizer, "optimizer", c.Optimizer, "sgd, momentum, adam or adamw")
	fs.Float64Var(&c.LR, "lr", c.LR, "learning rate")
	fs.Float64Var(&c.WeightDecay, "weight-decay", c.WeightDecay, "decoupled weight decay (adamw)")
	fs.Float64Var(&c.Momentum, "momentum", c.Momentum, "momentum factor (momentum)")
	fs.IntVar(&c.Batch, "batch", c.Batch, "global batch size in samples per step")
	fs.IntVar(&c.Micro, "micro", c.Micro, "samples per microbatch (0: batch/dp); fix it to make results independent of --dp")
	fs.IntVar(&c.DP, "dp", c.DP, "data-parallel degree (0: world size / pp)")
	fs.IntVar(&c.PP, "pp", c.PP, "pipeline stages")
	fs.BoolVar(&c.Zero1, "zero1", c.Zero1, "shard optimizer state across the DP group (ZeRO-1)")
	fs.Int64Var(&c.SaveEvery, "save-every", c.SaveEvery, "snapshot every N steps when reft is enabled (0: never)")
	fs.BoolVar(&c.Hints, "hints", c.Hints, "let reft copy a snapshot while this rank's gradient accumulation leaves cores idle, "+
		"rather than as soon as it is taken (--hints=false); the copy of step N then finishes during step N+1")
	fs.BoolVar(&c.JIT, "jit", c.JIT, "when reft reports a failed node, or the step is killed (SIGTERM), save the newest consistent step at once "+
		"(JIT flush), so at most the step in progress is lost whatever --save-every is")
	fs.BoolVar(&c.Undo, "undo", c.Undo, "record what undoing each optimizer update needs, so that an update interrupted by a failure "+
		"is undone and the JIT flush saves the previous step (with --save-every 0: no snapshot on the step path)")
	fs.Int64Var(&c.LogEvery, "log-every", c.LogEvery, "log the loss every N steps")
	fs.Int64Var(&c.MeasureFrom, "measure-from", 0, "also print the mean step time over steps >= N (mean-step-ms-from-N: the steady state after the first steps); 0: not")
	fs.DurationVar(&c.MinStep, "min-step", c.MinStep, "pad every step to at least this wall time by sleeping (e.g. 500ms): "+
		"a stand-in for a bigger model in demos and failure tests; results are unchanged")
	fs.DurationVar(&c.Compute, "compute", c.Compute, "every rank computes this much longer in every step, before the all-reduce, by sleeping (e.g. 200ms): "+
		"a stand-in for a GPU's forward and backward passes, which leave the network idle; it adds to the step time; results are unchanged")
	fs.StringVar(&c.CkptDir, "ckpt-dir", c.CkptDir, "checkpoint to per-rank files in this directory, shared by every node, every --save-every steps "+
		"(synchronous, fsynced; resume from the newest complete one), instead of reft's snapshots: what jobs do without reft")
	fs.DurationVar(&c.CommWait, "comm-wait", c.CommWait, "test MPI's collectives every DURATION and sleep between the tests, instead of "+
		"waiting in MPI's blocking calls, which poll a core (e.g. 200us; a GPU host's CPU while its collective runs on the device); 0: blocking calls")
	fs.IntVar(&c.Threads, "threads", c.Threads, "compute goroutines per rank (0: GOMAXPROCS)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return c, err
		}
		return c, fmt.Errorf("%w (see --help)", err)
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q: all options are flags (see --help)", fs.Arg(0))
	}
	c.Seed = *seed
	n, err := ParseSize(*size)
	if err != nil {
		return c, fmt.Errorf("--size: %w", err)
	}
	c.SizeBytes = n
	switch *logMsgs {
	case "off":
		c.LogMessages = LogOff
	case LogSync, LogBubble:
		c.LogMessages = *logMsgs
	default:
		return c, fmt.Errorf("--log-messages %q: use off, sync or bubble", *logMsgs)
	}
	if c.LogCap, err = ParseSize(*logCap); err != nil {
		return c, fmt.Errorf("--log-cap: %w", err)
	}
	if *logGroups != "" {
		if c.LogGroups, err = ParseLogGroups(*logGroups); err != nil {
			return c, err
		}
	}
	if *fail != "" {
		if c.FailStep, c.FailRank, err = parseFailAt(*fail); err != nil {
			return c, fmt.Errorf("--fail-at: %w", err)
		}
	}
	if *hold != "" {
		st, tn, ok := strings.Cut(*hold, ":")
		var e1, e2 error
		c.HoldUpdateStep, e1 = strconv.ParseInt(st, 10, 64)
		c.HoldUpdateTensor, e2 = strconv.Atoi(tn)
		if !ok || e1 != nil || e2 != nil || c.HoldUpdateStep < 1 || c.HoldUpdateTensor < 0 {
			return c, fmt.Errorf("--hold-in-update %q: want STEP:TENSOR with STEP >= 1 and TENSOR >= 0 (e.g. 12:3)", *hold)
		}
	}
	if *holdBefore != "" {
		st, rks, ok := strings.Cut(*holdBefore, ":")
		var err error
		c.HoldBeforeStep, err = strconv.ParseInt(st, 10, 64)
		for _, rk := range strings.Split(rks, ",") {
			r, e := strconv.Atoi(rk)
			if e != nil || r < 0 {
				ok = false
			}
			c.HoldBeforeRanks = append(c.HoldBeforeRanks, r)
		}
		if !ok || err != nil || c.HoldBeforeStep < 1 {
			return c, fmt.Errorf("--hold-before-update %q: want STEP:RANK[,RANK...] with STEP >= 1 and RANKs >= 0 (e.g. 12:1 or 12:2,3)", *holdBefore)
		}
	}
	if *failUpd != "" {
		parts := strings.Split(*failUpd, ":")
		var e1, e2, e3 error
		if len(parts) == 3 {
			c.FailUpdateStep, e1 = strconv.ParseInt(parts[0], 10, 64)
			c.FailUpdateRank, e2 = strconv.Atoi(parts[1])
			c.FailUpdateTensor, e3 = strconv.Atoi(parts[2])
		}
		if len(parts) != 3 || e1 != nil || e2 != nil || e3 != nil || c.FailUpdateStep < 1 || c.FailUpdateRank < 0 || c.FailUpdateTensor < 0 {
			return c, fmt.Errorf("--fail-in-update %q: want STEP:RANK:TENSOR with STEP >= 1, RANK and TENSOR >= 0 (e.g. 12:1:3)", *failUpd)
		}
	}
	if *slow != "" {
		st, d, _ := strings.Cut(*slow, ":")
		step, err1 := strconv.ParseInt(st, 10, 64)
		dur, err2 := time.ParseDuration(d)
		if err1 != nil || err2 != nil || step < 1 || dur <= 0 {
			return c, fmt.Errorf("--slow-at %q: want STEP:DURATION with STEP >= 1 and a positive duration (e.g. 12:2s)", *slow)
		}
		c.SlowAt, c.SlowStep = step, dur
	}
	if *straggle != "" {
		rk, d, _ := strings.Cut(*straggle, ":")
		rank, err1 := strconv.Atoi(rk)
		dur, err2 := time.ParseDuration(d)
		if err1 != nil || err2 != nil || rank < 0 || dur <= 0 {
			return c, fmt.Errorf("--slow-rank %q: want RANK:DURATION with RANK >= 0 and a positive duration (e.g. 2:100ms)", *straggle)
		}
		c.SlowRank, c.SlowRankBy = rank, dur
	}
	return c, c.check()
}

func parseFailAt(s string) (int64, int, error) {
	st, rk, ok := strings.Cut(s, ":")
	step, err1 := strconv.ParseInt(st, 10, 64)
	rank, err2 := strconv.Atoi(rk)
	if !ok || err1 != nil || err2 != nil || step < 1 || rank < 0 {
		return 0, 0, fmt.Errorf("%q is not STEP:RANK with STEP >= 1 and RANK >= 0 (e.g. --fail-at 50:3)", s)
	}
	return step, rank, nil
}

var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40}, {"B", 1},
}

// ParseSize reads a byte count such as 4MiB, 1.5GiB, 500MB or 65536.
func ParseSize(s string) (int64, error) {
	num, mult := strings.TrimSpace(s), int64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(strings.ToUpper(num), strings.ToUpper(u.suffix)) && len(num) > len(u.suffix) {
			num, mult = strings.TrimSpace(num[:len(num)-len(u.suffix)]), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(f) || f <= 0 {
		return 0, fmt.Errorf("%q is not a size: use a positive number with an optional unit, e.g. 4MiB, 256MiB, 1GiB", s)
	}
	v := f * float64(mult)
	if v > 1<<40 {
		return 0, fmt.Errorf("%q is larger than 1TiB", s)
	}
	return int64(v), nil
}

// check validates what does not depend on the world size.
func (c *Config) check() error {
	switch {
	case c.Steps < 1:
		return fmt.Errorf("--steps %d: must be >= 1", c.Steps)
	case c.MinStep < 0:
		return fmt.Errorf("--min-step %v: must not be negative", c.MinStep)
	case c.Compute < 0:
		return fmt.Errorf("--compute %v: must not be negative", c.Compute)
	case c.CommWait < 0 || c.CommWait > time.Second:
		return fmt.Errorf("--comm-wait %v: must be between 0 (MPI's blocking calls) and 1s, e.g. 200us", c.CommWait)
	case c.Optimizer != SGD && c.Optimizer != Momentum && c.Optimizer != Adam && c.Optimizer != AdamW:
		return fmt.Errorf("--optimizer %q: use sgd, momentum, adam or adamw", c.Optimizer)
	case !(c.LR > 0) || math.IsInf(c.LR, 0):
		return fmt.Errorf("--lr %v: must be a positive finite number, e.g. --lr 1e-3", c.LR)
	case !(c.WeightDecay >= 0) || math.IsInf(c.WeightDecay, 0):
		return fmt.Errorf("--weight-decay %v: must be >= 0", c.WeightDecay)
	case !(c.Momentum >= 0 && c.Momentum < 1):
		return fmt.Errorf("--momentum %v: must be in [0, 1)", c.Momentum)
	case c.Layers < 1:
		return fmt.Errorf("--layers %d: must be >= 1", c.Layers)
	case c.PP < 1:
		return fmt.Errorf("--pp %d: must be >= 1", c.PP)
	case c.PP > c.Layers:
		return fmt.Errorf("--pp %d exceeds --layers %d: every stage needs a layer; raise --layers or lower --pp", c.PP, c.Layers)
	case c.DP < 0:
		return fmt.Errorf("--dp %d: must be >= 1 (or 0 for world size / pp)", c.DP)
	case c.Batch < 1:
		return fmt.Errorf("--batch %d: must be >= 1", c.Batch)
	case c.Micro < 0:
		return fmt.Errorf("--micro %d: must be >= 1 (or 0 for batch/dp)", c.Micro)
	case c.SaveEvery < 0:
		return fmt.Errorf("--save-every %d: must be >= 0", c.SaveEvery)
	case c.LogEvery < 1:
		return fmt.Errorf("--log-every %d: must be >= 1", c.LogEvery)
	case c.MeasureFrom < 0 || c.MeasureFrom > c.Steps:
		return fmt.Errorf("--measure-from %d: must be 0 (off) or a step in 1..%d (--steps)", c.MeasureFrom, c.Steps)
	case c.Threads < 0:
		return fmt.Errorf("--threads %d: must be >= 0", c.Threads)
	case c.FailStep < 0 || c.FailRank < 0:
		return fmt.Errorf("--fail-at %d:%d: must be STEP:RANK with STEP >= 1", c.FailStep, c.FailRank)
	}
	if err := c.checkLogging(); err != nil {
		return err
	}
	if c.Undo {
		if err := checkUndo(c); err != nil {
			return err
		}
	}
	if c.FailUpdateStep > 0 && !c.Undo {
		return fmt.Errorf("--fail-in-update needs --undo: without it the update is not applied tensor by tensor")
	}
	if c.HoldBeforeStep > 0 && (!c.Undo || !c.JIT) {
		return fmt.Errorf("--hold-before-update needs --undo and --jit: the hold ends when a JIT flush steps back over the other ranks' last update, which needs --undo")
	}
	if c.HoldUpdateStep > 0 && (!c.Undo || !c.JIT) {
		return fmt.Errorf("--hold-in-update needs --undo and --jit: the hold ends when a JIT flush interrupts the update, which --undo then undoes")
	}
	if c.Width() < 2 {
		return fmt.Errorf("--size %d bytes is too small for %d layers: use at least %d bytes", c.SizeBytes, c.Layers, 4*c.Layers*6)
	}
	return nil
}

// Validate checks c against the world size and fills in the defaults that
// depend on it (DP, Micro).
func (c *Config) Validate(world int) error {
	if err := c.check(); err != nil {
		return err
	}
	if c.DP == 0 {
		if world%c.PP != 0 {
			return fmt.Errorf("world size %d is not a multiple of --pp %d: launch dp*pp ranks", world, c.PP)
		}
		c.DP = world / c.PP
	}
	if c.DP*c.PP != world {
		return fmt.Errorf("world size %d != --dp %d x --pp %d: launch %d ranks or change --dp/--pp", world, c.DP, c.PP, c.DP*c.PP)
	}
	if c.HoldBeforeStep > 0 {
		switch {
		case slices.Max(c.HoldBeforeRanks) >= world || len(c.HoldBeforeRanks) >= world:
			return fmt.Errorf("--hold-before-update %d:%v: the job has ranks 0..%d, and at least one must finish the step", c.HoldBeforeStep, c.HoldBeforeRanks, world-1)
		case c.Zero1 && c.DP > 1:
			return fmt.Errorf("--hold-before-update with --zero1: the JIT step-back that ends the hold needs every buffer replicated or the stage's own " +
				"(no --zero1 with --dp > 1; docs/UNDO.md)")
		}
	}
	if c.LogGroups != nil {
		switch last := c.LogGroups[len(c.LogGroups)-1][1]; {
		case c.LogMessages == LogOff:
			return fmt.Errorf("--log-groups needs --log-messages sync or bubble: the groups say which messages are logged")
		case last != c.PP-1:
			return fmt.Errorf("--log-groups %v: the groups end at stage %d, but --pp %d has stages 0..%d: cover every stage once", c.LogGroups, last, c.PP, c.PP-1)
		case len(c.LogGroups) < 2:
			return fmt.Errorf("--log-groups %v: one group logs nothing, and a failure would replay every stage: that is a restart from the snapshot; drop --log-messages", c.LogGroups)
		}
	}
	if c.LogMessages != LogOff && c.DP > 1 {
		// SWIFT's rule: replicas when they exist, logging only for the
		// stages that have none.
		return fmt.Errorf("--log-messages with --dp %d: every pipeline stage has %d data-parallel replicas, and a stage lost with its node "+
			"is restored from a replica's copy (SWIFT uses replicas where they exist, logging only for stages without one); "+
			"logging would add cost and protect nothing more: drop --log-messages, or run --dp 1", c.DP, c.DP)
	}
	if c.Micro == 0 {
		if c.Batch%c.DP != 0 {
			return fmt.Errorf("--batch %d is not divisible by --dp %d: pick a batch that is a multiple of dp", c.Batch, c.DP)
		}
		c.Micro = c.Batch / c.DP
	}
	if c.Batch%c.Micro != 0 {
		return fmt.Errorf("--batch %d is not a multiple of --micro %d", c.Batch, c.Micro)
	}
	m := c.Batch / c.Micro
	if m%c.DP != 0 {
		return fmt.Errorf("--batch %d / --micro %d = %d microbatches, not divisible by --dp %d: adjust --batch or --micro", c.Batch, c.Micro, m, c.DP)
	}
	if m > maxMicrobatches {
		return fmt.Errorf("%d microbatches per step exceed %d (fixed-point gradient range): raise --micro", m, maxMicrobatches)
	}
	if c.SlowRankBy > 0 && c.SlowRank >= world {
		return fmt.Errorf("--slow-rank %d:%s: rank %d does not exist in a world of %d", c.SlowRank, c.SlowRankBy, c.SlowRank, world)
	}
	if c.FailUpdateStep > 0 && c.FailUpdateRank >= world {
		return fmt.Errorf("--fail-in-update %d:%d:%d: rank %d does not exist in a world of %d", c.FailUpdateStep, c.FailUpdateRank, c.FailUpdateTensor, c.FailUpdateRank, world)
	}
	if c.FailStep > 0 && c.FailRank >= world {
		return fmt.Errorf("--fail-at %d:%d: rank %d does not exist in a world of %d", c.FailStep, c.FailRank, c.FailRank, world)
	}
	// MPI counts are C ints.
	if per := int64(c.Layers/c.PP+1) * int64(c.Width()) * int64(c.Width()+1); per >= math.MaxInt32 {
		return fmt.Errorf("--size %d: a pipeline stage would hold %d parameters, over MPI's 2^31 count limit: raise --pp", c.SizeBytes, per)
	}
	return nil
}

// checkLogging validates --log-messages against the other flags.
func (c *Config) checkLogging() error {
	switch c.LogMessages {
	case LogOff:
		return nil
	case LogSync, LogBubble:
	default:
		return fmt.Errorf("--log-messages %q: use off, sync or bubble", c.LogMessages)
	}
	switch {
	case c.PP < 2:
		return fmt.Errorf("--log-messages needs --pp >= 2: it logs the activations and gradients pipeline stages send each other, and --pp %d sends none", c.PP)
	case c.SaveEvery < 1:
		return fmt.Errorf("--log-messages needs --save-every >= 1: a lost stage replays from its snapshot, and the logs are truncated as snapshots commit")
	case c.LogCap < 1:
		return fmt.Errorf("--log-cap %d: must be positive (e.g. 1GiB)", c.LogCap)
	}
	return nil
}

// ParseLogGroups parses --log-groups: comma-separated stages or ranges of
// stages ("0,1-2,3"), consecutive from stage 0 (Validate checks they end
// at the last stage).
func ParseLogGroups(v string) ([][2]int, error) {
	var gs [][2]int
	next := 0
	for _, f := range strings.Split(v, ",") {
		a, b, isRange := strings.Cut(strings.TrimSpace(f), "-")
		first, e1 := strconv.Atoi(a)
		last, e2 := first, error(nil)
		if isRange {
			last, e2 = strconv.Atoi(b)
		}
		if e1 != nil || e2 != nil || first < 0 || last < first {
			return nil, fmt.Errorf("--log-groups %q: %q is not a stage or a range FIRST-LAST of stages (e.g. 0,1-2,3)", v, f)
		}
		if first != next {
			return nil, fmt.Errorf("--log-groups %q: group %q starts at stage %d, want %d: the groups are consecutive ranges of stages from stage 0, in order", v, f, first, next)
		}
		gs = append(gs, [2]int{first, last})
		next = last + 1
	}
	return gs, nil
}

// stageGroups returns each stage's group index under LogGroups.
func (c *Config) stageGroups() []int {
	g := make([]int, c.PP)
	if c.LogGroups == nil {
		for i := range g {
			g[i] = i
		}
		return g
	}
	for i, r := range c.LogGroups {
		for st := r[0]; st <= r[1] && st < c.PP; st++ {
			g[st] = i
		}
	}
	return g
}

// Width is the layer width derived from SizeBytes: the largest h with
// Layers*(h*h + h) float32 parameters within SizeBytes.
func (c *Config) Width() int {
	per := float64(c.SizeBytes) / 4 / float64(c.Layers)
	h := int(math.Sqrt(per))
	for h > 0 && float64(h)*float64(h+1) > per {
		h--
	}
	return h
}

// Microbatches is the number of microbatches per step (after Validate).
func (c *Config) Microbatches() int { return c.Batch / c.Micro }

// fingerprint identifies everything a snapshot's contents depend on, so a
// restore under different flags fails instead of silently mixing runs.
func (c *Config) fingerprint() int64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d|%d|%s|%v|%v|%v|%d|%d|%d|%d|%d|%v",
		c.Width(), c.Layers, c.Optimizer, c.LR, c.WeightDecay, c.Momentum, c.Seed,
		c.Batch, c.Micro, c.DP, c.PP, c.Zero1)
	return int64(h.Sum64() >> 1)
}
