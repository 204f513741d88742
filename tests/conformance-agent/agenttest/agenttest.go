// Package agenttest runs a real reft agent server over a fresh temporary
// snapshot store inside the calling process: for the client's tests, its
// conformance harness and the conformance-agent command, which must all
// see the same agent.
package agenttest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/agent"
	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/hostmem"
	"github.com/reft-hpc/reft/tmpfs"
)

// Options configure an Agent.
type Options struct {
	Job string // Slurm job id; "": 4242
	// Dir is where the temporary directory (socket and store) is made;
	// "": /dev/shm when writable, so arenas are in memory as on a node,
	// else the system's temp directory.
	Dir string
	Log zerolog.Logger
	// Layout is the agent's arena layout: "" (its own) or a test layout
	// (agent.Server.SetTestLayout: "scatter" splits every buffer into
	// regions in permuted order), for a vectors scenario's "agent".
	Layout string
	// Spec is the normalized --reft SPEC the agent reports in its hello
	// and status replies; "": "arc".
	Spec string
	// DegradedGrace is agent.Info.DegradedGrace: how long the protection
	// must have fallen short before commit replies say so (0: the
	// agent's default). This agent has no peering, so under a SPEC that
	// protects across nodes it is always short.
	DegradedGrace time.Duration
	// MemoryBudget is agent.Info.MemoryBudget, which the message log's
	// per-rank cap is derived from (0: none, so every log append is over
	// the cap). The store's arenas are not capped by it here.
	MemoryBudget uint64
	// StoreBudget, when positive, charges the store's arenas to a
	// hostmem budget of that many bytes, as a node's agent does (the
	// message log's cap then derives from it).
	StoreBudget int64
}

// Agent is a running agent server and its store.
type Agent struct {
	Socket string // the agent's Unix socket
	Dir    string // temporary directory, removed by Close
	Store  *tmpfs.Store

	srv    *agent.Server
	cancel context.CancelFunc
	done   chan error
}

// DefaultDir is /dev/shm when this process can write there, else the
// system's temp directory.
func DefaultDir() string {
	if unix.Access("/dev/shm", unix.W_OK) == nil {
		return "/dev/shm"
	}
	return os.TempDir()
}

// Start makes a fresh temporary directory, opens a store in it and serves
// the agent's socket there until Close.
func Start(opt Options) (a *Agent, err error) {
	if opt.Job == "" {
		opt.Job = "4242"
	}
	if opt.Spec == "" {
		opt.Spec = "arc"
	}
	if opt.Dir == "" {
		opt.Dir = DefaultDir()
	}
	// A short name: a socket path must fit in 108 bytes.
	dir, err := os.MkdirTemp(opt.Dir, "reft-agent-")
	if err != nil {
		return nil, fmt.Errorf("agenttest: temporary directory: %w", err)
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return nil, fmt.Errorf("agenttest: %w", err)
	}
	a = &Agent{Socket: filepath.Join(dir, "agent.sock"), Dir: dir}
	made := a // a failed Start returns a nil a; its directory and store still go
	defer func() {
		if err != nil {
			made.Close()
		}
	}()
	if err := a.serve(opt); err != nil {
		return nil, err
	}
	return a, nil
}

// serve opens the store in a.Dir and serves the socket until Close.
func (a *Agent) serve(opt Options) (err error) {
	// No pinning: tests must not depend on RLIMIT_MEMLOCK.
	var budget *hostmem.Budget
	if opt.StoreBudget > 0 {
		if budget, err = hostmem.NewBudget(hostmem.BudgetConfig{Cap: hostmem.Cap{Bytes: opt.StoreBudget}}, nil); err != nil {
			return fmt.Errorf("agenttest: budget: %w", err)
		}
	}
	alloc, err := hostmem.NewAllocator(hostmem.Config{NoPin: true, Budget: budget, Log: opt.Log})
	if err != nil {
		return fmt.Errorf("agenttest: allocator: %w", err)
	}
	// Keep: 1 as the agent's own store (agent.Run), so clients see the same
	// retention as in a job.
	if a.Store, err = tmpfs.Open(tmpfs.Options{Root: filepath.Join(a.Dir, "store"), JobID: opt.Job, Keep: 1, Alloc: alloc, Log: opt.Log}); err != nil {
		return fmt.Errorf("agenttest: store: %w", err)
	}
	node, _ := os.Hostname()
	a.srv, err = agent.Listen(a.Socket, agent.Info{Job: opt.Job, Node: node, Spec: opt.Spec, Version: "agenttest",
		UID: os.Getuid(), StoreDir: a.Store.Dir(), DegradedGrace: opt.DegradedGrace, MemoryBudget: opt.MemoryBudget}, opt.Log)
	if err != nil {
		return fmt.Errorf("agenttest: %w", err)
	}
	if err := a.srv.SetTestLayout(opt.Layout); err != nil {
		return fmt.Errorf("agenttest: %w", err)
	}
	a.srv.AttachStore(a.Store)
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	a.done = make(chan error, 1)
	go func() { a.done <- a.srv.Serve(ctx) }()
	return nil
}

// Restart stops the agent as a node's agent stops (its server, then its
// store) and starts a new one with opt on the same directory, store and
// socket, as reft run's relaunch does on a surviving node: the new agent
// re-indexes the store and adopts the message logs. A client must open a
// new connection. On an error the agent is stopped; Close still cleans up.
func (a *Agent) Restart(opt Options) error {
	if opt.Job == "" {
		opt.Job = "4242"
	}
	if opt.Spec == "" {
		opt.Spec = "arc"
	}
	if err := a.stop(); err != nil {
		return err
	}
	return a.serve(opt)
}

// NotifyPeerFailure makes the agent tell its watching clients that node
// failed, as its mesh does when a peer's agent is lost (JIT flush tests).
func (a *Agent) NotifyPeerFailure(node, cause string) { a.srv.NotifyPeerFailure(node, cause) }

// Status is the agent's status reply (what the status request returns).
func (a *Agent) Status() proto.Status { return a.srv.Status() }

// Close stops the server, closes the store and removes the directory.
func (a *Agent) Close() error {
	err := a.stop()
	if rerr := os.RemoveAll(a.Dir); rerr != nil {
		err = errors.Join(err, fmt.Errorf("agenttest: %w", rerr))
	}
	return err
}

// stop ends the server, then closes the store; the directory stays.
func (a *Agent) stop() error {
	var errs []error
	if a.cancel != nil {
		a.cancel()
		if err := <-a.done; err != nil {
			errs = append(errs, fmt.Errorf("agenttest: serve: %w", err))
		}
		a.cancel = nil
	}
	if a.srv != nil {
		a.srv.Close()
		a.srv = nil
	}
	if a.Store != nil {
		if err := a.Store.Close(); err != nil {
			errs = append(errs, fmt.Errorf("agenttest: closing the store: %w", err))
		}
		a.Store = nil
	}
	return errors.Join(errs...)
}
