package train

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/reft-hpc/reft/agent/aor"
)

// Options are the trainer's connections to the outside world.
type Options struct {
	Comm Comm        // world communicator (required)
	Snap Snapshotter // nil: snapshots disabled
	// SnapOff is the line rank 0 logs when Snap is nil; "": a generic one.
	SnapOff string
	Log     io.Writer // where rank 0 writes its lines; nil: discard
	// Kill is what --fail-at does; reft-train SIGKILLs itself. Returning
	// makes Run fail with the error.
	Kill func() error
	// beforeTensor (tests) is called under --undo before each tensor's
	// update of step; an error stops the update there.
	beforeTensor func(step int64, seg int) error
	// Note receives each rank's own lines (--hold-in-update's); nil: none.
	Note func(msg string)
	// MsgLog is this rank's message log, required under --log-messages.
	MsgLog MessageLog
}

// Result is what a rank reports after training.
type Result struct {
	Hash        string     // final-params-sha256 (rank 0 only)
	Losses      []StepLoss // logged losses (rank 0 only)
	ResumedFrom int64      // generation restored from; 0 when none
	MeanStepMs  float64    // mean wall time per step run here
	// SteadyMs is the mean over the steps >= Config.MeasureFrom run here
	// (0: none, or MeasureFrom 0).
	SteadyMs float64
	// SaveBlockedMs is the mean time training waited per save (Save and
	// the wait for its copy), over the saves run here; 0 without saves.
	SaveBlockedMs float64
	Clamped       int64       // gradient values clamped to the fixed-point range, whole job
	Params        [][]float32 // this rank's stage parameters, one slice per tensor
	// Replayed is the number of steps this rank replayed from its
	// neighbours' message logs after a restore (ReplayFrom+1 .. ReplayFrom+
	// Replayed), in ReplaySeconds; 0 when it did not replay.
	Replayed      int64
	ReplayFrom    int64
	ReplaySeconds float64
	// LogBytes is what this rank put in its message log; LogBubbleBytes
	// the part handed to the log in a pipeline bubble (--log-messages=bubble).
	LogBytes, LogBubbleBytes int64
}

// StepLoss is one logged loss.
type StepLoss struct {
	Step int64
	Loss float64
}

// Point-to-point tags.
const (
	tagAct = 1 + iota
	tagGrad
	tagParams
	tagHold // never sent: --hold-before-update's receive that nothing matches
)

// ErrKilled is what a test Kill hook may return.
var ErrKilled = errors.New("killed by --fail-at")

// ErrUpdateFailed is the failure --fail-in-update injects.
var ErrUpdateFailed = errors.New("failure injected by --fail-in-update")

// ErrUpdateInterrupted stops an update that a JIT flush asked to stop
// (UpdateInterrupter); under --undo the applied part is undone.
var ErrUpdateInterrupted = errors.New("interrupted by a JIT flush")

// HoldMax bounds --hold-in-update's wait for the flush's interrupt.
const HoldMax = 2 * time.Minute

// trainer is one rank's state.
type trainer struct {
	cfg         Config
	world, dpc  Comm
	rank        int
	dpIdx, pipe int // position: rank = dpIdx + DP*pipe
	width       int
	layers      []*layer
	params      []float32 // flat, padded to a multiple of DP
	grads       []float32 // float gradient of one microbatch; then the step's gradient
	// stepGrad is the step's whole reduced gradient, registered for AOR
	// (AORSnapshotter): written only in update, after the previous save
	// has finished reading it, so a save of step s carries the gradient
	// that made its optimizer state. nil without AOR.
	stepGrad    []float32
	acc         []int64 // fixed-point gradient sum; last element: loss
	nParams     int     // unpadded length
	shardLen    int
	opt         *optimizer
	teach       *teacher
	state       []int64 // [step, optimizer updates, fingerprint]: snapshotted
	clamped     int64
	acts        [][]float32 // per local microbatch: input then each layer's output
	gbuf, gbuf2 []float32
	log         io.Writer
	hint        Hinter        // nil: the snapshotter takes no hints
	comm        CommPhaser    // nil: the snapshotter takes no communication phases
	serial      time.Duration // the last single-threaded addFixed, the next window's estimate
	undo        *undoLog      // nil without --undo
	resumed     bool          // restored from a snapshot: --fail-in-update does not fire
	// undoGrad is the step's gradient over the optimizer range under
	// --undo: the undo data, kept until the next update begins (the next
	// step's backward reuses t.grads), so that a JIT flush can step back
	// over a complete update (stepBack). nil without --undo or under AOR,
	// whose stepGrad lives as long.
	undoGrad []float32
	// gate is held (a value in it) by whoever may read or change the
	// parameters, optimizer state and t.state outside the client's
	// Updating..Consistent: the trainer, except inside collectives that
	// touch none of them (the gradient all-reduce, the loss reduction), or
	// a JIT flush's step-back (stepBack). holding: the trainer holds it.
	gate    chan struct{}
	holding bool
	// groups is each stage's --log-groups group (Config.stageGroups).
	groups []int
	// stepped is closed when a JIT flush's step-back has run (it ends
	// --hold-before-update's hold).
	stepped     chan struct{}
	steppedOnce sync.Once
	// beforeTensor, when set (tests), is called before each tensor's
	// update under --undo; an error stops the update there.
	beforeTensor func(seg int) error
	// stop is closed when a JIT flush asks the update to stop (under
	// --undo with an UpdateInterrupter): every update from then on stops
	// at its next tensor, since a flush happens only when the job fails.
	stop     chan struct{}
	stopOnce sync.Once
	note     func(string) // Options.Note; never nil

	mlog     *sendLog    // nil without --log-messages
	sentGrad [][]float32 // under --log-messages: per local microbatch, the gradient sent to the previous stage
	// The step path's snapshot state (step).
	snap        Snapshotter
	cons        Consistency
	pending     Waiter // the last Save, not yet waited for; read and written under gate
	pendingStep int64
	lastGen     int64 // the newest generation known committed; 0: none
	blocked     time.Duration
	saves       int64
}

// UndoneError is Run's error when a step's optimizer update was
// interrupted and undone: the buffers hold step Step, consistent, and the
// snapshotter was told so (Consistency), so a JIT flush saves it.
type UndoneError struct {
	Step    int64 // the step the buffers hold again
	Tensors int   // tensors whose update was undone
	Err     error // what interrupted the update
}

func (e *UndoneError) Error() string {
	return fmt.Sprintf("%v (the update was undone on %d tensors: the state is step %d again)", e.Err, e.Tensors, e.Step)
}

func (e *UndoneError) Unwrap() error { return e.Err }

// Run trains to cfg.Steps and returns this rank's result. Every rank of
// o.Comm must call it with the same cfg.
func Run(cfg Config, o Options) (*Result, error) {
	if o.Comm == nil {
		return nil, errors.New("train: no communicator")
	}
	if err := cfg.Validate(o.Comm.Size()); err != nil {
		return nil, err
	}
	t, err := newTrainer(cfg, o)
	if err != nil {
		return nil, err
	}
	res, err := t.run(o)
	if t.mlog != nil {
		// Also when training failed: what was sent is logged before
		// Run returns (SWIFT flushes its logging queue at a failure).
		if lerr := t.mlog.close(); lerr != nil && err == nil {
			err = fmt.Errorf("message log: %w", lerr)
		}
	}
	if err != nil {
		return nil, err
	}
	return res, nil
}

func newTrainer(cfg Config, o Options) (*trainer, error) {
	t := &trainer{cfg: cfg, world: o.Comm, rank: o.Comm.Rank(), width: cfg.Width(), log: o.Log, stop: make(chan struct{}), note: o.Note,
		gate: make(chan struct{}, 1), stepped: make(chan struct{}), groups: cfg.stageGroups()}
	if t.note == nil {
		t.note = func(string) {}
	}
	if t.log == nil || t.rank != 0 {
		t.log = io.Discard
	}
	t.dpIdx, t.pipe = t.rank%cfg.DP, t.rank/cfg.DP
	if f := o.beforeTensor; f != nil {
		t.beforeTensor = func(seg int) error { return f(t.state[0]+1, seg) }
	} else if cfg.FailUpdateStep > 0 && t.rank == cfg.FailUpdateRank {
		t.beforeTensor = func(seg int) error {
			if !t.resumed && t.state[0]+1 == cfg.FailUpdateStep && seg == cfg.FailUpdateTensor {
				return fmt.Errorf("step %d, before tensor %d: %w", cfg.FailUpdateStep, seg, ErrUpdateFailed)
			}
			return nil
		}
	}
	group := make([]int, cfg.DP)
	for i := range group {
		group[i] = i + cfg.DP*t.pipe
	}
	dpc, err := t.world.Sub(group)
	if err != nil {
		return nil, fmt.Errorf("DP group %v: %w", group, err)
	}
	t.dpc = dpc
	if dpc.Size() != cfg.DP || dpc.Rank() != t.dpIdx {
		return nil, fmt.Errorf("DP group %v: got rank %d of %d, want %d of %d", group, dpc.Rank(), dpc.Size(), t.dpIdx, cfg.DP)
	}

	first, last := t.pipe*cfg.Layers/cfg.PP, (t.pipe+1)*cfg.Layers/cfg.PP
	h := t.width
	t.nParams = (last - first) * (h*h + h)
	padded := (t.nParams + cfg.DP - 1) / cfg.DP * cfg.DP
	t.shardLen = padded / cfg.DP
	t.params = make([]float32, padded)
	t.grads = make([]float32, padded)
	t.acc = make([]int64, padded+1)
	off := 0
	for g := first; g < last; g++ {
		l := &layer{global: g, in: h, out: h, linear: g == cfg.Layers-1}
		l.w, l.gw = t.params[off:off+h*h:off+h*h], t.grads[off:off+h*h:off+h*h]
		off += h * h
		l.b, l.gb = t.params[off:off+h:off+h], t.grads[off:off+h:off+h]
		off += h
		initLayer(cfg.Seed, l, cfg.Threads)
		t.layers = append(t.layers, l)
	}
	optLen := padded
	if cfg.Zero1 {
		optLen = t.shardLen
	}
	t.opt = newOptimizer(&cfg, optLen)
	if cfg.Undo {
		lo := 0
		if cfg.Zero1 {
			lo = t.dpIdx * t.shardLen
		}
		if optLen >= 1<<30 {
			return nil, fmt.Errorf("--undo: %d optimizer elements per rank exceed undo's 2^30 index range: raise --pp or use --zero1", optLen)
		}
		var bounds []int
		for k := range t.layers {
			bounds = append(bounds, k*(h*h+h), k*(h*h+h)+h*h)
		}
		bounds = append(bounds, t.nParams)
		t.undo = newUndoLog(lo, lo+optLen, bounds)
		if cfg.FailUpdateStep > 0 && t.rank == cfg.FailUpdateRank && cfg.FailUpdateTensor >= len(t.undo.segs) {
			return nil, fmt.Errorf("--fail-in-update %d:%d:%d: rank %d updates %d tensors (0..%d)", cfg.FailUpdateStep, cfg.FailUpdateRank,
				cfg.FailUpdateTensor, t.rank, len(t.undo.segs), len(t.undo.segs)-1)
		}
		if cfg.HoldUpdateStep > 0 && cfg.HoldUpdateTensor >= len(t.undo.segs) {
			return nil, fmt.Errorf("--hold-in-update %d:%d: rank %d updates %d tensors (0..%d)", cfg.HoldUpdateStep,
				cfg.HoldUpdateTensor, t.rank, len(t.undo.segs), len(t.undo.segs)-1)
		}
		t.undoGrad = make([]float32, optLen)
	}
	if t.pipe == cfg.PP-1 {
		t.teach = newTeacher(cfg.Seed, h)
	}
	local := cfg.Microbatches() / cfg.DP
	t.acts = make([][]float32, local)
	for i := range t.acts {
		t.acts[i] = make([]float32, (len(t.layers)+1)*cfg.Micro*h)
	}
	t.gbuf, t.gbuf2 = make([]float32, cfg.Micro*h), make([]float32, cfg.Micro*h)
	if cfg.LogMessages != LogOff {
		if o.MsgLog == nil {
			return nil, errors.New("--log-messages: no message log configured (Options.MsgLog)")
		}
		if o.Snap == nil {
			return nil, errors.New("--log-messages needs snapshots: a lost stage replays from its snapshot, and the logs are truncated as snapshots commit; " +
				"launch under reft (srun --reft=...) or with --ckpt-dir, or drop --log-messages")
		}
		// A separate buffer per microbatch for the gradient sent back, so
		// that the bubble-time copy can read it while later microbatches
		// compute (the activations sent forward have theirs in t.acts).
		t.sentGrad = make([][]float32, local)
		for i := range t.sentGrad {
			t.sentGrad[i] = make([]float32, cfg.Micro*h)
		}
		t.mlog = newSendLog(o.MsgLog, cfg.LogMessages == LogBubble, local)
	}
	t.state = []int64{0, 0, cfg.fingerprint()}
	return t, nil
}

// bytesOf views a float32 slice as its bytes, without copying.
func bytesOf(f []float32) []byte {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), len(f)*4)
}

func (t *trainer) register(s Snapshotter) error {
	for _, l := range t.layers {
		if err := s.Register(fmt.Sprintf("layer%d.weight", l.global), bytesOf(l.w), true); err != nil {
			return err
		}
		if err := s.Register(fmt.Sprintf("layer%d.bias", l.global), bytesOf(l.b), true); err != nil {
			return err
		}
	}
	replicated := !t.cfg.Zero1
	as, useAOR := s.(AORSnapshotter)
	useAOR = useAOR && t.cfg.Zero1 && t.cfg.DP > 1 && t.opt.m != nil && as.AOR()
	if useAOR && t.cfg.SaveEvery != 1 {
		fmt.Fprintf(t.log, "aor: optimizer shards registered without AOR: a replica needs every step's gradient, and --save-every is %d, not 1\n", t.cfg.SaveEvery)
		useAOR = false
	}
	var shards [][2]int64
	if useAOR {
		t.stepGrad = make([]float32, len(t.params))
		t.undoGrad = nil // the update's gradient is stepGrad's part
		if err := s.Register("gradients", bytesOf(t.stepGrad), true); err != nil {
			return err
		}
		for d := 0; d < t.cfg.DP; d++ {
			shards = append(shards, [2]int64{int64(d * t.shardLen), int64(t.shardLen)})
		}
	}
	for _, st := range []struct {
		name, state string
		buf         []float32
	}{{"optimizer.m", aor.StateM, t.opt.m}, {"optimizer.v", aor.StateV, t.opt.v}} {
		var err error
		switch {
		case st.buf == nil:
		case useAOR:
			err = as.RegisterOptimizerState(st.name, bytesOf(st.buf), OptimizerState{Optimizer: t.opt.st, State: st.state,
				Grad: "gradients", Shards: shards, Index: t.dpIdx})
		default:
			err = s.Register(st.name, bytesOf(st.buf), replicated)
		}
		if err != nil {
			return err
		}
	}
	return s.Register("trainer.state", unsafe.Slice((*byte)(unsafe.Pointer(&t.state[0])), len(t.state)*8), true)
}

func (t *trainer) run(o Options) (*Result, error) {
	cfg := &t.cfg
	res := &Result{}
	start := int64(1)
	var plan *replayPlan
	if o.Snap == nil {
		off := o.SnapOff
		if off == "" {
			off = "snapshots disabled: no reft client configured, training without in-memory snapshots"
		}
		fmt.Fprintln(t.log, off)
	} else {
		if cfg.Hints {
			t.hint, _ = o.Snap.(Hinter)
		}
		t.comm, _ = o.Snap.(CommPhaser)
		if err := t.every0(o.Snap); err != nil {
			return nil, err
		}
		if ui, ok := o.Snap.(UpdateInterrupter); ok && t.undo != nil && cfg.JIT {
			ui.SetUpdateInterrupt(func() { t.stopOnce.Do(func() { close(t.stop) }) })
		}
		if c, ok := o.Snap.(Collective); ok {
			c.Join(t.world, t.dpIdx, t.pipe)
		}
		if err := t.register(o.Snap); err != nil {
			return nil, fmt.Errorf("register snapshot buffers: %w", err)
		}
		t.installStepBack(o.Snap)
		restore := o.Snap.Restore
		lr, local := o.Snap.(LocalRestorer)
		if t.mlog != nil {
			if local {
				restore = func() (int64, bool, error) { return t.restoreLocal(lr) }
			} else {
				fmt.Fprintln(t.log, "message logging: this snapshotter restores only a step that every rank holds, so a failure rolls every stage back "+
					"and the logs are not replayed (replay needs a per-rank restore, train.LocalRestorer: reft's snapshots have one, --ckpt-dir does not; docs/LOGGING.md)")
			}
		}
		step, ok, err := restore()
		if err != nil {
			return nil, fmt.Errorf("restore: %w", err)
		}
		if ok {
			if t.state[2] != cfg.fingerprint() {
				return nil, fmt.Errorf("restore: generation %d was written with different model/optimizer/layout flags; rerun with the original flags", step)
			}
			if t.state[0] != step {
				return nil, fmt.Errorf("restore: generation %d holds state of step %d", step, t.state[0])
			}
			res.ResumedFrom = step
			t.resumed = true
			t.lastGen = step
			start = step + 1
			fmt.Fprintf(t.log, "resumed from step %d\n", step)
		}
		if t.mlog != nil && local {
			if plan, err = t.agree(res.ResumedFrom); err != nil {
				return nil, err
			}
		}
	}
	fmt.Fprintf(t.log, "reft-train: %d layers of width %d (%d parameters, %d bytes), dp %d pp %d zero1 %v, optimizer %s, batch %d in %d microbatches\n",
		cfg.Layers, t.width, cfg.Layers*(t.width*t.width+t.width), int64(cfg.Layers)*int64(t.width*t.width+t.width)*4,
		cfg.DP, cfg.PP, cfg.Zero1, cfg.Optimizer, cfg.Batch, cfg.Microbatches())

	// JIT flush: the snapshotter may save the newest consistent step when
	// a failure is detected; it must know when the buffers hold one.
	t.snap = o.Snap
	t.cons, _ = o.Snap.(Consistency)
	if t.cons != nil && res.ResumedFrom > 0 {
		t.cons.Consistent(res.ResumedFrom)
	}
	t.lockGate()
	defer func() {
		if t.holding {
			t.unlockGate() // a flush's step-back may come after Run
		}
	}()
	if plan != nil && plan.needed() {
		if err := t.replay(plan, res); err != nil {
			return nil, err
		}
		start = plan.to + 1
	}
	var total, steady time.Duration
	var ran, steadyRan int64
	first, last := t.pipe == 0, t.pipe == cfg.PP-1
	live := stageIO{sendAct: !last, sendGrad: !first}
	for step := start; step <= cfg.Steps; step++ {
		if !t.resumed && step == cfg.FailStep && t.rank == cfg.FailRank {
			fmt.Fprintf(t.log, "fail-at: rank %d kills itself at step %d\n", t.rank, step)
			if o.Kill == nil {
				return nil, fmt.Errorf("step %d: %w", step, ErrKilled)
			}
			if err := o.Kill(); err != nil {
				return nil, fmt.Errorf("step %d: %w", step, err)
			}
		}
		t0 := time.Now()
		if err := t.step(step, live); err != nil {
			return nil, err
		}
		if step%cfg.LogEvery == 0 || step == cfg.Steps {
			loss, err := t.loss()
			if err != nil {
				return nil, fmt.Errorf("step %d: loss: %w", step, err)
			}
			res.Losses = append(res.Losses, StepLoss{step, loss})
			fmt.Fprintf(t.log, "step %d loss %.9g\n", step, loss)
		}
		if d := cfg.MinStep - time.Since(t0); d > 0 {
			time.Sleep(d)
		}
		if step == cfg.SlowAt {
			time.Sleep(cfg.SlowStep)
		}
		total += time.Since(t0)
		ran++
		if cfg.MeasureFrom > 0 && step >= cfg.MeasureFrom {
			steady += time.Since(t0)
			steadyRan++
		}
	}
	if err := t.waitSave(); err != nil {
		return nil, fmt.Errorf("wait for last snapshot: %w", err)
	}
	if t.mlog != nil {
		if err := t.mlog.drain(); err != nil {
			return nil, fmt.Errorf("message log: %w", err)
		}
		res.LogBytes, res.LogBubbleBytes = t.mlog.bytes, t.mlog.bubbleBytes
		if cfg.LogMessages == LogBubble && res.LogBytes > 0 {
			fmt.Fprintf(t.log, "message-log: rank %d logged %d bytes, %.1f%% of them handed to the log in a pipeline bubble\n",
				t.rank, res.LogBytes, 100*float64(res.LogBubbleBytes)/float64(res.LogBytes))
		}
	}
	clamped := []int64{t.clamped}
	t.unlockGate() // a survivor of a failure after the last step waits here
	err := t.world.AllReduceSumI64(clamped)
	t.lockGate()
	if err != nil {
		return nil, fmt.Errorf("clamp count: %w", err)
	}
	res.Clamped = clamped[0]
	if res.Clamped > 0 {
		fmt.Fprintf(t.log, "warning: %d gradient values were clamped to +-%d (fixed-point range)\n", res.Clamped, fixLimit)
	}
	hash, err := t.hash()
	if err != nil {
		return nil, fmt.Errorf("final hash: %w", err)
	}
	if ran > 0 {
		res.MeanStepMs = float64(total.Microseconds()) / 1e3 / float64(ran)
	}
	res.Hash = hash
	for _, l := range t.layers {
		res.Params = append(res.Params, l.w, l.b)
	}
	fmt.Fprintf(t.log, "mean-step-ms: %.3f\n", res.MeanStepMs)
	if steadyRan > 0 {
		res.SteadyMs = float64(steady.Microseconds()) / 1e3 / float64(steadyRan)
		fmt.Fprintf(t.log, "mean-step-ms-from-%d: %.3f (%d steps)\n", cfg.MeasureFrom, res.SteadyMs, steadyRan)
	}
	if t.saves > 0 {
		res.SaveBlockedMs = float64(t.blocked.Microseconds()) / 1e3 / float64(t.saves)
		fmt.Fprintf(t.log, "save-blocked-ms: %.3f per save, %d saves\n", res.SaveBlockedMs, t.saves)
	}
	if t.rank == 0 {
		fmt.Fprintf(t.log, "final-params-sha256: %s\n", hash)
	} else {
		res.Losses = nil
	}
	return res, nil
}

// stageIO says which of a step's messages go to the neighbouring stages:
// all of them in training; in a replay only those to a neighbour that
// replays too (the others hold the step already, and the message goes to
// the log only).
type stageIO struct {
	sendAct  bool // activations to the next stage
	sendGrad bool // gradients to the previous stage
}

// step runs step: forward and backward (io), the gradient all-reduce, the
// optimizer update, and a snapshot when one is due. What training waits
// for its snapshots (Save, and the wait for the previous one before the
// update) adds to t.blocked: the goodput benchmark's time blocked per save.
func (t *trainer) step(step int64, io stageIO) error {
	cfg := &t.cfg
	if err := t.computeGradients(step, io); err != nil {
		return fmt.Errorf("step %d: %w", step, err)
	}
	if cfg.Compute > 0 {
		time.Sleep(cfg.Compute)
	}
	if cfg.SlowRankBy > 0 && t.rank == cfg.SlowRank {
		time.Sleep(cfg.SlowRankBy)
	}
	if t.comm != nil {
		t.comm.CommPhase(true, "gradient all-reduce")
	}
	// The all-reduce touches only t.acc: a flush's step-back may run
	// meanwhile, while a failed peer keeps this rank blocked here.
	t.unlockGate()
	err := t.dpc.AllReduceSumI64(t.acc)
	if t.comm != nil {
		t.comm.CommPhase(false, "")
	}
	if err != nil {
		return fmt.Errorf("step %d: gradient allreduce: %w", step, err)
	}
	if err := t.holdBeforeUpdate(step); err != nil {
		return fmt.Errorf("step %d: %w", step, err)
	}
	t.lockGate()
	// The previous save must have read the buffers before they change.
	if err := t.waitSave(); err != nil {
		return fmt.Errorf("step %d: wait for snapshot: %w", step, err)
	}
	if t.cons != nil {
		t.cons.Updating()
	}
	if err := t.update(); err != nil {
		var ue *UndoneError
		if errors.As(err, &ue) {
			fmt.Fprintf(t.log, "undo: step %d's update was interrupted (%v): undid %d tensors, the state is step %d\n", step, ue.Err, ue.Tensors, ue.Step)
			if t.cons != nil {
				t.cons.Consistent(ue.Step)
			}
		}
		return fmt.Errorf("step %d: %w", step, err)
	}
	t.state[0] = step
	if t.mlog != nil && t.cons != nil {
		// A JIT flush saves the step declared consistent, and a stage lost
		// meanwhile replays up to it from this rank's log: every message
		// the step sent must be in the log first. Under bubble logging the
		// ones sent since the rank last waited are still held (the last
		// stage's gradients, sent after its last receive, and then a world
		// collective is no bubble): they go to the log here. (Seen on the
		// cluster: the last stage flushed step 14 while its log ended at
		// 13, and the replay of the lost stage could not reach 14.)
		if err := t.mlog.drain(); err != nil {
			return fmt.Errorf("step %d: message log: %w", step, err)
		}
	}
	if t.cons != nil {
		t.cons.Consistent(step)
	}
	if t.mlog != nil {
		if err := t.mlog.check(); err != nil {
			return fmt.Errorf("step %d: message log: %w", step, err)
		}
	}
	if t.snap != nil && cfg.SaveEvery > 0 && step%cfg.SaveEvery == 0 {
		ts := time.Now()
		w, err := t.snap.Save(step)
		if err != nil {
			return fmt.Errorf("step %d: save: %w", step, err)
		}
		t.blocked += time.Since(ts)
		t.saves++
		t.pending, t.pendingStep = w, step
	}
	if c := cfg; !t.resumed && step == c.HoldBeforeStep && !slices.Contains(c.HoldBeforeRanks, t.rank) {
		t.note(fmt.Sprintf("hold-before-update: rank %d finished step %d", t.rank, step))
	}
	return nil
}

// waitSave waits for the pending save, if any; once it has committed, the
// message log drops what no restore can need any more: a message of step s
// is needed until its receiver holds a generation >= s that survives the
// loss of a node, and the newest generation may be the one lost with the
// receiver's node before its peer copy landed, so the log keeps every step
// after the second newest generation (docs/LOGGING.md).
func (t *trainer) waitSave() error {
	if t.pending == nil {
		return nil
	}
	tw := time.Now()
	err := t.pending.Wait()
	t.blocked += time.Since(tw)
	t.pending = nil
	if err != nil {
		return err
	}
	if t.mlog != nil {
		if t.lastGen > 0 {
			if err := t.mlog.log.Truncate(t.lastGen); err != nil {
				return fmt.Errorf("truncate the message log up to step %d: %w", t.lastGen, err)
			}
		}
		t.lastGen = t.pendingStep
	}
	return nil
}

// computeGradients runs forward and backward over this rank's microbatches
// (GPipe order: all forwards, then all backwards) and leaves their
// fixed-point gradient sum in t.acc, the loss sum in its last element.
// io says which messages are sent; under --log-messages every message this
// stage produces for a neighbour goes to its log, sent or not.
func (t *trainer) computeGradients(step int64, io stageIO) error {
	cfg, h, n := &t.cfg, t.width, t.cfg.Micro
	clear(t.acc)
	firstStage, lastStage := t.pipe == 0, t.pipe == cfg.PP-1
	prev, next := t.rank-cfg.DP, t.rank+cfg.DP
	local := len(t.acts)
	mb0 := t.dpIdx * local // global index of this rank's first microbatch
	act := func(m, k int) []float32 { return t.acts[m][k*n*h : (k+1)*n*h] }
	L := len(t.layers)
	for m := 0; m < local; m++ {
		x := act(m, 0)
		if firstStage {
			for s := 0; s < n; s++ {
				sampleInput(cfg.Seed, step, (mb0+m)*n+s, x[s*h:(s+1)*h])
			}
		} else if err := t.recv(prev, tagAct, x); err != nil {
			return fmt.Errorf("receive activations from rank %d: %w", prev, err)
		}
		for k, l := range t.layers {
			if k == L-1 && t.mlog != nil {
				// act(m, L) was sent last step; its copy must be done.
				if err := t.mlog.fence(&t.mlog.act[m]); err != nil {
					return err
				}
			}
			l.forward(act(m, k), act(m, k+1), n, cfg.Threads)
		}
		if io.sendAct {
			if err := t.send(next, tagAct, act(m, L)); err != nil {
				return fmt.Errorf("send activations to rank %d: %w", next, err)
			}
		}
		if !lastStage && t.logsTo(t.pipe+1) {
			if err := t.mlog.sent(&t.mlog.act[m], actStream(next), step, m, act(m, L)); err != nil {
				return err
			}
		}
	}
	in, tgt := make([]float32, h), make([]float32, h)
	for m := 0; m < local; m++ {
		// Which of the two buffers holds what does not change a value:
		// each is written whole before it is read.
		gy, gx := t.gbuf, t.gbuf2
		if lastStage {
			// Loss 1/B sum_s mean_j (y-t)^2 over the global batch B.
			y := act(m, L)
			scale := float32(2 / (float64(h) * float64(cfg.Batch)))
			var loss float64
			for s := 0; s < n; s++ {
				sampleInput(cfg.Seed, step, (mb0+m)*n+s, in)
				t.teach.target(in, tgt)
				var ls float64
				for j := 0; j < h; j++ {
					d := y[s*h+j] - tgt[j]
					ls += float64(d) * float64(d)
					gy[s*h+j] = float32(scale * d)
				}
				loss += ls / float64(h)
			}
			v, ok := toFixed(loss / float64(cfg.Batch))
			if !ok {
				t.clamped++
			}
			t.acc[len(t.acc)-1] += v
		} else if err := t.recv(next, tagGrad, gy); err != nil {
			return fmt.Errorf("receive gradients from rank %d: %w", next, err)
		}
		clear(t.grads)
		for k := L - 1; k >= 0; k-- {
			var dst []float32
			if k > 0 || !firstStage {
				dst = gx
			}
			if k == 0 && dst != nil && t.mlog != nil {
				// The gradient for the previous stage gets this
				// microbatch's own buffer, free once last step's copy is.
				if err := t.mlog.fence(&t.mlog.grad[m]); err != nil {
					return err
				}
				dst = t.sentGrad[m]
			}
			t.layers[k].backward(act(m, k), act(m, k+1), gy, dst, n, cfg.Threads)
			gy, gx = dst, gy
		}
		if io.sendGrad {
			if err := t.send(prev, tagGrad, gy); err != nil {
				return fmt.Errorf("send gradients to rank %d: %w", prev, err)
			}
		}
		if !firstStage && t.logsTo(t.pipe-1) {
			if err := t.mlog.sent(&t.mlog.grad[m], gradStream(prev), step, m, gy); err != nil {
				return err
			}
		}
		// addFixed runs on one goroutine and leaves the other cores idle:
		// announce the window so that the snapshot copy runs there rather
		// than competing with the parallel compute. The price: the save
		// of the previous step commits only now, so a rank lost earlier
		// in this step resumes one step further back (still at most one
		// step of work lost).
		if t.hint != nil && t.serial > 0 {
			t.hint.Hint(t.serial)
		}
		t0 := time.Now()
		t.clamped += addFixed(t.acc, t.grads[:t.nParams])
		t.serial = time.Since(t0)
	}
	return nil
}

// logsTo says whether this stage logs what it sends to stage to: under
// --log-messages, when to is in another of --log-groups' groups.
func (t *trainer) logsTo(to int) bool {
	if t.mlog == nil {
		return false
	}
	return t.groups[to] != t.groups[t.pipe]
}

// recv receives a message from a neighbouring stage. The wait is a
// pipeline bubble: the bubble-time logger copies there. The message
// buffers are not the state, so a flush's step-back may run meanwhile (a
// stage that finished its step waits here for the next one's input while
// a lost neighbour keeps it from coming). On an error the gate stays
// released: the step is over.
func (t *trainer) recv(from, tag int, v []float32) error {
	if t.mlog != nil {
		t.mlog.bubbleStart()
	}
	t.unlockGate()
	if err := t.world.RecvF32(from, tag, v); err != nil {
		return err
	}
	t.lockGate()
	return nil
}

// send sends a message to a neighbouring stage, the gate released as in
// recv (a blocking send waits for its receiver).
func (t *trainer) send(to, tag int, v []float32) error {
	t.unlockGate()
	if err := t.world.SendF32(to, tag, v); err != nil {
		return err
	}
	t.lockGate()
	return nil
}

// update turns the reduced fixed-point gradient into float32 and applies the
// optimizer: to everything, or under ZeRO-1 to this rank's shard followed by
// an all-gather of the parameters.
func (t *trainer) update() error {
	t.state[1]++
	t.opt.prepare(t.state[1])
	lo, hi := 0, len(t.params)
	if t.cfg.Zero1 {
		lo, hi = t.dpIdx*t.shardLen, (t.dpIdx+1)*t.shardLen
	}
	p, g := t.params[lo:hi], t.grads[lo:hi]
	if t.stepGrad != nil {
		// AOR: every shard's gradient, for the replicas of the other
		// ranks' optimizer shards; this rank's part is the same values.
		n := len(t.stepGrad)
		parallelFor(n, t.cfg.Threads, 2, func(a, b int) { fromFixed(t.acc[a:b], t.stepGrad[a:b]) })
		g = t.stepGrad[lo:hi]
	} else {
		if t.undoGrad != nil {
			g = t.undoGrad
		}
		fromFixed(t.acc[lo:hi], g)
	}
	if t.undo != nil {
		if err := t.undo.apply(t.opt, p, g, t.cfg.Threads, t.before); err != nil {
			return t.rollback(p, fmt.Errorf("optimizer update: %w", err))
		}
	} else {
		parallelFor(hi-lo, t.cfg.Threads, 16, func(a, b int) { t.opt.update(p, g, a, b) })
	}
	if !t.cfg.Zero1 || t.cfg.DP == 1 {
		t.commitUndo()
		return nil
	}
	// The microbatch gradient buffer is spent now (under --undo the
	// step's gradient is in undoGrad); it becomes the all-gather's send
	// buffer (MPI forbids a send buffer inside the destination).
	send := t.grads[lo:hi]
	copy(send, p)
	// A communication phase like the all-reduce: background replication
	// keeps off the network meanwhile (paused), or learns it as a span of
	// the step (idle); unreported, its chunks competed with the gather.
	if t.comm != nil {
		t.comm.CommPhase(true, "parameter all-gather")
	}
	err := t.dpc.AllGatherF32(t.params, send)
	if t.comm != nil {
		t.comm.CommPhase(false, "")
	}
	if err != nil {
		if t.undo != nil {
			return t.rollback(p, fmt.Errorf("parameter all-gather: %w", err))
		}
		return fmt.Errorf("parameter all-gather: %w", err)
	}
	t.commitUndo()
	return nil
}

// every0 checks the flags against the job's every=0 (Interval): no
// snapshot on the step path, so the JIT flush is the only protection and
// needs --jit; without --undo a failure inside the update loses more, which
// rank 0 says once.
func (t *trainer) every0(s Snapshotter) error {
	iv, ok := s.(Interval)
	if !ok || iv.Every() != 0 {
		return nil
	}
	if !t.cfg.JIT {
		return errors.New("the job runs --reft=...,every=0 (no snapshot on the step path) and --jit=false: nothing would ever be saved; drop --jit=false, or launch without every=0")
	}
	if t.mlog != nil {
		return errors.New("--log-messages under every=0: a lost stage replays from its own snapshot, and every=0 takes none on the step path " +
			"(the logs would also never be truncated); drop --log-messages, or launch without every=0")
	}
	if !t.cfg.Undo {
		fmt.Fprintln(t.log, "every=0 without --undo: a failure while the survivors are inside the optimizer update leaves them no consistent step to flush "+
			"until the update ends (and none if it never does); add --undo (docs/UNDO.md)")
	} else {
		fmt.Fprintln(t.log, "every=0: no snapshot on the step path; the JIT flush saves the live state at a failure, undoing an update in progress (--undo)")
	}
	return nil
}

// before runs before each tensor's update under --undo: the test hooks
// (--fail-in-update, Options.beforeTensor), --hold-in-update, and a JIT
// flush's request to stop.
func (t *trainer) before(seg int) error {
	if t.beforeTensor != nil {
		if err := t.beforeTensor(seg); err != nil {
			return err
		}
	}
	step := t.state[0] + 1
	if c := &t.cfg; !t.resumed && step == c.HoldUpdateStep && seg == c.HoldUpdateTensor {
		t.note(fmt.Sprintf("hold-in-update: rank %d holds in step %d's update before tensor %d until a JIT flush interrupts it", t.rank, step, seg))
		select {
		case <-t.stop:
		case <-time.After(HoldMax):
			return fmt.Errorf("--hold-in-update %d:%d: no JIT flush interrupted the update within %v", step, seg, HoldMax)
		}
	}
	select {
	case <-t.stop:
		return fmt.Errorf("step %d, before tensor %d: %w", step, seg, ErrUpdateInterrupted)
	default:
		return nil
	}
}

func (t *trainer) commitUndo() {
	if t.undo != nil {
		t.undo.commit()
	}
}

// rollback undoes the interrupted update of p (this rank's optimizer
// range) and returns an *UndoneError wrapping cause.
func (t *trainer) rollback(p []float32, cause error) error {
	n := t.undo.undo(t.opt, p, t.cfg.Threads)
	t.state[1]--
	return &UndoneError{Step: t.state[0], Tensors: n, Err: cause}
}

// loss sums the step's loss over the job: the last stage's DP group reduced
// it with the gradients; one world reduction brings it to rank 0.
func (t *trainer) loss() (float64, error) {
	v := []int64{0}
	if t.pipe == t.cfg.PP-1 && t.dpIdx == 0 {
		v[0] = t.acc[len(t.acc)-1]
	}
	// A survivor whose peer died after the gradient all-reduce blocks
	// here: let a flush's step-back run meanwhile.
	t.unlockGate()
	err := t.world.AllReduceSumI64(v)
	t.lockGate()
	if err != nil {
		return 0, err
	}
	return float64(v[0]) / fixScale, nil
}

// hash is SHA-256 over all parameters in stage order, little-endian float32;
// each stage's first DP rank sends its parameters to rank 0.
func (t *trainer) hash() (string, error) {
	if t.dpIdx != 0 {
		return "", nil
	}
	if t.rank != 0 {
		return "", t.world.SendF32(0, tagParams, t.params[:t.nParams])
	}
	h := sha256.New()
	write := func(f []float32) {
		var b [4096]byte
		for len(f) > 0 {
			k := min(len(f), len(b)/4)
			for i := 0; i < k; i++ {
				binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f[i]))
			}
			h.Write(b[:4*k])
			f = f[k:]
		}
	}
	write(t.params[:t.nParams])
	for p := 1; p < t.cfg.PP; p++ {
		layers := (p+1)*t.cfg.Layers/t.cfg.PP - p*t.cfg.Layers/t.cfg.PP
		buf := make([]float32, layers*(t.width*t.width+t.width))
		if err := t.world.RecvF32(p*t.cfg.DP, tagParams, buf); err != nil {
			return "", fmt.Errorf("receive stage %d parameters: %w", p, err)
		}
		write(buf)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
