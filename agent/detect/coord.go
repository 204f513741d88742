package detect

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/event"
	"github.com/reft-hpc/reft/agent/peer"
	"github.com/reft-hpc/reft/agent/runrecord"
)

// EventFailure is the coordinator's log event for a published failure, the
// one `reft run` acts on; its fields are those of Failure, the failed node
// as failed_node (node is the logging agent's own) and latency_s.
const EventFailure = event.FailureDetected

// failureReply answers a failure frame.
type failureReply struct {
	Coordinator string `json:"coordinator"`
	Duplicate   bool   `json:"duplicate,omitempty"`
}

// Handlers is where the detector's request handlers go: the agent's
// *peer.Server.
type Handlers interface {
	Handle(t peer.Type, h peer.Handler) error
}

// Register installs the handlers of beat, probe and failure frames.
func (d *Detector) Register(s Handlers) error {
	hs := map[peer.Type]peer.Handler{
		peer.TBeat: func(_ context.Context, from string, p []byte) (any, error) {
			var req beatReq
			if err := decode(p, &req); err != nil {
				return nil, err
			}
			if req.Leaving {
				d.left(from)
			} else {
				d.alive(from, true)
			}
			return beatReply{Node: d.cfg.Self}, nil
		},
		peer.TProbe: func(ctx context.Context, from string, p []byte) (any, error) {
			var req probeReq
			if err := decode(p, &req); err != nil {
				return nil, err
			}
			d.alive(from, false)
			return d.conf.probe(ctx, req), nil
		},
		peer.TFailure: func(_ context.Context, from string, p []byte) (any, error) {
			var f Failure
			if err := decode(p, &f); err != nil {
				return nil, err
			}
			d.alive(from, false)
			return d.pub.received(f)
		},
	}
	for t, h := range hs {
		if err := s.Handle(t, h); err != nil {
			return err
		}
	}
	return nil
}

func decode(p []byte, v any) error {
	if err := json.Unmarshal(p, v); err != nil {
		return &peer.Error{Code: peer.CodeMalformed, Message: err.Error()}
	}
	return nil
}

// publisher is the detector's coordination and publication of
// verdicts: it hands a confirmed failure to the coordinator (report),
// publishes as the coordinator (coordinate: log, run record, OnFailure,
// then every other live agent in the background), and takes other
// agents' reports and publications (received). report runs on the
// goroutine of the suspicion or hang check that found the failure,
// received on the peer server's handler goroutine; the background
// publication joins the Detector's WaitGroup. The duplicate check and the
// book's update are one step under book.mu, so a failure is published
// once; the log, the record and OnFailure come after mu is released.
type publisher struct {
	*book
	cfg *Config // the Detector's, defaults filled; read-only
	log zerolog.Logger
	wg  *sync.WaitGroup
}

// report hands a confirmed failure to the coordinator: the first live
// node in index order that takes it (the failed node skipped), this one
// when it comes first or no other answers.
func (pb *publisher) report(ctx context.Context, f Failure) {
	pb.mu.Lock()
	live := pb.live()
	pb.mu.Unlock()
	for _, c := range live {
		if c == f.Node && f.Class != ClassHang {
			continue
		}
		if c == pb.cfg.Self {
			pb.coordinate(f)
			return
		}
		cctx, cancel := context.WithTimeout(ctx, pb.cfg.Confirm)
		var rep failureReply
		err := pb.cfg.Transport.Call(cctx, c, peer.TFailure, f, &rep)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			pb.log.Info().Str("event", "failure_reported").Str("failed_node", f.Node).Str("class", f.Class).
				Str("coordinator", rep.Coordinator).Bool("duplicate", rep.Duplicate).
				Msgf("reported the %s failure of %s to the coordinator %s", f.Class, f.Node, rep.Coordinator)
			return
		}
		pb.log.Warn().Str("event", "coordinator_unreachable").Str("coordinator", c).Err(err).
			Msgf("%s did not take the report of %s's failure; the next agent coordinates", c, f.Node)
	}
}

// same says whether f is a report of the failure p (already published):
// the same node, seen alive last before p was detected.
func same(p, f Failure) bool {
	if p.Node != f.Node || (p.Class == ClassHang) != (f.Class == ClassHang) || f.LastHeard.After(p.DetectedAt) {
		return false
	}
	if f.Class != ClassHang {
		return true
	}
	for _, r := range f.Ranks {
		if !slices.Contains(p.Ranks, r) {
			return false
		}
	}
	return true
}

// coordinate publishes f unless it is a duplicate: one failure_detected
// event in this agent's log, OnFailure, and the publication to every
// other live agent.
func (pb *publisher) coordinate(f Failure) (duplicate bool) {
	pb.mu.Lock()
	for _, p := range pb.published {
		if same(p, f) {
			pb.mu.Unlock()
			pb.log.Debug().Str("failed_node", f.Node).Str("reporter", f.Reporter).Msg("duplicate failure report dropped")
			return true
		}
	}
	f.Coordinator, f.Published = pb.cfg.Self, true
	pb.published = append(pb.published, f)
	if f.Class != ClassHang {
		if _, ok := pb.failed[f.Node]; !ok {
			pb.failed[f.Node] = f.DetectedAt
		}
	}
	var targets []string
	for _, n := range pb.live() {
		if n != pb.cfg.Self && !(n == f.Node && f.Class != ClassHang) {
			targets = append(targets, n)
		}
	}
	pb.mu.Unlock()

	ev := pb.log.Warn().Str("event", EventFailure).Str("failed_node", f.Node).Str("class", f.Class).
		Float64("latency_s", f.Latency().Seconds()).Time("last_heard", f.LastHeard).Time("detected_at", f.DetectedAt).
		Str("reporter", f.Reporter).Str("coordinator", f.Coordinator)
	if len(f.Ranks) > 0 {
		ev = ev.Ints("ranks", f.Ranks)
	}
	if len(f.ConfirmedBy) > 0 {
		ev = ev.Strs("confirmed_by", f.ConfirmedBy)
	}
	if f.Class != ClassHang {
		ev = ev.Bool("quorum", f.Quorum).Int("votes", f.Votes).Int("agents", f.Agents)
	}
	ev.Msg(f.Cause)
	if err := pb.cfg.Record.Failed(recordOf(f), time.Now()); err != nil {
		pb.log.Warn().Err(err).Str("failed_node", f.Node).Msg("reft run will not see this verdict: the run record could not take it")
	}
	pb.cfg.OnFailure(f)

	pb.wg.Add(1)
	go func() {
		defer pb.wg.Done()
		for _, n := range targets {
			ctx, cancel := context.WithTimeout(context.Background(), pb.cfg.Confirm)
			var rep failureReply
			if err := pb.cfg.Transport.Call(ctx, n, peer.TFailure, f, &rep); err != nil {
				pb.log.Info().Str("event", "failure_unpublished").Str("peer_node", n).Str("failed_node", f.Node).Err(err).
					Msgf("could not tell %s of %s's failure", n, f.Node)
			}
			cancel()
		}
	}()
	return false
}

// received handles a failure frame: a report (this agent coordinates) or
// the coordinator's publication.
func (pb *publisher) received(f Failure) (failureReply, error) {
	if !f.Published {
		if pb.isFenced() { // the reporter moves on to the next coordinator
			return failureReply{}, &peer.Error{Code: peer.CodeBusy, Message: "this agent is fenced (cut off from a quorum of the job's agents) and coordinates nothing"}
		}
		return failureReply{Coordinator: pb.cfg.Self, Duplicate: pb.coordinate(f)}, nil
	}
	pb.mu.Lock()
	dup := false
	for _, p := range pb.published {
		if same(p, f) {
			dup = true
			break
		}
	}
	if !dup {
		pb.published = append(pb.published, f)
		if _, ok := pb.failed[f.Node]; !ok && f.Class != ClassHang && f.Node != pb.cfg.Self {
			pb.failed[f.Node] = f.DetectedAt
		}
	}
	pb.mu.Unlock()
	if !dup {
		pb.log.Info().Str("event", "failure_published").Str("failed_node", f.Node).Str("class", f.Class).
			Str("coordinator", f.Coordinator).Msgf("coordinator %s published the %s failure of %s", f.Coordinator, f.Class, f.Node)
		pb.cfg.OnFailure(f)
	}
	return failureReply{Coordinator: f.Coordinator, Duplicate: dup}, nil
}

// recordOf is f as the run record carries it.
func recordOf(f Failure) runrecord.Failure {
	return runrecord.Failure{FailedNode: f.Node, Class: f.Class, Ranks: f.Ranks, Cause: f.Cause,
		Coordinator: f.Coordinator, Reporter: f.Reporter, ConfirmedBy: f.ConfirmedBy,
		Latency: max(f.Latency(), 0), LastHeard: f.LastHeard, DetectedAt: f.DetectedAt,
		Quorum: f.Quorum, Votes: f.Votes, Agents: f.Agents}
}
