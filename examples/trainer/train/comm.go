package train

import (
	"errors"
	"fmt"
	"sync"
)

// Comm is the little of MPI the trainer uses. Ranks are 0..Size()-1 within
// the communicator. Collectives must be called by every member in the same
// order.
type Comm interface {
	Rank() int
	Size() int
	// AllReduceSumI64 replaces buf with the element-wise sum over all
	// members. Integer sums are associative, so the result does not depend on
	// the reduction algorithm MPI picks.
	AllReduceSumI64(buf []int64) error
	// AllGatherF32 fills dst (Size()*len(src)) with every member's src in
	// rank order. dst and src must not overlap.
	AllGatherF32(dst, src []float32) error
	SendF32(to, tag int, v []float32) error
	RecvF32(from, tag int, v []float32) error
	Barrier() error
	// Sub makes the communicator of the group (ranks of this Comm, listed in
	// the new order) that the caller belongs to. It is collective over this
	// Comm: every member calls it exactly once, each with its own group;
	// groups must be disjoint.
	Sub(ranks []int) (Comm, error)
}

// ErrAborted is what blocked operations of an aborted LocalWorld return.
var ErrAborted = errors.New("in-process world aborted")

// LocalWorld is an in-process Comm implementation for tests: one goroutine
// per rank, collectives over shared memory, point-to-point over channels.
type LocalWorld struct {
	n      int
	abort  chan struct{}
	once   sync.Once
	links  [][]chan message // links[from][to]
	mu     sync.Mutex
	groups map[string]*group
}

type message struct {
	tag  int
	data []float32
}

// NewLocalWorld makes a world of n ranks.
func NewLocalWorld(n int) *LocalWorld {
	w := &LocalWorld{n: n, abort: make(chan struct{}), groups: map[string]*group{}}
	w.links = make([][]chan message, n)
	for i := range w.links {
		w.links[i] = make([]chan message, n)
		for j := range w.links[i] {
			w.links[i][j] = make(chan message, 1024)
		}
	}
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	w.groups[fmt.Sprint(all)] = newGroup(all)
	return w
}

// Abort makes every blocked and future operation fail with ErrAborted, as
// MPI tears down a job when one rank dies.
func (w *LocalWorld) Abort() { w.once.Do(func() { close(w.abort) }) }

// Comm returns rank's world communicator.
func (w *LocalWorld) Comm(rank int) Comm {
	all := make([]int, w.n)
	for i := range all {
		all[i] = i
	}
	return &localComm{w: w, g: w.group(all), rank: rank}
}

func (w *LocalWorld) group(worldRanks []int) *group {
	key := fmt.Sprint(worldRanks)
	w.mu.Lock()
	defer w.mu.Unlock()
	g := w.groups[key]
	if g == nil {
		g = newGroup(worldRanks)
		w.groups[key] = g
	}
	return g
}

// group is the shared state of one communicator's members.
type group struct {
	world []int // member i is world rank world[i]
	mu    sync.Mutex
	cur   *round
}

// round is one collective call: every member deposits a value, the last
// arrival closes done.
type round struct {
	vals []any
	n    int
	done chan struct{}
}

func newGroup(world []int) *group {
	return &group{world: world, cur: &round{vals: make([]any, len(world)), done: make(chan struct{})}}
}

type localComm struct {
	w    *LocalWorld
	g    *group
	rank int
}

func (c *localComm) Rank() int { return c.rank }
func (c *localComm) Size() int { return len(c.g.world) }

// exchange deposits v and returns every member's value once all arrived.
// Values must be private copies: the caller may reuse its buffers at once.
func (c *localComm) exchange(v any) ([]any, error) {
	select {
	case <-c.w.abort:
		return nil, ErrAborted
	default:
	}
	g := c.g
	g.mu.Lock()
	r := g.cur
	r.vals[c.rank] = v
	r.n++
	if r.n == len(g.world) {
		close(r.done)
		g.cur = &round{vals: make([]any, len(g.world)), done: make(chan struct{})}
	}
	g.mu.Unlock()
	select {
	case <-r.done:
		return r.vals, nil
	case <-c.w.abort:
		// A round that every member reached has its result, as an MPI
		// collective that completed before a peer died: select picks
		// at random when both are ready.
		select {
		case <-r.done:
			return r.vals, nil
		default:
		}
		return nil, ErrAborted
	}
}

func (c *localComm) AllReduceSumI64(buf []int64) error {
	vals, err := c.exchange(append([]int64(nil), buf...))
	if err != nil {
		return err
	}
	clear(buf)
	for _, v := range vals {
		o := v.([]int64)
		if len(o) != len(buf) {
			return fmt.Errorf("allreduce: length %d != %d", len(o), len(buf))
		}
		for i, x := range o {
			buf[i] += x
		}
	}
	return nil
}

func (c *localComm) AllGatherF32(dst, src []float32) error {
	if len(dst) != len(src)*c.Size() {
		return fmt.Errorf("allgather: dst has %d elements, want %d x %d", len(dst), c.Size(), len(src))
	}
	vals, err := c.exchange(append([]float32(nil), src...))
	if err != nil {
		return err
	}
	for i, v := range vals {
		o := v.([]float32)
		if len(o) != len(src) {
			return fmt.Errorf("allgather: rank %d sent %d elements, want %d", i, len(o), len(src))
		}
		copy(dst[i*len(src):], o)
	}
	return nil
}

func (c *localComm) Barrier() error {
	_, err := c.exchange(nil)
	return err
}

func (c *localComm) SendF32(to, tag int, v []float32) error {
	if to < 0 || to >= c.Size() {
		return fmt.Errorf("send to rank %d of %d", to, c.Size())
	}
	m := message{tag: tag, data: append([]float32(nil), v...)}
	select {
	case c.w.links[c.g.world[c.rank]][c.g.world[to]] <- m:
		return nil
	case <-c.w.abort:
		return ErrAborted
	}
}

func (c *localComm) RecvF32(from, tag int, v []float32) error {
	if from < 0 || from >= c.Size() {
		return fmt.Errorf("recv from rank %d of %d", from, c.Size())
	}
	select {
	case m := <-c.w.links[c.g.world[from]][c.g.world[c.rank]]:
		if m.tag != tag || len(m.data) != len(v) {
			return fmt.Errorf("recv from %d: got tag %d with %d elements, want tag %d with %d", from, m.tag, len(m.data), tag, len(v))
		}
		copy(v, m.data)
		return nil
	case <-c.w.abort:
		return ErrAborted
	}
}

func (c *localComm) Sub(ranks []int) (Comm, error) {
	me := -1
	world := make([]int, len(ranks))
	for i, r := range ranks {
		if r < 0 || r >= c.Size() {
			return nil, fmt.Errorf("sub-communicator: rank %d out of range 0..%d", r, c.Size()-1)
		}
		world[i] = c.g.world[r]
		if r == c.rank {
			me = i
		}
	}
	if me < 0 {
		return nil, fmt.Errorf("sub-communicator %v does not contain the caller (rank %d)", ranks, c.rank)
	}
	// Collective, like MPI_Comm_create.
	if err := c.Barrier(); err != nil {
		return nil, err
	}
	return &localComm{w: c.w, g: c.w.group(world), rank: me}, nil
}

// RunLocal runs the trainer on n in-process ranks and returns each rank's
// result and error. The first rank to fail aborts the world, as a dying MPI
// rank takes the job down. opts may be nil; it supplies per-rank Options
// (its Comm is overwritten).
func RunLocal(cfg Config, n int, opts func(rank int) Options) ([]*Result, []error) {
	w := NewLocalWorld(n)
	res := make([]*Result, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var o Options
			if opts != nil {
				o = opts(r)
			}
			o.Comm = w.Comm(r)
			res[r], errs[r] = Run(cfg, o)
			if errs[r] != nil {
				w.Abort()
			}
		}()
	}
	wg.Wait()
	return res, errs
}
