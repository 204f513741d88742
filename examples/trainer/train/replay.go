package train

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Replay (SWIFT, section 5.1, "Recovery"). Under --log-messages every rank
// restores its own newest generation (LocalRestorer): the stages whose node
// survived hold the newest step T (their JIT flush), a stage lost with its
// node holds an older S (the peer copy of its snapshot). Instead of rolling
// every stage back to S, the stages behind run S+1..T alone: their inputs,
// the activations from the previous stage and the gradients from the next
// one, are what those neighbours sent the first time, read from the
// neighbours' message logs and sent again with the same tags. The
// computation is deterministic, so the replayed state is bit-identical to
// the lost one; then every stage goes on from T+1.
//
// Ordering: every rank walks the steps S+1..T in order. At step s a rank
// that restored a step < s is active and runs the step; an active rank
// sends live to an active neighbour (two adjacent lost stages replay as a
// small pipeline). A rank that holds s already serves: for each active
// neighbour it reads that step's messages from its log in microbatch order
// and sends them. Each pair of ranks sees its messages in the order of the
// original run, so blocking sends cannot deadlock. The rank's collectives
// (the plan's all-reduces) are called by every rank; a replayed step runs
// no world collective (its loss is not reduced, it was logged the first
// time).

// Which step the job goes on from. A rank restores the step T the job
// chose or, when it holds none, its newest step before T, and replays
// from there. T is the newest step any rank holds, T*, unless the step
// before it needs fewer stages to replay: when the survivors' flushes
// straddled a step boundary (a stage that finished step s while another
// was still inside it), the ones ahead saved s-1 as well (the JIT
// step-back, stepback.go), and going on from s-1 leaves only the lost
// stage to replay, where s would make the survivors behind replay one
// step too. That is SWIFT's recovery: the survivors undo what they
// applied past a step they all hold, the failed stage alone replays, and
// then every stage goes on (the ones that stepped back compute their
// undone step again, in the pipeline). T*-1 is chosen only where every
// rank holding a newer step holds it too, and only when strictly fewer
// ranks then replay but some still do: when none would, the lost stage is
// just one step behind, and its replay of that step is cheaper than every
// stage computing it again (and the survivors keep their step, as SWIFT's
// do). No older step is considered: that would roll the survivors back
// past what the logs are for.

// replayTarget returns T for the ranks' newest two steps each
// (held[r][1] the newest, held[r][0] the one before; 0: none), and how
// many ranks replay from it.
func replayTarget(held [][2]int64) (target int64, replaying int) {
	var newest int64
	for _, h := range held {
		newest = max(newest, h[1])
	}
	count := func(s int64) (n int, ok bool) {
		for _, h := range held {
			switch {
			case h[0] == s || h[1] == s:
			case h[1] > s:
				return 0, false // it could only go back to an older step
			default:
				n++
			}
		}
		return n, true
	}
	replaying, _ = count(newest) // no rank holds a newer step
	if newest > 1 {
		if n, ok := count(newest - 1); ok && n < replaying && n > 0 {
			return newest - 1, n
		}
	}
	return newest, replaying
}

// exchangedSteps is how many of its newest steps each rank tells the
// others at the restore: the agent's store keeps a rank's newest
// generation and two older ones (agent.alwaysKept), and a group that
// replays together (--log-groups) needs a step all its members hold.
const exchangedSteps = 3

// restoreLocal is the LocalRestorer's restore under --log-messages: the
// ranks exchange their newest steps (an all-reduce over the world),
// choose T (replayTarget) and each the step it restores (restoreSteps),
// and this rank restores it; where the agent finds it corrupt, a stage
// alone in its group tries an older one.
func (t *trainer) restoreLocal(lr LocalRestorer) (int64, bool, error) {
	steps, err := lr.LocalSteps()
	if err != nil {
		return 0, false, err
	}
	n := t.world.Size()
	v := make([]int64, exchangedSteps*n)
	for i, k := len(steps)-1, exchangedSteps-1; i >= 0 && k >= 0; i, k = i-1, k-1 {
		v[exchangedSteps*t.rank+k] = steps[i]
	}
	if err := t.world.AllReduceSumI64(v); err != nil {
		return 0, false, fmt.Errorf("replay: exchange the ranks' steps: %w", err)
	}
	held := make([][]int64, n)
	for r := range held {
		held[r] = v[exchangedSteps*r : exchangedSteps*(r+1)]
	}
	groups := t.groups
	want, target, note, err := restoreSteps(held, groups)
	if err != nil {
		return 0, false, err
	}
	if note != "" {
		fmt.Fprintln(t.log, note)
	}
	if target == 0 || want[t.rank] == 0 {
		return 0, false, nil
	}
	inGroup := 0
	for _, g := range groups {
		if g == groups[t.pipe] {
			inGroup++
		}
	}
	for i := len(steps) - 1; i >= 0; i-- {
		if steps[i] > want[t.rank] {
			continue
		}
		err := lr.RestoreLocal(steps[i])
		if err == nil {
			return steps[i], true, nil
		}
		if !errors.Is(err, ErrCorruptGeneration) || inGroup > 1 {
			return 0, false, fmt.Errorf("replay: restore step %d: %w", steps[i], err)
		}
	}
	return 0, false, nil
}

// restoreSteps chooses, from each rank's newest steps (held[r], ascending,
// 0 for none; rank = stage, as logging runs --dp 1) and the stages'
// groups, the step T the job goes on from and the step each rank
// restores: T where it holds it, else its newest before T; and where a
// rank of a group of several stages restores a step before T, every rank
// of that group restores the newest step they all hold at or before it
// (their inner messages are not logged, so they replay together). note,
// when set, says what was chosen beyond the plain case.
func restoreSteps(held [][]int64, groups []int) (want []int64, target int64, note string, err error) {
	two := make([][2]int64, len(held))
	for r, h := range held {
		two[r] = [2]int64{h[len(h)-2], h[len(h)-1]}
	}
	target, _ = replayTarget(two)
	var newest int64
	for _, h := range two {
		newest = max(newest, h[1])
	}
	var notes []string
	if target < newest {
		var ahead []string
		for r, h := range two {
			if h[1] == newest {
				ahead = append(ahead, fmt.Sprint(r))
			}
		}
		notes = append(notes, fmt.Sprintf("replay: rank(s) %s hold step %d and step %d (their JIT flush stepped back); the job goes on from step %d, "+
			"so that fewer stages replay", strings.Join(ahead, ", "), newest, target, target))
	}
	want = make([]int64, len(held))
	for r, h := range held {
		for _, s := range h {
			if s <= target {
				want[r] = max(want[r], s)
			}
		}
	}
	for g := 0; g <= slices.Max(groups); g++ {
		var members []int
		low := target
		for st, gg := range groups {
			if gg == g && st < len(want) {
				members = append(members, st)
				low = min(low, want[st])
			}
		}
		if len(members) < 2 || low == target {
			continue
		}
		common := int64(0)
		if low > 0 {
			common = -1
			for _, s := range held[members[0]] {
				if s > 0 && s <= low && !slices.ContainsFunc(members, func(m int) bool { return !slices.Contains(held[m], s) }) {
					common = max(common, s)
				}
			}
			if common < 0 {
				var hs []string
				for _, m := range members {
					hs = append(hs, fmt.Sprintf("stage %d %v", m, held[m]))
				}
				return nil, 0, "", fmt.Errorf("replay: stages %d-%d replay together (--log-groups: their inner messages are not logged) from a step "+
					"they all hold at or before step %d, and they hold none in common (%s): relaunch with --log-messages=off to restore "+
					"every rank from the newest snapshot they all hold", members[0], members[len(members)-1], low, strings.Join(hs, ", "))
			}
		}
		for _, m := range members {
			want[m] = common
		}
		notes = append(notes, fmt.Sprintf("replay: stages %d-%d replay together from step %d (one group under --log-groups: their inner messages are not logged)",
			members[0], members[len(members)-1], common))
	}
	return want, target, strings.Join(notes, "\n"), nil
}

// replayPlan is what the job agreed on after the restore.
type replayPlan struct {
	restored []int64 // per rank (= stage: logging runs --dp 1), the step it restored; 0: none
	from, to int64   // the oldest restored step and the newest (T)
}

// needed says whether some rank is behind.
func (p *replayPlan) needed() bool { return p.from < p.to }

// active says whether rank runs step s in the replay.
func (p *replayPlan) active(rank int, s int64) bool {
	return rank >= 0 && rank < len(p.restored) && p.restored[rank] < s
}

// agree tells every rank the step each restored (an all-reduce over the
// world) and returns the plan.
func (t *trainer) agree(mine int64) (*replayPlan, error) {
	v := make([]int64, t.world.Size())
	v[t.rank] = mine
	if err := t.world.AllReduceSumI64(v); err != nil {
		return nil, fmt.Errorf("replay: agree on the restored steps: %w", err)
	}
	p := &replayPlan{restored: v, from: slices.Min(v), to: slices.Max(v)}
	if p.to > 0 {
		// The job resumed, from the newest step; a --fail-at must not
		// fire again, nor --fail-in-update.
		t.resumed = true
	}
	if p.needed() {
		var behind []string
		for r, s := range v {
			if s < p.to {
				behind = append(behind, fmt.Sprintf("stage %d from step %d", r, s))
			}
		}
		fmt.Fprintf(t.log, "replay: the job holds step %d; %s replayed from the neighbours' message logs\n", p.to, strings.Join(behind, ", "))
	}
	return p, nil
}

// replay brings this rank to step p.to (active) or serves its log to the
// ranks that replay (passive), then reports the replay: a REPLAY line per
// replayed stage on rank 0.
func (t *trainer) replay(p *replayPlan, res *Result) error {
	if err := t.checkServe(p); err != nil {
		return err
	}
	me := t.rank
	first, last := t.pipe == 0, t.pipe == t.cfg.PP-1
	buf := make([]float32, t.cfg.Micro*t.width)
	local := len(t.acts)
	t0 := time.Now()
	var replayed int64
	for s := p.from + 1; s <= p.to; s++ {
		if p.active(me, s) {
			io := stageIO{sendAct: !last && p.active(me+1, s), sendGrad: !first && p.active(me-1, s)}
			if err := t.step(s, io); err != nil {
				return fmt.Errorf("replay: %w", err)
			}
			replayed++
			continue
		}
		for _, nb := range []struct {
			to, tag int
			stream  string
		}{{me + 1, tagAct, actStream(me + 1)}, {me - 1, tagGrad, gradStream(me - 1)}} {
			if !p.active(nb.to, s) {
				continue
			}
			for m := 0; m < local; m++ {
				if err := t.mlog.log.Read(nb.stream, s, m, buf); err != nil {
					return fmt.Errorf("replay: serve step %d to rank %d: %w", s, nb.to, err)
				}
				if err := t.world.SendF32(nb.to, nb.tag, buf); err != nil {
					return fmt.Errorf("replay: serve %s step %d seq %d to rank %d: %w", nb.stream, s, m, nb.to, err)
				}
			}
		}
	}
	el := time.Since(t0)
	if replayed > 0 {
		res.Replayed, res.ReplayFrom, res.ReplaySeconds = replayed, p.restored[me], el.Seconds()
	}
	// Every rank waits here for the replay to end, and rank 0 learns how
	// long each replaying stage took.
	ns := make([]int64, t.world.Size())
	if replayed > 0 {
		ns[me] = max(el.Nanoseconds(), 1)
	}
	if err := t.world.AllReduceSumI64(ns); err != nil {
		return fmt.Errorf("replay: report: %w", err)
	}
	for r, d := range ns {
		if d > 0 {
			fmt.Fprintf(t.log, "REPLAY stage %d from %d to %d steps %d seconds %.6f\n", r, p.restored[r], p.to, p.to-p.restored[r], float64(d)/1e9)
		}
	}
	return nil
}

// checkServe makes sure, before any rank starts, that every message the
// replay needs is in its sender's log; otherwise every rank fails with an
// error naming the first gap (rather than some ranks replaying and others
// waiting for a message that never comes).
func (t *trainer) checkServe(p *replayPlan) error {
	me := t.rank
	var gap [4]int64 // step, receiving rank, 1 act / 2 grad, 1 when the log holds some step of the stream
	var detail string
	for s := p.from + 1; s <= p.to && gap[0] == 0; s++ {
		if p.active(me, s) {
			continue
		}
		for _, nb := range []struct {
			to     int
			kind   int64
			stream string
		}{{me + 1, 1, actStream(me + 1)}, {me - 1, 2, gradStream(me - 1)}} {
			if !p.active(nb.to, s) {
				continue
			}
			steps, err := t.mlog.log.Steps(nb.stream)
			if err != nil {
				return fmt.Errorf("replay: list the steps of %s in the message log: %w", nb.stream, err)
			}
			if _, ok := slices.BinarySearch(steps, s); !ok {
				gap = [4]int64{s, int64(nb.to), nb.kind, 0}
				detail = "it holds none of " + nb.stream
				if len(steps) > 0 {
					detail = fmt.Sprintf("it holds steps %d..%d of %s", steps[0], steps[len(steps)-1], nb.stream)
					gap[3] = 1
				}
				break
			}
		}
	}
	n := t.world.Size()
	v := make([]int64, 4*n)
	copy(v[4*me:], gap[:])
	if err := t.world.AllReduceSumI64(v); err != nil {
		return fmt.Errorf("replay: agree on the logs: %w", err)
	}
	for r := 0; r < n; r++ {
		s, to, kind, some := v[4*r], int(v[4*r+1]), v[4*r+2], v[4*r+3]
		if s == 0 {
			continue
		}
		stream := actStream(to)
		if kind == 2 {
			stream = gradStream(to)
		}
		msg := fmt.Sprintf("replay: stage %d restored step %d and needs %s of step %d from rank %d's message log, which no longer has it",
			to, p.restored[to], stream, s, r)
		if r == me {
			msg += " (" + detail + ")"
		}
		why := "logs are kept only since the second newest snapshot generation"
		if some == 0 {
			// Not a truncation: the sender's log holds nothing of the
			// stream (lost with its agent, or never written).
			why = "the log holds no message of that stream at all: it was lost with its agent's memory, or never written " +
				"(the first run had no --log-messages)"
		}
		return fmt.Errorf("%s: %s, so the stage cannot be brought to step %d; "+
			"relaunch with --log-messages=off to restore every rank from the newest snapshot they all hold", msg, why, p.to)
	}
	return nil
}
