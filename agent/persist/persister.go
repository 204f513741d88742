package persist

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/spank/spec"
	"github.com/reft-hpc/reft/tmpfs"
)

// Options configures a Persister.
type Options struct {
	Dir       string // persist_dir from --reft, else [persist] dir
	Job, Node string
	UID       int // the job's user, who must own every directory
	// Restart is the job's SLURM_RESTART_COUNT: with the committing rank's
	// Slurm step (Committed) the epoch of each write (see Epoch).
	Restart            int
	Policy             spec.Persist
	FailuresPerNodeDay float64
	Store              *tmpfs.Store // the node-local store the generations come from
	Log                zerolog.Logger
	Now                func() time.Time // nil: time.Now
}

// Persister writes the node's generations to the persistent directory in
// the background, one write at a time, and reads them back for restores.
type Persister struct {
	opt    Options
	disk   *Store
	now    func() time.Time
	log    zerolog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	iv        *Interval
	closed    bool
	busy      bool
	busyStep  int64
	queue     []queued
	roundTime time.Duration // successful writes of the running round
	roundOK   bool          // a write of the round succeeded
	roundErr  bool          // a write of the round failed
	abandoned map[int]int64 // rank -> lowest step restored since its last write
	fenced    bool          // a write was refused as stale (said once)
	idle      *sync.Cond
}

// queued is a pinned generation waiting for the writer, and its epoch.
type queued struct {
	r *tmpfs.Reader
	e Epoch
}

// New opens <dir>/<job> and starts deciding. Policy must not be PersistOff.
func New(opt Options) (*Persister, error) {
	if opt.Policy.Kind == spec.PersistOff {
		return nil, errors.New("persist: policy is off; do not start a persister")
	}
	if opt.Store == nil {
		return nil, errors.New("persist: no node-local store to persist from")
	}
	disk, err := OpenStore(opt.Dir, opt.Job, opt.Node, opt.UID, Epoch{Restart: opt.Restart})
	if err != nil {
		return nil, err
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	p := &Persister{opt: opt, disk: disk, now: opt.Now, log: opt.Log, abandoned: map[int]int64{}}
	p.idle = sync.NewCond(&p.mu)
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.iv = NewInterval(opt.Policy, opt.FailuresPerNodeDay, opt.Log.With().Str("persist_dir", disk.Dir()).Logger())
	return p, nil
}

// Dir is the job's persistent directory, <dir>/<jobid>.
func (p *Persister) Dir() string { return p.disk.Dir() }

// Disk is the on-disk side, for listing and loading.
func (p *Persister) Disk() *Store { return p.disk }

// Registered tells the persister of a rank registered on this node.
func (p *Persister) Registered(rank, world int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.iv.Registered(rank, world)
}

// Restored tells the persister that rank resumed from step: persisted
// steps above it are an abandoned timeline. They are no longer listed (a
// later job-wide choice must not mix them with the new timeline's steps)
// and the rank's next write removes them.
func (p *Persister) Restored(rank int, step int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if old, ok := p.abandoned[rank]; !ok || step < old {
		p.abandoned[rank] = step
	}
}

// Committed is called after each local commit, with the Slurm step id of
// the rank that committed (its epoch, with the restart count). It never
// blocks on I/O: a due generation is pinned and queued for the background
// writer; while a write of another step runs, the generation is skipped.
func (p *Persister) Committed(g tmpfs.Generation, slurmStep int) {
	now := p.now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || !p.iv.Commit(g.Key.Rank, g.Step, now) {
		return
	}
	if p.busy && p.busyStep != g.Step {
		p.log.Debug().Str("event", "persist_skipped").Int("rank", g.Key.Rank).Int64("step", g.Step).Int64("writing_step", p.busyStep).
			Msg("persistent write skipped: the previous persistent write is still running")
		return
	}
	r, err := p.opt.Store.Open(g)
	if err != nil { // already released by a newer commit of the rank
		p.log.Debug().Str("event", "persist_skipped").Int("rank", g.Key.Rank).Int64("step", g.Step).Err(err).
			Msg("persistent write skipped: the generation left the store first")
		return
	}
	p.queue = append(p.queue, queued{r, Epoch{Restart: p.opt.Restart, Step: slurmStep}})
	if !p.busy {
		p.busy, p.busyStep, p.roundTime, p.roundOK, p.roundErr = true, g.Step, 0, false, false
		p.wg.Add(1)
		go p.run()
	}
}

// run writes the queue, then reports the round to the interval.
func (p *Persister) run() {
	defer p.wg.Done()
	for {
		p.mu.Lock()
		if len(p.queue) == 0 || p.ctx.Err() != nil {
			for _, q := range p.queue {
				q.r.Close()
			}
			p.queue = nil
			if retry := p.iv.Wrote(p.busyStep, p.roundTime, p.roundOK, p.roundErr, p.now()); retry > 0 {
				p.log.Warn().Str("event", "persist_retry").Int64("step", p.busyStep).Dur("retry_in", retry).
					Msgf("the first persistent write failed; trying again with the first generation committed after %s", retry)
			}
			p.busy = false
			p.idle.Broadcast()
			p.mu.Unlock()
			return
		}
		r, e := p.queue[0].r, p.queue[0].e
		p.queue = p.queue[1:]
		m := r.Manifest()
		above, ok := p.abandoned[m.Rank]
		if !ok {
			above = -1
		}
		p.mu.Unlock()

		t0 := p.now()
		w, err := p.disk.WriteIn(p.ctx, r, above, e)
		r.Close()
		d := p.now().Sub(t0)

		p.mu.Lock()
		switch {
		case err != nil && p.ctx.Err() != nil:
			p.log.Info().Str("event", "persist_stopped").Int("rank", m.Rank).Int64("step", m.Step).
				Msg("persistent write stopped: the agent is stopping; the temporary copy was removed")
		case errors.As(err, new(*FencedError)):
			// Not a failure to retry: this writer is stale. Said once.
			ev := p.log.Debug()
			if !p.fenced {
				p.fenced = true
				ev = p.log.Error()
			}
			ev.Str("event", "persist_fenced").Int("rank", m.Rank).Int64("step", m.Step).Err(err).
				Msg("persistent write refused: a newer run of the job has written this rank's checkpoints; this agent persists nothing more for it")
		case err != nil:
			p.roundErr = true
			p.log.Error().Str("event", "persist_failed").Int("rank", m.Rank).Int64("step", m.Step).Err(err).
				Msg("persistent write failed; the node-local snapshots are unaffected, the next due step is tried again")
		case w.Already:
			p.clearAbandoned(m.Rank, above)
			p.log.Debug().Str("event", "persisted").Int("rank", m.Rank).Int64("step", m.Step).Str("dir", w.Dir).
				Ints64("removed", w.Removed).Msg("persistent checkpoint already there, with the same bytes")
		default:
			p.roundTime += d
			p.roundOK = true
			p.clearAbandoned(m.Rank, above)
			p.log.Info().Str("event", "persisted").Int("rank", m.Rank).Int64("step", m.Step).Int64("bytes", w.Bytes).
				Dur("duration", d).Str("dir", w.Dir).Ints64("removed", w.Removed).Msg("persistent checkpoint written")
		}
		p.mu.Unlock()
	}
}

// clearAbandoned drops the rank's abandoned-timeline mark once a write
// with it has removed those steps, unless a newer restore moved it.
func (p *Persister) clearAbandoned(rank int, above int64) {
	if cur, ok := p.abandoned[rank]; ok && cur == above {
		delete(p.abandoned, rank)
	}
}

// Wait blocks until no write is running.
func (p *Persister) Wait() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.busy {
		p.idle.Wait()
	}
}

// Close stops a running write (its temporary copy is removed) and waits
// for it; the node-local store must stay open until Close returns.
func (p *Persister) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.cancel()
	p.wg.Wait()
}

// Generations lists rank's good persisted generations, newest first,
// without those of an abandoned timeline (see Restored).
func (p *Persister) Generations(rank int) ([]Generation, error) {
	gens, err := p.disk.List(rank)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	above, abandoned := p.abandoned[rank]
	p.mu.Unlock()
	out := gens[:0]
	for _, g := range gens {
		if !g.Bad && (!abandoned || g.Step <= above) {
			out = append(out, g)
		}
	}
	return out, nil
}

// Load reads generation g into a fresh generation of the node-local store,
// verifying every chunk as it reads, and commits it there, so that it is
// served like any local generation. rs is the rank's registration.
func (p *Persister) Load(g Generation, key tmpfs.Key, rs tmpfs.Spec) (tmpfs.Generation, error) {
	rs.Step, rs.ChunkSize = g.Step, g.Manifest.ChunkSize
	o, err := p.opt.Store.Begin(key, rs)
	if err != nil {
		return tmpfs.Generation{}, fmt.Errorf("persistent restore of rank %d step %d: a local arena: %w", key.Rank, g.Step, err)
	}
	if err := p.disk.Load(g, o.Buffer); err != nil {
		o.Abort()
		return tmpfs.Generation{}, err
	}
	for _, b := range g.Manifest.Buffers {
		if err := o.SetChecksums(b.Name, b.CRC32C); err != nil {
			o.Abort()
			return tmpfs.Generation{}, fmt.Errorf("persistent restore of rank %d step %d: %w", key.Rank, g.Step, err)
		}
	}
	lg, err := o.Commit()
	if err != nil {
		return tmpfs.Generation{}, fmt.Errorf("persistent restore of rank %d step %d: commit to the local store: %w", key.Rank, g.Step, err)
	}
	return lg, nil
}
