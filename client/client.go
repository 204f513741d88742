// Package client is the Go library a training rank uses to snapshot its
// state into the node's reft-agent and to restore it after a restart. It
// speaks the local protocol of docs/PROTOCOL.md over the agent's Unix
// socket; bulk bytes go through arena files the agent names and the client
// maps. The package has no cgo of its own: hostmem/cuda, which registers
// the arenas with a CUDA runtime the process has loaded (dlopen, nothing
// linked), is its only cgo, and without cgo it does nothing. The caller
// supplies the rank's place in the job (FromEnv reads it from Slurm; a
// trainer may ask pmix instead).
//
//	c, err := client.Open(ctx, client.Options{Rank: r, World: n, Agree: allGather})
//	c.Register("weights", w, client.Replicated)
//	if step, ok, err := c.Restore(ctx); ok { ... resume after step ... }
//	h := c.Save(step) // returns at once; do not touch w until h.Wait
//	err = h.Wait(ctx)
//
// CUDA memory. Registered buffers are host memory ([]byte): the client
// copies them into the arena with memmove. A Go program whose state lives
// on a GPU stages it into registered host buffers first: allocate them
// pinned (cudaHostAlloc, or Go memory page-locked with hostmem/cuda's
// Runtime.Register), and after the optimizer's update, on a copy stream
// that waits for the update's event, cudaMemcpyAsync device to buffer;
// once that copy's event has completed, Save. The next update must not
// start before the copy has read the device memory (cudaStreamWaitEvent on
// the compute stream), and the buffers must not change before h.Wait (or
// h.Done). That is two copies: device to the pinned buffer (DMA), then the
// buffer to the arena (memmove). The client registers the arenas
// themselves with the CUDA runtime (Options.GPU), which a device-to-host
// copy straight into the arena needs, but this package does not hand a
// save's arena regions to the caller, so the one-copy path (device to
// arena) is the Python client's (reft.torch, client/python).
package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/spank/spec"
)

// Kind says how a buffer relates to the other ranks' buffers of the same
// name: the same bytes on every data-parallel replica, or this rank's part.
type Kind int

const (
	Replicated Kind = iota // identical on every replica (weights, optimizer state under plain DP)
	Sharded                // this rank's own part (ZeRO shards, tensor/pipeline parallel slices)
)

func (k Kind) String() string {
	switch k {
	case Replicated:
		return "replicated"
	case Sharded:
		return "sharded"
	}
	return "kind-" + strconv.Itoa(int(k))
}

// DefaultChunkSize is the copy chunk when Options.ChunkSize is 0.
const DefaultChunkSize = 4 << 20

// SocketEnv names the variable in which the Slurm plugin passes the agent's
// socket to every task of a reft step.
const SocketEnv = "REFT_AGENT_SOCKET"

// Options configure a Client.
type Options struct {
	Socket    string // agent socket; "": $REFT_AGENT_SOCKET
	Rank      int    // global rank, 0..World-1
	World     int    // ranks in the job; 0 counts as 1
	LocalRank int    // rank among the job's ranks on this node
	Layout    string // the job's parallel layout, recorded in manifests
	// ChunkSize is the copy granularity (bytes): the copier checks for the
	// end of an idle window between chunks. 0: DefaultChunkSize. It is
	// also asked of the agent as its checksum chunk.
	ChunkSize int64
	Workers   int // copy goroutines of a save; 0: 1, so the copy leaves the trainer its cores
	// RestoreWorkers are the copy goroutines of a restore; 0: GOMAXPROCS,
	// since the trainer waits for the restore and nothing else runs.
	RestoreWorkers int
	// Optional turns a missing REFT_AGENT_SOCKET into a disabled client
	// whose Save and Restore do nothing, instead of an error.
	Optional bool
	// Agree is the job-wide agreement on which step to restore: every rank
	// calls it with its own committed steps and it returns the steps that
	// every rank holds (Gather builds one from an all-gather). Restore needs
	// it when World > 1. Every rank must call Restore, as with any
	// collective. Restore calls it again after the copy, with other values,
	// so that no rank trains unless every rank restored: it must return
	// exactly the values that every rank passed (their intersection), as
	// Gather's does.
	Agree func(ctx context.Context, mine []int64) ([]int64, error)
	// Log receives the once-only notices (a disabled client) and the JIT
	// flush's lines. nil: stderr.
	Log func(msg string)
	// GPU registers the arenas this rank saves into with a GPU runtime,
	// so that device-to-host copies into them are DMA (arena.go). nil:
	// the CUDA runtime the process has loaded itself (hostmem/cuda),
	// registering on the device it uses; none in a process without CUDA.
	GPU HostRegistrar
	// JITWait is how long a flush after a peer failure notice
	// (WatchFailures) waits for the trainer to reach a consistent step
	// before it gives up; 0: DefaultJITWait.
	JITWait time.Duration
}

// FromEnv fills Rank, World and LocalRank from the variables every Slurm
// task gets (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID). Outside Slurm (none
// of them set) it describes a single process: rank 0 of 1.
func FromEnv() (Options, error) {
	keys := []string{"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"}
	var vals [3]int
	set := 0
	for i, k := range keys {
		v, ok := os.LookupEnv(k)
		if !ok {
			continue
		}
		set++
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return Options{}, fmt.Errorf("reft client: %s=%q is not a non-negative integer", k, v)
		}
		vals[i] = n
	}
	switch {
	case set == 0:
		return Options{World: 1}, nil
	case set < len(keys):
		return Options{}, fmt.Errorf("reft client: only some of %v are set; launch the ranks with srun", keys)
	}
	o := Options{Rank: vals[0], World: vals[1], LocalRank: vals[2]}
	if o.Rank >= o.World {
		return Options{}, fmt.Errorf("reft client: SLURM_PROCID=%d is not below SLURM_NTASKS=%d", o.Rank, o.World)
	}
	return o, nil
}

// Client is one rank's session with its node's agent. Its methods may be
// called from several goroutines; they take turns.
type Client struct {
	opt      Options
	disabled bool
	hello    proto.HelloReply

	conn *conn
	gate gate // idle windows announced by Hint

	mu      sync.Mutex // serializes the caller's operations
	bufs    []buffer
	frozen  bool                 // Save or Restore was called: no more Register
	layout  *proto.RegisterReply // nil until the agent has the registration
	maps    arenas
	last    *Handle // the newest save; later operations wait for it
	closed  bool
	noticed sync.Once

	jit jitState // JIT flush (jit.go)
	// degraded says what commit replies say of the node's protection
	// (degraded.go).
	degraded degradedNotice

	// every is the SPEC's snapshot interval from the hello reply (1 when
	// the spec says nothing); 0 (every=0): Save does not snapshot.
	every   int
	everyed sync.Once // the every=0 notice, once

	// logMu serializes the message log's requests with their copies
	// (msglog.go); never held while taking mu. logRegistered: the rank is
	// registered, so log requests need not take mu.
	logMu         sync.Mutex
	logRegistered atomic.Bool
	logMaps       logMaps // under logMu
}

type buffer struct {
	name string
	data []byte
	kind Kind
	aor  *proto.AOR // RegisterOptimizerState
}

// Open connects to the agent (Options.Socket, else $REFT_AGENT_SOCKET) and
// says hello. With Optional set and no socket it returns a disabled client.
func Open(ctx context.Context, opt Options) (*Client, error) {
	if opt.World == 0 {
		opt.World = 1
	}
	switch {
	case opt.World < 0:
		return nil, fmt.Errorf("reft client: World = %d must be at least 1", opt.World)
	case opt.Rank < 0 || opt.Rank >= opt.World:
		return nil, fmt.Errorf("reft client: Rank = %d must be in [0, World = %d)", opt.Rank, opt.World)
	case opt.LocalRank < 0:
		return nil, fmt.Errorf("reft client: LocalRank = %d must not be negative", opt.LocalRank)
	case opt.ChunkSize < 0:
		return nil, fmt.Errorf("reft client: ChunkSize = %d must not be negative", opt.ChunkSize)
	case opt.Workers < 0:
		return nil, fmt.Errorf("reft client: Workers = %d must not be negative", opt.Workers)
	case opt.RestoreWorkers < 0:
		return nil, fmt.Errorf("reft client: RestoreWorkers = %d must not be negative", opt.RestoreWorkers)
	}
	if opt.Workers == 0 {
		opt.Workers = 1
	}
	if opt.RestoreWorkers == 0 {
		opt.RestoreWorkers = runtime.GOMAXPROCS(0)
	}
	if opt.Log == nil {
		opt.Log = func(msg string) { fmt.Fprintln(os.Stderr, "reft:", msg) }
	}
	c := &Client{opt: opt, maps: newArenas(nil, opt.Log)}
	c.gate.init()
	c.jit.init()
	if c.opt.Socket == "" {
		c.opt.Socket = os.Getenv(SocketEnv)
	}
	if c.opt.Socket == "" {
		if !opt.Optional {
			return nil, errors.New("reft is not enabled for this step: " + SocketEnv +
				" is not set; run under srun --reft=... or set Options.Optional")
		}
		c.disabled = true
		return c, nil
	}
	cn, err := dial(ctx, c.opt.Socket)
	if err != nil {
		return nil, err
	}
	c.conn = cn
	if c.maps.gpu = opt.GPU; c.maps.gpu == nil {
		c.maps.gpu = defaultRegistrar()
	}
	hello := proto.Hello{Client: "reft-go/0.1", PID: os.Getpid(), Step: os.Getenv("REFT_STEP_ID"), Rank: opt.Rank}
	if err := cn.call(ctx, proto.THello, hello, &c.hello); err != nil {
		cn.close()
		return nil, fmt.Errorf("hello to the reft agent at %s: %w", c.opt.Socket, err)
	}
	if c.hello.Protocol != proto.Version {
		cn.close()
		return nil, fmt.Errorf("the reft agent at %s speaks protocol %d, this client %d: use a client from the agent's release (%s)",
			c.opt.Socket, c.hello.Protocol, proto.Version, c.hello.AgentVersion)
	}
	c.every = 1
	if sp, err := spec.Parse(c.hello.Spec); err == nil {
		c.every = sp.Every
	}
	return c, nil
}

// Every is the job's snapshot interval, the SPEC's every= (the agent's
// hello reply): 1 unless the SPEC sets it, and 1 for a disabled client.
// 0 (every=0): Save does not snapshot on the step path, and only the JIT
// flush (jit.go) saves, at a failure; see Save. Other values are for the
// trainer to follow: the client does not skip steps for them.
func (c *Client) Every() int {
	if c.disabled {
		return 1
	}
	return c.every
}

// Enabled reports whether the client talks to an agent; a disabled client
// (Optional, no socket) does nothing.
func (c *Client) Enabled() bool { return !c.disabled }

// Agent returns the agent's hello reply: job, node, spec, version, restart.
func (c *Client) Agent() proto.HelloReply { return c.hello }

// notice logs that the client is disabled, once.
func (c *Client) notice() {
	c.noticed.Do(func() {
		c.opt.Log(SocketEnv + " is not set: reft snapshots are off for this run; Save and Restore do nothing")
	})
}

// Register adds a buffer to the rank's state. Every buffer must be
// registered before the first Save or Restore; the client keeps buf and
// copies it on every Save and into it on every Restore.
func (c *Client) Register(name string, buf []byte, kind Kind) error {
	return c.add(buffer{name: name, data: buf, kind: kind})
}

// AOR describes a ZeRO-1 optimizer-state shard for
// [Client.RegisterOptimizerState]: the register request's "aor" object
// (docs/PROTOCOL.md). Optimizer is "momentum", "adam" or "adamw"; State
// "m" or "v"; Grad the name of the registered Replicated float32 buffer
// that holds the step's whole reduced gradient whenever Save is called;
// Shards every DP rank's ZeRO-1 cut of it as [element offset, element
// count], in DP order; Index this rank's DP index.
type AOR = proto.AOR

// RegisterOptimizerState registers buf, this rank's ZeRO-1 shard of one
// optimizer state tensor (float32), as Sharded state that an agent
// running --reft=...aor keeps an AOR replica of: the rank's ring
// predecessor brings the replica forward from the gradient buffer a.Grad
// at every save, with agent/aor's kernels, which the trainer must use for
// its own update (bit-identical state is the point). Every state the
// optimizer keeps (m; m and v) must be registered so, with the same a but
// State, and a.Grad registered too; the first Save or Restore checks the
// whole set (proto.CheckAOR) before asking the agent. An agent without
// AOR treats the buffer as any Sharded one.
func (c *Client) RegisterOptimizerState(name string, buf []byte, a AOR) error {
	a.Shards = append([][2]int64(nil), a.Shards...)
	return c.add(buffer{name: name, data: buf, kind: Sharded, aor: &a})
}

// AOR reports whether the agent's job runs with AOR (its SPEC, from the
// hello reply, has the aor mode): only then is registering the gradient
// and the optimizer state with RegisterOptimizerState worth the copy of
// the gradient at every save. False for a disabled client.
func (c *Client) AOR() bool {
	if c.disabled {
		return false
	}
	s, err := spec.Parse(c.hello.Spec)
	return err == nil && s.AOR
}

func (c *Client) add(nb buffer) error {
	name, kind := nb.name, nb.kind
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return fmt.Errorf("register %q: %w", name, errClosed)
	case c.frozen:
		return fmt.Errorf("register %q: buffers must be registered before the first Save or Restore", name)
	case name == "" || len(name) > 256:
		return fmt.Errorf("register %q: a buffer name must have 1 to 256 bytes", name)
	case kind != Replicated && kind != Sharded:
		return fmt.Errorf("register %q: kind %v is neither Replicated nor Sharded", name, kind)
	}
	for _, b := range c.bufs {
		if b.name == name {
			return fmt.Errorf("register %q: a buffer of that name is already registered", name)
		}
	}
	c.bufs = append(c.bufs, nb)
	return nil
}

// register sends the registration once, before the first request that
// needs it. The agent lays the arena out and preallocates it here, so a
// memory shortage shows at the first Save or Restore, not later.
func (c *Client) register(ctx context.Context) error {
	if c.layout != nil {
		return nil
	}
	if len(c.bufs) == 0 {
		return errors.New("no buffers registered: call Register before Save or Restore")
	}
	req := proto.Register{Rank: c.opt.Rank, World: c.opt.World, LocalRank: c.opt.LocalRank,
		Layout: c.opt.Layout, ChunkSize: c.opt.ChunkSize, Buffers: make([]proto.BufferSpec, len(c.bufs))}
	for i, b := range c.bufs {
		req.Buffers[i] = proto.BufferSpec{Name: b.name, Size: int64(len(b.data)), Replicated: b.kind == Replicated, AOR: b.aor}
	}
	// Checked here, not by Register: the set must be complete. Registration
	// stays open after a failed check, so the caller may add what is missing.
	if err := proto.CheckAOR(req.Buffers); err != nil {
		return fmt.Errorf("register: %w", err)
	}
	c.frozen = true
	var rep proto.RegisterReply
	if err := c.conn.call(ctx, proto.TRegister, req, &rep); err != nil {
		return fmt.Errorf("registering %d buffers: %w", len(c.bufs), err)
	}
	if err := c.sameBuffers(rep.Buffers); err != nil {
		return fmt.Errorf("register reply: %w", err)
	}
	c.layout = &rep
	return nil
}

// sameBuffers checks that the agent lists the registered buffers, in order.
func (c *Client) sameBuffers(bufs []proto.BufferPlace) error {
	if len(bufs) != len(c.bufs) {
		return fmt.Errorf("the agent lists %d buffers, %d are registered", len(bufs), len(c.bufs))
	}
	for i, b := range c.bufs {
		if w := bufs[i]; w.Name != b.name || w.Size != int64(len(b.data)) {
			return fmt.Errorf("the agent's buffer %d is %q of %d bytes, registered is %q of %d bytes",
				i, w.Name, w.Size, b.name, len(b.data))
		}
	}
	return nil
}

// layoutOf checks a save or restore reply against the registration and
// the protocol's rules, and returns the regions to copy and the sections
// to checksum. An agent from before regions sends neither: every buffer
// is then copied whole at its offset, as a section of its name.
func (c *Client) layoutOf(rep *proto.ArenaReply, save bool) ([]proto.Region, []proto.Section, error) {
	if err := c.sameBuffers(rep.Buffers); err != nil {
		return nil, nil, err
	}
	regions, sections := rep.Regions, rep.Sections
	switch {
	case regions == nil && sections == nil:
		for i, b := range c.bufs {
			n, off := int64(len(b.data)), rep.Buffers[i].Offset
			sections = append(sections, proto.Section{Name: b.name, ArenaOffset: off, Size: n})
			if n > 0 {
				regions = append(regions, proto.Region{Buffer: b.name, Size: n, ArenaOffset: off})
			}
		}
	case regions == nil || sections == nil:
		return nil, nil, fmt.Errorf("the agent sent %d regions and %d sections; it must send both or neither (docs/PROTOCOL.md, \"Regions and sections\")",
			len(regions), len(sections))
	}
	sizes := make(map[string]int64, len(c.bufs))
	for _, b := range c.bufs {
		sizes[b.name] = int64(len(b.data))
	}
	if err := proto.CheckLayout(sizes, rep.ArenaSize, sections, regions, save); err != nil {
		return nil, nil, fmt.Errorf("the agent's arena layout breaks the protocol: %w (use a client from the agent's release, %s)", err, c.hello.AgentVersion)
	}
	return regions, sections, nil
}

// Close finishes the outstanding save (copying the rest at once), closes
// the connection and unmaps the arenas.
func (c *Client) Close() error {
	c.stopWatch() // first: a flush in progress may need c.mu
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if c.disabled {
		return nil
	}
	var errs []error
	if err := c.finish(context.Background()); err != nil {
		errs = append(errs, fmt.Errorf("the last save: %w", err))
	}
	if err := c.conn.close(); err != nil {
		errs = append(errs, fmt.Errorf("closing the agent connection: %w", err))
	}
	if err := c.maps.unmapAll(); err != nil {
		errs = append(errs, err)
	}
	c.logMu.Lock()
	if err := c.logMaps.sweep(true); err != nil {
		errs = append(errs, err)
	}
	c.logMu.Unlock()
	return errors.Join(errs...)
}
