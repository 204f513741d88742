package agent

import (
	"cmp"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/event"
	"github.com/reft-hpc/reft/agent/persist"
	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/tmpfs"
)

// generationList is the generations reply: the rank's good generations in
// the node-local store, then those only the persistent directory holds, by
// step, newest first. A step in both appears once, as memory.
func (s *snapshots) generationList(rank int, log zerolog.Logger) []proto.GenInfo {
	out := []proto.GenInfo{}
	for _, g := range s.store.Generations(tmpfs.Key{Rank: rank, Shard: tmpfs.DefaultShard}) {
		if !g.Bad {
			out = append(out, proto.GenInfo{Step: g.Step, Seq: g.Seq, Bytes: payloadBytes(g.Manifest.Buffers), Source: proto.SourceMemory})
		}
	}
	if s.persist == nil {
		return out
	}
	gens, err := s.persist.Generations(rank)
	if err != nil {
		log.Warn().Err(err).Int("rank", rank).Msg("generations: the persistent directory cannot be listed; listing the node-local generations only")
	}
	for _, g := range gens {
		if !slices.ContainsFunc(out, func(x proto.GenInfo) bool { return x.Step == g.Step }) {
			out = append(out, proto.GenInfo{Step: g.Step, Seq: g.Manifest.Seq, Bytes: g.Bytes(), Source: proto.SourcePersistent})
		}
	}
	slices.SortStableFunc(out, func(a, b proto.GenInfo) int { return cmp.Compare(b.Step, a.Step) })
	return out
}

// restorePersistent is the restore of a step (step < 0: the newest) that
// the node-local store lacks: the persisted generation is read into a
// fresh local arena with every chunk verified and committed there. ok is
// false when there is none. On failure it replies the error itself:
// replied is true and err is the reply's write error. reason says why
// memory could not serve it.
func (s *snapshots) restorePersistent(c net.Conn, rc *rankConn, id uint32, step int64, have []int64, log zerolog.Logger) (g tmpfs.Generation, ok bool, reason string, replied bool, err error) {
	if s.persist == nil {
		return g, false, "", false, nil
	}
	gens, err := s.persist.Generations(rc.key.Rank)
	if err != nil {
		log.Error().Err(err).Int("rank", rc.key.Rank).Int64("step", step).Msg("restore: the persistent directory cannot be listed")
		return g, false, "", true, replyErr(c, id, proto.CodeInternal, "restore of step %d: rank %d has no in-memory generation of it on %s, and %v",
			step, rc.key.Rank, s.info.Node, err)
	}
	i := slices.IndexFunc(gens, func(p persist.Generation) bool { return step < 0 || p.Step == step })
	if i < 0 {
		return g, false, "", false, nil
	}
	pg := gens[i]
	if err := sameSources(pg.Manifest.SourceList(), rc.bufs); err != nil {
		return g, false, "", true, replyErr(c, id, proto.CodeMismatch, "restore of step %d (persistent, %s): %v", pg.Step, pg.Dir, err)
	}
	reason = fmt.Sprintf("rank %d has no in-memory generation of step %d on %s (it has steps %v)", rc.key.Rank, pg.Step, s.info.Node, have)
	if step < 0 {
		reason = fmt.Sprintf("rank %d has no in-memory generation on %s", rc.key.Rank, s.info.Node)
	}
	t0 := time.Now()
	g, err = s.persist.Load(pg, rc.key, manifestSpec(&pg.Manifest)) // its own layout, not this registration's
	if err != nil {
		log.Error().Err(err).Int("rank", rc.key.Rank).Int64("step", pg.Step).Str("dir", pg.Dir).Msg("restore from the persistent directory failed")
		return g, false, "", true, replyErr(c, id, storeErr(err), "restore of rank %d step %d from %s: %v", rc.key.Rank, pg.Step, pg.Dir, err)
	}
	log.Info().Str("event", event.RestorePersistent).Int("rank", rc.key.Rank).Int64("generation", pg.Step).Int64("bytes", pg.Bytes()).
		Dur("duration", time.Since(t0)).Str("dir", pg.Dir).Str("reason", reason).Msg("restoring from the persistent directory")
	return g, true, reason, false, nil
}
