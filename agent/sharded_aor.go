package agent

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/aor"
	"github.com/reft-hpc/reft/agent/peer"
	"github.com/reft-hpc/reft/agent/persist"
	"github.com/reft-hpc/reft/agent/restore"
	"github.com/reft-hpc/reft/tmpfs"
)

// AOR (REFT's asynchronous optimizer recompute) on the agent. With aor in
// the SPEC, a ZeRO-1 rank registers its optimizer-state shards with aor
// objects and the step's reduced gradient (docs/PROTOCOL.md, "AOR
// buffers"). The rank at ring position p keeps the replica of position
// p+1's (succ's) shards:
//
//   - every save copies succ's shard of the gradient into aor@grad@G (a
//     section the client fills, like any other);
//   - at commit the agent brings the replica forward one optimizer step:
//     aor@B (step S) = Update(aor@B of step S-1, aor@grad@G of step S),
//     with agent/aor's kernels, the trainer's own, so the replica is
//     bit-identical to succ's B; aor@base records S (-1 when the replica
//     cannot be brought forward: a step was skipped, or the rank restored
//     without a replica to start from);
//   - a restore of a rank whose own generation is gone takes its state
//     buffers from its predecessor's aor@B, when that replica is valid for
//     the step, as agent/sg's failure analysis (source aor) says.
//
// The replica of step S-1 comes from the rank's previous generation, or
// after a restore at S-1 from the seed the restore set (the rank's own
// replica if its generation survived, else succ's own state buffers), or
// is zero at step 1 of a fresh start (the optimizer's state starts at 0).

// aorSeed is the replica of succ's state at a restored step: where the
// next commit starts.
type aorSeed struct {
	step int64
	bufs map[string][]byte // state buffer name -> replica bytes
}

// aorCommit writes the replicas and their base into the open save of
// step, then checksums them. A replica that cannot be brought forward is
// marked invalid (base -1), which is logged once until it is valid again.
func (s *Server) aorCommit(rc *rankConn, o *tmpfs.Ongoing, log zerolog.Logger) error {
	si := rc.sg
	if si == nil || si.AOR == nil {
		return nil
	}
	step := o.Step()
	base, err := o.Buffer(secAORBase)
	if err != nil {
		return err
	}
	reps := map[string][]byte{}
	for _, name := range si.AORStateNames() {
		if reps[name], err = o.Buffer(secAOR + name); err != nil {
			return err
		}
	}
	why := s.aorPrevious(rc, step, reps)
	valid := why == ""
	if valid {
		for _, g := range si.AOR {
			gb, err := o.Buffer(secAORGrad + g.Grad)
			if err != nil {
				return err
			}
			grad, err := aor.Float32s(gb)
			if err != nil {
				return fmt.Errorf("gradient %q: %w", g.Grad, err)
			}
			for _, st := range g.States {
				rep, err := aor.Float32s(reps[st.Buf])
				if err != nil {
					return fmt.Errorf("replica of %q: %w", st.Buf, err)
				}
				if err := g.Opt.Update(st.State, rep, grad); err != nil {
					return fmt.Errorf("replica of %q: %w", st.Buf, err)
				}
			}
		}
	}
	b := step
	if !valid {
		b = -1
	}
	binary.LittleEndian.PutUint64(base, uint64(b))
	for _, name := range si.AORStateNames() {
		if err := o.ComputeChecksums(secAOR + name); err != nil {
			return err
		}
	}
	if err := o.ComputeChecksums(secAORBase); err != nil {
		return err
	}
	switch {
	case !valid && !rc.aorInvalid:
		log.Warn().Str("event", "aor_invalid").Int("rank", si.Rank).Int64("step", step).Int("of_rank", si.Members[si.Succ(si.Pos)]).Str("reason", why).
			Msg("the AOR replica cannot be brought forward: until a restore seeds it again, a loss of the successor's node needs the persistent tier for its optimizer state")
	case valid && rc.aorInvalid:
		log.Info().Str("event", "aor_valid").Int("rank", si.Rank).Int64("step", step).Msg("the AOR replica is valid again")
	}
	rc.aorInvalid = !valid
	return nil
}

// aorPrevious fills reps with the replicas of step-1, or says why there
// are none.
func (s *Server) aorPrevious(rc *rankConn, step int64, reps map[string][]byte) string {
	if sd := rc.aorSeed; sd != nil && sd.step == step-1 {
		for name, dst := range reps {
			copy(dst, sd.bufs[name])
		}
		return ""
	}
	var prev *tmpfs.Generation
	var steps []int64
	for _, g := range s.store.Generations(rc.key) { // newest first
		if g.Bad {
			continue
		}
		steps = append(steps, g.Step)
		if prev == nil && g.Step == step-1 {
			prev = &g
		}
	}
	if prev != nil {
		loc := restore.Loc{Key: peer.GenKey{Rank: rc.key.Rank, Shard: rc.key.Shard, Step: prev.Step, Seq: prev.Seq}}
		var b [8]byte
		if err := (restore.StoreLocal{Store: s.store}).Read(b[:], restore.Cand{Loc: loc, Sec: secAORBase}); err != nil {
			return fmt.Sprintf("the replica of step %d cannot be read: %v", prev.Step, err)
		}
		if got := int64(binary.LittleEndian.Uint64(b[:])); got != prev.Step {
			return fmt.Sprintf("the replica in the generation of step %d is invalid too", prev.Step)
		}
		for name, dst := range reps {
			if err := (restore.StoreLocal{Store: s.store}).Read(dst, restore.Cand{Loc: loc, Sec: secAOR + name}); err != nil {
				return fmt.Sprintf("the replica of %q of step %d cannot be read: %v", name, prev.Step, err)
			}
		}
		return ""
	}
	if step == 1 && !rc.aorRestored {
		for _, dst := range reps {
			clear(dst) // a fresh start: the optimizer state starts at zero
		}
		return ""
	}
	if rc.aorRestored && rc.aorSeed == nil {
		return "the restore found no replica to start from (" + rc.aorSeedWhy + ")"
	}
	return fmt.Sprintf("no generation of step %d to bring the replica forward from (this rank has steps %v): the replica advances one optimizer step per save, so save every step", step-1, steps)
}

// readBase reads the aor@base of a generation from the first candidate
// that has it.
func (s *Server) readBase(ctx context.Context, locs []restore.Loc) (int64, error) {
	var cs []restore.Cand
	for _, l := range locs {
		cs = append(cs, restore.Cand{Loc: l, Sec: secAORBase})
	}
	var b [8]byte
	if err := s.fetchInto(ctx, b[:], cs); err != nil {
		return 0, err
	}
	return int64(binary.LittleEndian.Uint64(b[:])), nil
}

// seedAOR sets, after a restore at step, the replica the rank's next
// commit starts from: its own replica if its generation survived with a
// valid one, else succ's own state buffers. locs gives a rank's copies of
// its generation of step.
func (s *Server) seedAOR(ctx context.Context, rc *rankConn, step int64, locs func(r int) []restore.Loc, log zerolog.Logger) {
	si := rc.sg
	rc.aorRestored, rc.aorSeed, rc.aorSeedWhy = true, nil, ""
	sd := &aorSeed{step: step, bufs: map[string][]byte{}}
	fill := func(ls []restore.Loc, sec func(string) string) error {
		for _, g := range si.AOR {
			for _, st := range g.States {
				buf := make([]byte, si.SuccBytes(&g))
				var cs []restore.Cand
				for _, l := range ls {
					cs = append(cs, restore.Cand{Loc: l, Sec: sec(st.Buf)})
				}
				if err := s.fetchInto(ctx, buf, cs); err != nil {
					return fmt.Errorf("%s: %w", sec(st.Buf), err)
				}
				sd.bufs[st.Buf] = buf
			}
		}
		return nil
	}
	var whys []string
	from := ""
	if own := locs(si.Rank); len(own) > 0 {
		b, err := s.readBase(ctx, own)
		switch {
		case err != nil:
			whys = append(whys, fmt.Sprintf("its own replica: %v", err))
		case b != step:
			whys = append(whys, fmt.Sprintf("its own replica of step %d is invalid", step))
		default:
			if err = fill(own, func(n string) string { return secAOR + n }); err == nil {
				from = "own replica"
			} else {
				whys = append(whys, fmt.Sprintf("its own replica: %v", err))
			}
		}
	} else {
		whys = append(whys, "its own generation is gone")
	}
	succ := si.Members[si.Succ(si.Pos)]
	if from == "" {
		if sl := locs(succ); len(sl) > 0 {
			if err := fill(sl, func(n string) string { return n }); err == nil {
				from = fmt.Sprintf("rank %d's own state", succ)
			} else {
				whys = append(whys, fmt.Sprintf("rank %d's state: %v", succ, err))
			}
		} else {
			whys = append(whys, fmt.Sprintf("rank %d's generation of step %d is not in memory", succ, step))
		}
	}
	if from == "" && s.persist != nil { // succ's state came back from the persistent tier
		if err := s.persistedState(succ, si.Rank, step, func(l restore.Loc) error { return fill([]restore.Loc{l}, func(n string) string { return n }) }); err == nil {
			from = fmt.Sprintf("rank %d's persisted state", succ)
		} else {
			whys = append(whys, fmt.Sprintf("rank %d's persisted state: %v", succ, err))
		}
	}
	if from == "" {
		rc.aorSeedWhy = strings.Join(whys, "; ")
		log.Warn().Str("event", "aor_seed").Int("rank", si.Rank).Int64("step", step).Str("reason", rc.aorSeedWhy).
			Msg("no AOR replica to continue from after the restore")
		return
	}
	rc.aorSeed = sd
	log.Info().Str("event", "aor_seed").Int("rank", si.Rank).Int64("step", step).Int("of_rank", succ).Str("from", from).
		Msg("AOR replica seeded from the restored step")
}

// persistedState loads rank r's persisted generation of step into this
// node's store (under the restoring rank's transient key), hands it to
// use, and drops it again.
func (s *Server) persistedState(r, forRank int, step int64, use func(restore.Loc) error) error {
	gens, err := s.persist.Generations(r)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(gens, func(g persist.Generation) bool { return g.Step == step })
	if i < 0 {
		return fmt.Errorf("no persisted generation of step %d", step)
	}
	key := tmpfs.Key{Rank: r, Shard: persistedKey(forRank)}
	g, err := s.persist.Load(gens[i], key, manifestSpec(&gens[i].Manifest))
	if err != nil {
		return err
	}
	defer s.store.Drop(key)
	return use(restore.Loc{Key: peer.GenKey{Rank: r, Shard: key.Shard, Step: g.Step, Seq: g.Seq}})
}
