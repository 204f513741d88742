package train

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/reft-hpc/reft/agent/aor"
)

// Snapshotter is what the trainer needs from the reft client. Buffers are
// registered once, before the first Save, as byte views over live training
// state; the client reads them during Save until the Waiter returns.
type Snapshotter interface {
	// Register adds a buffer. replicated: identical on every rank of the
	// caller's DP group (parameters); otherwise unique to this rank (ZeRO-1
	// optimizer shards).
	Register(name string, buf []byte, replicated bool) error
	// Save starts snapshotting every registered buffer as generation step and
	// returns at once. The caller must not modify the buffers until Wait
	// returns. A Save while the previous one is copying waits for it first.
	Save(step int64) (Waiter, error)
	// Restore fills every registered buffer from the newest generation that
	// is restorable for the whole job and returns it; ok is false when there
	// is none.
	Restore() (step int64, ok bool, err error)
	Close() error
}

// Hinter is an optional method of a Snapshotter: the trainer announces a
// window of about d from now in which it leaves cores idle, so that a
// background copy can run there instead of slowing the compute. A
// snapshotter that has had a hint may hold its copy for such windows; Wait
// must still finish it.
type Hinter interface {
	Hint(d time.Duration)
}

// CommPhaser is an optional method of a Snapshotter: the trainer says when
// it enters (true) and leaves (false) a communication phase, its gradient
// all-reduce, so that a backend that copies snapshots over the network in
// the background (reft's replication of unreplicated buffers) keeps out of
// its way, and so that a hang verdict can say which collective a rank
// waited in (op names it on entry, "" on exit). It is called twice a step
// and must not block.
type CommPhaser interface {
	CommPhase(active bool, op string)
}

// AORSnapshotter is an optional interface of a Snapshotter whose backend
// keeps AOR replicas of ZeRO-1 optimizer shards (reft with --reft=...aor).
// When AOR reports true, a ZeRO-1 trainer registers the step's whole
// reduced gradient as a replicated float32 buffer and its optimizer
// shards with RegisterOptimizerState, so that the rank's ring predecessor
// can bring a replica of them forward from the gradient at every save.
type AORSnapshotter interface {
	AOR() bool
	// RegisterOptimizerState registers buf, this rank's shard of one
	// optimizer state tensor, as unique to this rank, with st.
	RegisterOptimizerState(name string, buf []byte, st OptimizerState) error
}

// Consistency is an optional interface of a Snapshotter that saves the
// newest consistent step at once when a failure is detected (reft's JIT
// flush): the trainer declares Consistent(step) once its buffers hold the
// whole state of step, after the optimizer update, and Updating() before it
// changes them again (which may wait while such a save copies them).
type Consistency interface {
	Consistent(step int64)
	Updating()
}

// UpdateInterrupter is a snapshotter whose JIT flush can stop an optimizer
// update in progress (client.Client.SetUpdateInterrupt): under --undo the
// trainer gives it a function that makes the update stop at its next
// tensor, undo the applied part and declare the previous step consistent.
type UpdateInterrupter interface {
	SetUpdateInterrupt(fn func())
}

// Interval is a snapshotter that knows the job's snapshot interval (the
// SPEC's every=); 0 means no snapshot on the step path (every=0): Save
// keeps nothing and only the JIT flush saves, at a failure.
type Interval interface {
	Every() int
}

// LocalRestorer is an optional interface of a Snapshotter that restores
// one of this rank's own generations, without Restore's agreement on a step
// every rank holds. Under --log-messages the trainer restores with it: the
// ranks list their steps, choose the step to go on from (replay.go,
// replayTarget), each restores that step or its newest before it, and the
// ones behind replay from their neighbours' message logs. Neither method is
// collective; call them after every Register.
type LocalRestorer interface {
	// LocalSteps lists the steps of this rank's generations, ascending.
	LocalSteps() ([]int64, error)
	// RestoreLocal fills the registered buffers from this rank's
	// generation of step; an error wrapping ErrCorruptGeneration when its
	// bytes fail their checksum (the trainer then tries an older one).
	RestoreLocal(step int64) error
}

// ErrCorruptGeneration is a LocalRestorer's error for a generation whose
// bytes fail their checksum.
var ErrCorruptGeneration = errors.New("the generation failed its checksum")

// OptimizerState is what an AOR replica of a ZeRO-1 optimizer shard needs
// (the register message's "aor" object, docs/PROTOCOL.md).
type OptimizerState struct {
	Optimizer aor.Optimizer
	State     string     // aor.StateM or aor.StateV
	Grad      string     // the registered gradient buffer
	Shards    [][2]int64 // every DP rank's [element offset, element count] of Grad, in DP order
	Index     int        // this rank's DP index
}

// Waiter reports the end of one Save.
type Waiter interface {
	Wait() error
}

// MemStore is an in-memory Snapshotter backend for tests: it keeps every
// rank's copy of every generation, as if no node ever failed. A generation
// is restorable once all ranks have committed it.
type MemStore struct {
	world int
	aor   bool // snapshotters report AOR
	mu    sync.Mutex
	gens  map[int64]map[int]map[string][]byte
	opt   map[int]map[string]OptimizerState // rank -> buffer -> RegisterOptimizerState's st
}

// NewMemStore makes a store for a job of world ranks.
func NewMemStore(world int) *MemStore {
	return &MemStore{world: world, gens: map[int64]map[int]map[string][]byte{}, opt: map[int]map[string]OptimizerState{}}
}

// EnableAOR makes the store's snapshotters report AOR, as reft's client
// does in a job whose SPEC has aor. Call it before the ranks start.
func (s *MemStore) EnableAOR() { s.aor = true }

// OptimizerStates returns what rank registered with RegisterOptimizerState,
// by buffer name.
func (s *MemStore) OptimizerStates(rank int) map[string]OptimizerState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opt[rank]
}

// Generation returns a copy of rank's buffers of generation step, by name;
// nil when the rank has not saved it.
func (s *MemStore) Generation(step int64, rank int) map[string][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.gens[step][rank]
	if g == nil {
		return nil
	}
	out := make(map[string][]byte, len(g))
	for k, v := range g {
		out[k] = append([]byte(nil), v...)
	}
	return out
}

// Rank returns rank's Snapshotter over the store.
func (s *MemStore) Rank(rank int) Snapshotter { return &memSnap{store: s, rank: rank} }

// Generations lists the restorable generations, oldest first.
func (s *MemStore) Generations() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int64
	for step, ranks := range s.gens {
		if len(ranks) == s.world {
			out = append(out, step)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// Lose drops rank's generations newer than keep, as the loss of its node
// does when only the peer copy of generation keep (or none, keep 0)
// survives elsewhere.
func (s *MemStore) Lose(rank int, keep int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for step, ranks := range s.gens {
		if step > keep {
			delete(ranks, rank)
		}
	}
}

type memBuf struct {
	name       string
	buf        []byte
	replicated bool
}

type memSnap struct {
	store   *MemStore
	rank    int
	bufs    []memBuf
	saved   bool
	pending *memWait

	mu         sync.Mutex // Consistency's state; Flush may come from another goroutine
	declared   bool
	consistent int64
	updating   bool
}

// Consistent records that the buffers hold step (Consistency).
func (m *memSnap) Consistent(step int64) {
	m.mu.Lock()
	m.declared, m.consistent, m.updating = true, step, false
	m.mu.Unlock()
}

// Updating records that the buffers are about to change (Consistency).
func (m *memSnap) Updating() {
	m.mu.Lock()
	m.updating = true
	m.mu.Unlock()
}

// Flush saves the consistent step, as reft's JIT flush does after a
// failure, and returns it; ok is false when there is none (nothing
// declared, or the trainer was updating). Call it once the rank's trainer
// has stopped.
func (m *memSnap) Flush() (step int64, ok bool, err error) {
	m.mu.Lock()
	step, ok = m.consistent, m.declared && !m.updating
	m.mu.Unlock()
	if !ok {
		return 0, false, nil
	}
	w, err := m.Save(step)
	if err != nil {
		return 0, false, err
	}
	return step, true, w.Wait()
}

type memWait struct {
	done chan struct{}
}

func (w *memWait) Wait() error { <-w.done; return nil }

func (m *memSnap) AOR() bool { return m.store.aor }

func (m *memSnap) RegisterOptimizerState(name string, buf []byte, st OptimizerState) error {
	if err := m.Register(name, buf, false); err != nil {
		return err
	}
	m.store.mu.Lock()
	defer m.store.mu.Unlock()
	if m.store.opt[m.rank] == nil {
		m.store.opt[m.rank] = map[string]OptimizerState{}
	}
	m.store.opt[m.rank][name] = st
	return nil
}

func (m *memSnap) Register(name string, buf []byte, replicated bool) error {
	bufs, err := register(m.bufs, m.saved, name, buf, replicated)
	m.bufs = bufs
	return err
}

// register is Snapshotter.Register's checks for the in-process
// snapshotters: bufs with the buffer added, or why it cannot be.
func register(bufs []memBuf, saved bool, name string, buf []byte, replicated bool) ([]memBuf, error) {
	if saved {
		return bufs, fmt.Errorf("register %q: registering after the first save", name)
	}
	if len(buf) == 0 {
		return bufs, fmt.Errorf("register %q: empty buffer", name)
	}
	for _, b := range bufs {
		if b.name == name {
			return bufs, fmt.Errorf("register %q: already registered", name)
		}
	}
	return append(bufs, memBuf{name, buf, replicated}), nil
}

// Save copies in a goroutine, like the real client's background copy, so the
// trainer's Wait ordering is exercised (and checked by the race detector).
func (m *memSnap) Save(step int64) (Waiter, error) {
	if len(m.bufs) == 0 {
		return nil, errors.New("save: nothing registered")
	}
	if m.pending != nil {
		m.pending.Wait()
	}
	m.saved = true
	w := &memWait{done: make(chan struct{})}
	m.pending = w
	bufs := m.bufs
	go func() {
		defer close(w.done)
		g := make(map[string][]byte, len(bufs))
		for _, b := range bufs {
			g[b.name] = append([]byte(nil), b.buf...)
		}
		m.store.mu.Lock()
		defer m.store.mu.Unlock()
		if m.store.gens[step] == nil {
			m.store.gens[step] = map[int]map[string][]byte{}
		}
		m.store.gens[step][m.rank] = g
	}()
	return w, nil
}

func (m *memSnap) Restore() (int64, bool, error) {
	gens := m.store.Generations()
	if len(gens) == 0 {
		return 0, false, nil
	}
	step := gens[len(gens)-1]
	return step, true, m.restore(step)
}

// restore fills the registered buffers from this rank's generation step.
func (m *memSnap) restore(step int64) error {
	m.store.mu.Lock()
	defer m.store.mu.Unlock()
	g := m.store.gens[step][m.rank]
	for _, b := range m.bufs {
		src, ok := g[b.name]
		if !ok {
			return fmt.Errorf("restore generation %d: rank %d has no buffer %q", step, m.rank, b.name)
		}
		if len(src) != len(b.buf) {
			return fmt.Errorf("restore generation %d: buffer %q has %d bytes, registered %d", step, b.name, len(src), len(b.buf))
		}
		copy(b.buf, src)
	}
	return nil
}

// LocalSteps lists this rank's generations (LocalRestorer).
func (m *memSnap) LocalSteps() ([]int64, error) {
	m.store.mu.Lock()
	var steps []int64
	for st, ranks := range m.store.gens {
		if _, has := ranks[m.rank]; has {
			steps = append(steps, st)
		}
	}
	m.store.mu.Unlock()
	slices.Sort(steps)
	return steps, nil
}

// RestoreLocal restores this rank's generation of step (LocalRestorer).
func (m *memSnap) RestoreLocal(step int64) error { return m.restore(step) }

func (m *memSnap) Close() error {
	if m.pending != nil {
		return m.pending.Wait()
	}
	return nil
}
