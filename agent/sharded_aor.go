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
	"github.com/reft-hpc/reft/agent/shard"
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
// step, then checksums them; the previous step's replicas come from st
// (the node's store) or the restore's seed. A replica that cannot be
// brought forward is marked invalid (base -1), which is logged once until
// it is valid again.
func (rc *rankConn) aorCommit(st *tmpfs.Store, o *tmpfs.Ongoing, log zerolog.Logger) error {
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
	for _, name := range si.AOR.StateNames() {
		if reps[name], err = o.Buffer(secAOR + name); err != nil {
			return err
		}
	}
	why := rc.aorPrevious(st, step, reps)
	b := int64(-1)
	if why == "" {
		if err := advanceReplicas(si, o, reps); err != nil {
			return err
		}
		b = step
	}
	binary.LittleEndian.PutUint64(base, uint64(b))
	if err := checksumReplicas(si, o); err != nil {
		return err
	}
	rc.noteAORValidity(step, why, log)
	return nil
}

// advanceReplicas brings the replicas in reps (of step-1) forward one
// optimizer step with the gradients of the save o, as the trainer's own
// kernels do.
func advanceReplicas(si *shard.Geometry, o *tmpfs.Ongoing, reps map[string][]byte) error {
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
	return nil
}

// checksumReplicas checksums the replica sections and the base of the
// save o.
func checksumReplicas(si *shard.Geometry, o *tmpfs.Ongoing) error {
	for _, name := range si.AOR.StateNames() {
		if err := o.ComputeChecksums(secAOR + name); err != nil {
			return err
		}
	}
	return o.ComputeChecksums(secAORBase)
}

// noteAORValidity logs when the connection's replica becomes invalid (why
// != "") or valid again, once per change.
func (rc *rankConn) noteAORValidity(step int64, why string, log zerolog.Logger) {
	si, valid := rc.sg, why == ""
	switch {
	case !valid && !rc.aorInvalid:
		log.Warn().Str("event", "aor_invalid").Int("rank", si.Rank).Int64("step", step).Int("of_rank", si.Members[si.Succ(si.Pos)]).Str("reason", why).
			Msg("the AOR replica cannot be brought forward: until a restore seeds it again, a loss of the successor's node needs the persistent tier for its optimizer state")
	case valid && rc.aorInvalid:
		log.Info().Str("event", "aor_valid").Int("rank", si.Rank).Int64("step", step).Msg("the AOR replica is valid again")
	}
	rc.aorInvalid = !valid
}

// aorPrevious fills reps with the replicas of step-1 (the seed, or rc's
// generation in st), or says why there are none.
func (rc *rankConn) aorPrevious(st *tmpfs.Store, step int64, reps map[string][]byte) string {
	if sd := rc.aorSeed; sd != nil && sd.step == step-1 {
		for name, dst := range reps {
			copy(dst, sd.bufs[name])
		}
		return ""
	}
	prev, steps := generationOf(st, rc.key, step-1)
	if prev != nil {
		return replicasFrom(st, rc.key, *prev, reps)
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

// generationOf finds key's good generation of step in st (nil: none),
// and lists the steps of its good generations, newest first.
func generationOf(st *tmpfs.Store, key tmpfs.Key, step int64) (*tmpfs.Generation, []int64) {
	var found *tmpfs.Generation
	var steps []int64
	for _, g := range st.Generations(key) { // newest first
		if g.Bad {
			continue
		}
		steps = append(steps, g.Step)
		if found == nil && g.Step == step {
			found = &g
		}
	}
	return found, steps
}

// replicasFrom reads into reps the replicas that key's generation prev
// holds, or says why they cannot be used.
func replicasFrom(st *tmpfs.Store, key tmpfs.Key, prev tmpfs.Generation, reps map[string][]byte) string {
	loc := restore.Loc{Key: peer.GenKey{Rank: key.Rank, Shard: key.Shard, Step: prev.Step, Seq: prev.Seq}}
	local := restore.StoreLocal{Store: st}
	var b [8]byte
	if err := local.Read(b[:], restore.Cand{Loc: loc, Sec: secAORBase}); err != nil {
		return fmt.Sprintf("the replica of step %d cannot be read: %v", prev.Step, err)
	}
	if got := int64(binary.LittleEndian.Uint64(b[:])); got != prev.Step {
		return fmt.Sprintf("the replica in the generation of step %d is invalid too", prev.Step)
	}
	for name, dst := range reps {
		if err := local.Read(dst, restore.Cand{Loc: loc, Sec: secAOR + name}); err != nil {
			return fmt.Sprintf("the replica of %q of step %d cannot be read: %v", name, prev.Step, err)
		}
	}
	return ""
}

// readBase reads the aor@base of a generation from the first candidate
// that has it.
func (rs *restorer) readBase(ctx context.Context, locs []restore.Loc) (int64, error) {
	var cs []restore.Cand
	for _, l := range locs {
		cs = append(cs, restore.Cand{Loc: l, Sec: secAORBase})
	}
	var b [8]byte
	if err := rs.fetchInto(ctx, b[:], cs); err != nil {
		return 0, err
	}
	return int64(binary.LittleEndian.Uint64(b[:])), nil
}

// seedAOR sets, after a restore at step, the replica the rank's next
// commit starts from: its own replica if its generation survived with a
// valid one, else succ's own state buffers (from memory, else from the
// persistent tier). locs gives a rank's copies of its generation of step.
func (rs *restorer) seedAOR(ctx context.Context, rc *rankConn, step int64, locs func(r int) []restore.Loc, log zerolog.Logger) {
	si := rc.sg
	rc.aorRestored, rc.aorSeed, rc.aorSeedWhy = true, nil, ""
	sd := seeder{ctx: ctx, s: rs, si: si, step: step, seed: &aorSeed{step: step, bufs: map[string][]byte{}}}
	succ := si.Members[si.Succ(si.Pos)]
	from := sd.ownReplica(locs(si.Rank))
	if from == "" {
		from = sd.succState(succ, locs(succ))
	}
	if from == "" && rs.persist != nil { // succ's state came back from the persistent tier
		from = sd.succPersisted(succ)
	}
	if from == "" {
		rc.aorSeedWhy = strings.Join(sd.whys, "; ")
		log.Warn().Str("event", "aor_seed").Int("rank", si.Rank).Int64("step", step).Str("reason", rc.aorSeedWhy).
			Msg("no AOR replica to continue from after the restore")
		return
	}
	rc.aorSeed = sd.seed
	log.Info().Str("event", "aor_seed").Int("rank", si.Rank).Int64("step", step).Int("of_rank", succ).Str("from", from).
		Msg("AOR replica seeded from the restored step")
}

// seeder fills one seedAOR call's seed from the first source that has
// it; each source tried returns where the seed came from ("" when it
// could not) and adds why not to whys. Used on the restoring
// connection's goroutine only.
type seeder struct {
	ctx  context.Context
	s    *restorer
	si   *shard.Geometry
	step int64
	seed *aorSeed
	whys []string
}

// fill fetches every state buffer's replica from the copies ls, section
// sec(buffer) of each.
func (sd *seeder) fill(ls []restore.Loc, sec func(string) string) error {
	for _, g := range sd.si.AOR {
		for _, st := range g.States {
			buf := make([]byte, sd.si.SuccBytes(&g))
			var cs []restore.Cand
			for _, l := range ls {
				cs = append(cs, restore.Cand{Loc: l, Sec: sec(st.Buf)})
			}
			if err := sd.s.fetchInto(sd.ctx, buf, cs); err != nil {
				return fmt.Errorf("%s: %w", sec(st.Buf), err)
			}
			sd.seed.bufs[st.Buf] = buf
		}
	}
	return nil
}

func replicaSection(n string) string { return secAOR + n }
func stateSection(n string) string   { return n }

// ownReplica seeds from the rank's own replica in its copies own, when
// its base says it is valid for the step.
func (sd *seeder) ownReplica(own []restore.Loc) string {
	if len(own) == 0 {
		sd.whys = append(sd.whys, "its own generation is gone")
		return ""
	}
	b, err := sd.s.readBase(sd.ctx, own)
	switch {
	case err != nil:
		sd.whys = append(sd.whys, fmt.Sprintf("its own replica: %v", err))
	case b != sd.step:
		sd.whys = append(sd.whys, fmt.Sprintf("its own replica of step %d is invalid", sd.step))
	default:
		if err = sd.fill(own, replicaSection); err != nil {
			sd.whys = append(sd.whys, fmt.Sprintf("its own replica: %v", err))
			return ""
		}
		return "own replica"
	}
	return ""
}

// succState seeds from succ's own state buffers in its copies sl.
func (sd *seeder) succState(succ int, sl []restore.Loc) string {
	if len(sl) == 0 {
		sd.whys = append(sd.whys, fmt.Sprintf("rank %d's generation of step %d is not in memory", succ, sd.step))
		return ""
	}
	if err := sd.fill(sl, stateSection); err != nil {
		sd.whys = append(sd.whys, fmt.Sprintf("rank %d's state: %v", succ, err))
		return ""
	}
	return fmt.Sprintf("rank %d's own state", succ)
}

// succPersisted seeds from succ's state that the persistent tier holds.
func (sd *seeder) succPersisted(succ int) string {
	err := sd.s.persistedState(succ, sd.si.Rank, sd.step, func(l restore.Loc) error { return sd.fill([]restore.Loc{l}, stateSection) })
	if err != nil {
		sd.whys = append(sd.whys, fmt.Sprintf("rank %d's persisted state: %v", succ, err))
		return ""
	}
	return fmt.Sprintf("rank %d's persisted state", succ)
}

// persistedState loads rank r's persisted generation of step into this
// node's store (under the restoring rank's transient key), hands it to
// use, and drops it again.
func (rs *restorer) persistedState(r, forRank int, step int64, use func(restore.Loc) error) error {
	gens, err := rs.persist.Generations(r)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(gens, func(g persist.Generation) bool { return g.Step == step })
	if i < 0 {
		return fmt.Errorf("no persisted generation of step %d", step)
	}
	key := tmpfs.Key{Rank: r, Shard: persistedKey(forRank)}
	g, err := rs.persist.Load(gens[i], key, manifestSpec(&gens[i].Manifest))
	if err != nil {
		return err
	}
	defer rs.store.Drop(key)
	return use(restore.Loc{Key: peer.GenKey{Rank: r, Shard: key.Shard, Step: g.Step, Seq: g.Seq}})
}
