// Package aor holds the optimizer-state kernels of asynchronous optimizer
// recompute (REFT's AOR, --reft=aor). Under ZeRO-1 every DP rank owns a
// shard of the optimizer state; with aor, its ring predecessor in the
// sharding group keeps a replica of that shard on the host and brings it
// forward every step from the owner's gradient shard, which it already
// holds after the gradient all-reduce (agent/sg: the member at ring
// position p keeps the replica of position p+1).
//
// The replica is only useful if it is bit-identical to the owner's state,
// so the kernels here are the trainer's own: examples/trainer calls
// [Optimizer.Moments] for the state part of its update, and the agent calls
// the same function on the replica. Everything is float32 with every
// product rounded to float32 before the sum (Go's explicit conversions
// forbid fused multiply-adds), the expressions of PyTorch's SGD momentum,
// Adam and AdamW. The state update of these optimizers does not depend on
// the learning rate, weight decay or step count (bias correction only
// scales the parameter update), so the replica needs only the betas or the
// momentum factor and the gradient.
//
// The package is pure Go and imports nothing from reft.
package aor

import (
	"errors"
	"fmt"
	"math"
	"unsafe"
)

// Optimizer kinds, the names of the register message's "optimizer" field
// and of reft-train's --optimizer.
const (
	SGD      = "sgd"      // no state
	Momentum = "momentum" // m
	Adam     = "adam"     // m, v
	AdamW    = "adamw"    // m, v (decoupled weight decay touches only the parameters)
)

// State buffer names: the register message's "state" field.
const (
	StateM = "m" // momentum buffer (momentum), first moment (adam, adamw)
	StateV = "v" // second moment (adam, adamw)
)

// Kinds lists the optimizer kinds, in the order error messages name them.
var Kinds = []string{SGD, Momentum, Adam, AdamW}

// Optimizer is what the state update needs of an optimizer: its kind and
// its state coefficients. Beta1 and Beta2 are Adam's (PyTorch's defaults
// 0.9 and 0.999), Momentum is SGD momentum's factor.
type Optimizer struct {
	Kind     string
	Beta1    float32 // adam, adamw
	Beta2    float32 // adam, adamw
	Momentum float32 // momentum
}

// Validate checks the kind and the coefficients the kind uses; the others
// are ignored.
func (o Optimizer) Validate() error {
	inUnit := func(x float32) bool { return x >= 0 && x < 1 } // false for NaN
	switch o.Kind {
	case SGD:
	case Momentum:
		if !inUnit(o.Momentum) {
			return fmt.Errorf("momentum %v: must be in [0, 1)", o.Momentum)
		}
	case Adam, AdamW:
		if !inUnit(o.Beta1) {
			return fmt.Errorf("beta1 %v: must be in [0, 1) (PyTorch's default is 0.9)", o.Beta1)
		}
		if !inUnit(o.Beta2) {
			return fmt.Errorf("beta2 %v: must be in [0, 1) (PyTorch's default is 0.999)", o.Beta2)
		}
	default:
		return fmt.Errorf("optimizer %q: use one of %s, %s, %s, %s", o.Kind, SGD, Momentum, Adam, AdamW)
	}
	return nil
}

// StateBuffers names the state tensors the optimizer keeps per parameter:
// none for sgd, m for momentum, m and v for adam and adamw; nil for an
// unknown kind.
func (o Optimizer) StateBuffers() []string {
	switch o.Kind {
	case Momentum:
		return []string{StateM}
	case Adam, AdamW:
		return []string{StateM, StateV}
	}
	return nil
}

// HasState reports whether state is one of [Optimizer.StateBuffers].
func (o Optimizer) HasState(state string) bool {
	for _, s := range o.StateBuffers() {
		if s == state {
			return true
		}
	}
	return false
}

// Moments applies one step's state update for gradient g in place: m (and
// v) are updated element by element, m[i] and v[i] from g[i]. m and v must
// be at least as long as g (v may be nil for momentum; both for sgd). Any
// contiguous split of the range gives the same bytes, so callers may run
// pieces in parallel.
//
//	momentum:    m = mu*m + g
//	adam, adamw: m = b1*m + (1-b1)*g;  v = b2*v + ((1-b2)*g)*g
func (o Optimizer) Moments(m, v, g []float32) {
	switch o.Kind {
	case Momentum:
		momentumM(o.Momentum, m, g)
	case Adam, AdamW:
		adamM(o.Beta1, m, g)
		adamV(o.Beta2, v, g)
	}
}

// Update applies one step's update to a single state tensor, the one named
// state (StateM or StateV). The moments of these optimizers do not depend
// on each other, so updating m and v separately gives the same bytes as
// [Optimizer.Moments]; an agent holding them as separate buffers updates
// each on its own.
func (o Optimizer) Update(state string, s, g []float32) error {
	if !o.HasState(state) {
		return fmt.Errorf("optimizer %q has no state %q (it has %v)", o.Kind, state, o.StateBuffers())
	}
	if len(s) != len(g) {
		return fmt.Errorf("state %q has %d elements, the gradient %d", state, len(s), len(g))
	}
	switch {
	case o.Kind == Momentum:
		momentumM(o.Momentum, s, g)
	case state == StateM:
		adamM(o.Beta1, s, g)
	default:
		adamV(o.Beta2, s, g)
	}
	return nil
}

// The kernels. Every product is converted to float32 before it is added,
// exactly as the trainer wrote them before they moved here: changing an
// expression changes the bits of every replica and of the trainer.

func momentumM(mu float32, m, g []float32) {
	m = m[:len(g)]
	for i, gi := range g {
		m[i] = float32(mu*m[i]) + gi
	}
}

func adamM(b1 float32, m, g []float32) {
	m = m[:len(g)]
	for i, gi := range g {
		m[i] = float32(b1*m[i]) + float32((1-b1)*gi)
	}
}

func adamV(b2 float32, v, g []float32) {
	v = v[:len(g)]
	for i, gi := range g {
		v[i] = float32(b2*v[i]) + float32(float32((1-b2)*gi)*gi)
	}
}

// Float32s views b as float32 elements (the host's byte order, as a
// trainer's buffer registered as bytes), without copying. b must be
// 4-byte aligned and a multiple of 4 bytes long.
func Float32s(b []byte) ([]float32, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if len(b)%4 != 0 {
		return nil, fmt.Errorf("%d bytes is not a whole number of float32 elements", len(b))
	}
	if uintptr(unsafe.Pointer(&b[0]))%4 != 0 {
		return nil, errors.New("buffer is not 4-byte aligned")
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4), nil
}

// Equal reports whether a and b hold the same bits (NaNs compare by their
// bits, +0 and -0 differ): the test of a replica against its owner.
func Equal(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}
