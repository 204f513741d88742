package proto

import (
	"fmt"
	"math"

	"github.com/reft-hpc/reft/agent/aor"
)

// AOR is the "aor" object of a register request's buffer: the buffer is
// this rank's ZeRO-1 shard of one optimizer state tensor, and the agent
// that keeps an AOR replica of it (the ring predecessor in the sharding
// group) brings the replica forward every step by applying the
// optimizer's state update to the owner's gradient shard. The gradient is
// the registered Replicated float32 buffer named Grad, which holds the
// step's whole reduced gradient when a save is taken; Shards cut it, in
// float32 elements, into every DP rank's ZeRO-1 shard in DP order, and
// Index says which of them is this rank's (this buffer then has
// 4*Shards[Index][1] bytes). Coefficients are float32 values (JSON numbers
// that round to them exactly): the replica is computed in float32 with
// agent/aor's kernels, those the trainer must use.
type AOR struct {
	Optimizer string     `json:"optimizer"`          // aor.Momentum, aor.Adam or aor.AdamW
	State     string     `json:"state"`              // aor.StateM or aor.StateV
	Beta1     float32    `json:"beta1,omitempty"`    // adam, adamw
	Beta2     float32    `json:"beta2,omitempty"`    // adam, adamw
	Momentum  float32    `json:"momentum,omitempty"` // momentum
	Grad      string     `json:"grad"`               // the registered gradient buffer
	Shards    [][2]int64 `json:"shards"`             // [elem_offset, elem_count] per DP rank, in DP order
	Index     int        `json:"index"`              // this rank's entry in Shards: its DP index
}

// Opt is the state update the replica runs.
func (a *AOR) Opt() aor.Optimizer {
	return aor.Optimizer{Kind: a.Optimizer, Beta1: a.Beta1, Beta2: a.Beta2, Momentum: a.Momentum}
}

// CheckAOR checks the "aor" objects of a registration's buffers, each
// against the others and the buffers it names. Errors name the buffer and
// the field, and say what to send instead. A registration without aor
// objects passes.
//
// Rules: the optimizer is momentum, adam or adamw with valid coefficients
// (aor.Optimizer.Validate); state is one the optimizer keeps; the buffer
// is not replicated (it is this rank's shard); grad names a registered,
// replicated buffer without aor of its own, a whole number of float32
// elements long; shards tile that buffer's elements from 0 to its end in
// order, and index picks one of them, whose count times 4 is the buffer's
// size. All aor buffers of one grad agree on optimizer, coefficients,
// shards and index, name each state at most once, and name every state
// the optimizer keeps (a replica of m without v restores nothing).
func CheckAOR(bufs []BufferSpec) error {
	byName := make(map[string]*BufferSpec, len(bufs))
	for i := range bufs {
		byName[bufs[i].Name] = &bufs[i]
	}
	first := map[string]*BufferSpec{}        // grad -> its first aor buffer
	states := map[string]map[string]string{} // grad -> state -> buffer
	for i := range bufs {
		b := &bufs[i]
		a := b.AOR
		if a == nil {
			continue
		}
		if err := checkAORBuffer(b, byName[a.Grad]); err != nil {
			return err
		}
		if f := first[a.Grad]; f == nil {
			first[a.Grad] = b
			states[a.Grad] = map[string]string{}
		} else if err := sameAOR(f, b); err != nil {
			return err
		}
		if other, dup := states[a.Grad][a.State]; dup {
			return fmt.Errorf("buffers %q and %q are both state %s of gradient %q: register each state once", other, b.Name, a.State, a.Grad)
		}
		states[a.Grad][a.State] = b.Name
	}
	return everyState(bufs, first, states)
}

// aorFail is an error about buffer b's aor object.
func aorFail(b *BufferSpec, format string, args ...any) error {
	return fmt.Errorf("buffer %q: aor."+format, append([]any{b.Name}, args...)...)
}

// checkAORBuffer checks one aor buffer b on its own: its optimizer and
// state, that it is a shard, its gradient g (nil: not registered), and
// its cut of g.
func checkAORBuffer(b *BufferSpec, g *BufferSpec) error {
	a := b.AOR
	opt := a.Opt()
	if opt.Kind == aor.SGD {
		return aorFail(b, "optimizer %q keeps no state: register no aor buffer for it", a.Optimizer)
	}
	if err := opt.Validate(); err != nil {
		return aorFail(b, "%v", err)
	}
	if !opt.HasState(a.State) {
		return aorFail(b, "state %q: optimizer %s keeps %v", a.State, a.Optimizer, opt.StateBuffers())
	}
	if b.Replicated {
		return fmt.Errorf("buffer %q: an aor buffer is this rank's ZeRO-1 shard: register it with replicated false", b.Name)
	}
	switch {
	case a.Grad == "":
		return aorFail(b, "grad is empty: name the registered float32 gradient buffer")
	case g == nil:
		return aorFail(b, "grad %q is not a registered buffer: register the gradient (replicated) in the same request", a.Grad)
	case g.AOR != nil:
		return aorFail(b, "grad %q is itself an aor buffer: name the gradient buffer", a.Grad)
	case !g.Replicated:
		return aorFail(b, "grad %q is not replicated: the step's reduced gradient is the same on every DP rank; register it replicated", a.Grad)
	case g.Size%4 != 0:
		return aorFail(b, "grad %q has %d bytes, not a whole number of float32 elements", a.Grad, g.Size)
	case len(a.Shards) == 0:
		return aorFail(b, "shards is empty: give [elem_offset, elem_count] of every DP rank's ZeRO-1 shard of %q, in DP order", a.Grad)
	}
	return checkShards(b, g)
}

// checkShards: b's shards tile its gradient g's elements in DP order,
// and its index picks the shard b is the size of.
func checkShards(b, g *BufferSpec) error {
	a := b.AOR
	next := int64(0)
	for k, sh := range a.Shards {
		switch {
		case sh[1] < 0:
			return aorFail(b, "shards[%d] = %v: negative element count", k, sh)
		case sh[0] != next:
			return aorFail(b, "shards[%d] = %v starts at element %d, want %d: shards must tile %q in DP order, each starting where the previous ends",
				k, sh, sh[0], next, a.Grad)
		case sh[1] > math.MaxInt64/4-next:
			return aorFail(b, "shards[%d] = %v: too large", k, sh)
		}
		next += sh[1]
	}
	if 4*next != g.Size {
		return aorFail(b, "shards cover %d elements (%d bytes), grad %q has %d bytes: they must tile it to its end", next, 4*next, a.Grad, g.Size)
	}
	if a.Index < 0 || a.Index >= len(a.Shards) {
		return aorFail(b, "index %d: must be this rank's DP index, in [0, %d)", a.Index, len(a.Shards))
	}
	if want := 4 * a.Shards[a.Index][1]; b.Size != want {
		return fmt.Errorf("buffer %q has %d bytes, its aor shard (shards[%d] = %v) %d elements: register exactly this rank's shard, %d bytes",
			b.Name, b.Size, a.Index, a.Shards[a.Index], a.Shards[a.Index][1], want)
	}
	return nil
}

// everyState: each gradient's aor buffers name every state its optimizer
// keeps (a replica of m without v restores nothing). Checked in
// registration order, for a stable message.
func everyState(bufs []BufferSpec, first map[string]*BufferSpec, states map[string]map[string]string) error {
	for i := range bufs {
		f := &bufs[i]
		if f.AOR == nil || first[f.AOR.Grad] != f {
			continue
		}
		for _, st := range f.AOR.Opt().StateBuffers() {
			if _, ok := states[f.AOR.Grad][st]; !ok {
				return fmt.Errorf("buffer %q: %s state %s of gradient %q is not registered with aor: register every state the optimizer keeps (%v)",
					f.Name, f.AOR.Optimizer, st, f.AOR.Grad, f.AOR.Opt().StateBuffers())
			}
		}
	}
	return nil
}

// sameAOR checks that two aor buffers of one gradient describe the same
// optimizer and cut.
func sameAOR(f, b *BufferSpec) error {
	x, y := f.AOR, b.AOR
	diff := func(field string, fv, bv any) error {
		return fmt.Errorf("buffers %q and %q share grad %q but differ in aor.%s (%v, %v): every state of one optimizer must carry the same %s",
			f.Name, b.Name, x.Grad, field, fv, bv, field)
	}
	switch {
	case x.Optimizer != y.Optimizer:
		return diff("optimizer", x.Optimizer, y.Optimizer)
	case x.Beta1 != y.Beta1:
		return diff("beta1", x.Beta1, y.Beta1)
	case x.Beta2 != y.Beta2:
		return diff("beta2", x.Beta2, y.Beta2)
	case x.Momentum != y.Momentum:
		return diff("momentum", x.Momentum, y.Momentum)
	case x.Index != y.Index:
		return diff("index", x.Index, y.Index)
	case fmt.Sprint(x.Shards) != fmt.Sprint(y.Shards):
		return diff("shards", x.Shards, y.Shards)
	}
	return nil
}
