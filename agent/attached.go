package agent

import (
	"context"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/mesh"
	"github.com/reft-hpc/reft/agent/persist"
	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/agent/runrecord"
	"github.com/reft-hpc/reft/spank/spec"
	"github.com/reft-hpc/reft/tmpfs"
)

// attached is what the agent is given: Listen's Info, then the Attach*
// calls. The Server, its snapshot service, restorer, views and replicator
// share one. Every field is written before Serve (the Attach* contract)
// and only read after, so the parts read it from any goroutine without a
// lock; spec parses once, under its own Once. No method blocks but
// waitMesh, which waits at most gatherWait for peering to start.
type attached struct {
	info    Info
	store   *tmpfs.Store          // nil: snapshots disabled
	peering func() *proto.Peering // nil: no peering (snapshots disabled)
	gpu     func() *proto.GPU     // nil: no GPU section
	// persist is the persistent tier (agent/persist); nil: off.
	persist *persist.Persister
	// mesh is the job's agent mesh (AttachMesh); it returns nil while
	// peering starts or when it is off.
	mesh func() *mesh.Mesh
	// rec is the job's run record, reft run's channel (AttachRecord);
	// nil: none.
	rec *runrecord.Writer

	specOnce sync.Once
	jobSpec  spec.Spec
}

// AttachStore gives the server the job's snapshot store; call it before
// Serve. Without one, snapshot requests get a `disabled` error.
func (a *attached) AttachStore(st *tmpfs.Store) { a.store = st }

// AttachRecord sets the run record the server writes registrations,
// restores and (through its detector) failure verdicts to, for reft run.
// Call it before Serve.
func (a *attached) AttachRecord(w *runrecord.Writer) { a.rec = w }

// AttachPeering gives the status reply its peering section; call it
// before Serve.
func (a *attached) AttachPeering(f func() *proto.Peering) { a.peering = f }

// AttachGPU gives the status reply its GPU health section; call it before
// Serve.
func (a *attached) AttachGPU(f func() *proto.GPU) { a.gpu = f }

// AttachPersist gives the server the persistent tier; call it before
// Serve, after AttachStore. Without one, only the node-local store is used.
func (a *attached) AttachPersist(p *persist.Persister) { a.persist = p }

// AttachMesh gives the server the job's mesh (nil while it starts or when
// peering is off), for restores that read other agents' stores and for
// background replication. Call it before Serve.
func (a *attached) AttachMesh(f func() *mesh.Mesh) { a.mesh = f }

// record appends r to the run record; a failure is logged, not returned:
// the rank's request does not fail for it, reft run sees less.
func (a *attached) record(r runrecord.Record, log zerolog.Logger) {
	if err := a.rec.Write(r); err != nil {
		log.Warn().Err(err).Str("kind", r.Kind).Int("rank", r.Rank).Msg("reft run will not see this: the run record could not take it")
	}
}

// spec is the job's parsed SPEC (Info.Spec, normalized at start).
func (a *attached) spec() spec.Spec {
	a.specOnce.Do(func() {
		if sp, err := spec.Parse(a.info.Spec); err == nil {
			a.jobSpec = sp
		}
	})
	return a.jobSpec
}

func (a *attached) gpuStatus() *proto.GPU {
	if a.gpu == nil {
		return nil
	}
	return a.gpu()
}

func (a *attached) peeringStatus() *proto.Peering {
	if a.peering == nil {
		return nil
	}
	return a.peering()
}

// meshNow is the mesh if it runs, without waiting.
func (a *attached) meshNow() *mesh.Mesh {
	if a.mesh == nil {
		return nil
	}
	return a.mesh()
}

// waitMesh waits up to gatherWait for peering to start.
func (a *attached) waitMesh(ctx context.Context) *mesh.Mesh {
	if a.mesh == nil {
		return nil
	}
	deadline := time.Now().Add(gatherWait)
	for {
		if m := a.mesh(); m != nil {
			return m
		}
		if st := a.peeringStatus(); st != nil && st.State == proto.PeeringOff {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}
