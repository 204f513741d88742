package detect

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// HangTimeout is how long a rank whose median step takes stepTime may make
// no progress before it counts as hung: factor times stepTime, never less
// than floor (detect.hang, detect.hang_factor). A step twice the median is
// no hang for any factor above 2; the floor covers a rank with no median
// yet (its first steps) and the pauses a training loop takes between steps
// (evaluation, data loading).
func HangTimeout(floor time.Duration, factor float64, stepTime time.Duration) time.Duration {
	if a := time.Duration(factor * float64(stepTime)); a > floor {
		return a
	}
	return floor
}

// frozen reports whether a rank's process can make no progress of its own:
// stopped by a signal, stuck in uninterruptible sleep (I/O, a driver call),
// or dead and not reaped.
func frozen(process string) bool {
	return process == ProcStopped || process == ProcDiskSleep || process == ProcZombie
}

// checkHangs reports local ranks that made no progress for their
// HangTimeout, once per stop. When one rank of a synchronous job hangs,
// every other rank soon waits for it in a collective and stops progressing
// too; only the culprit should be named. So:
//
//   - a rank whose process is frozen (stopped, in uninterruptible sleep)
//     is reported at its timeout; one that exited (a zombie) too, unless
//     a verdict published after its last progress explains it: the ranks
//     of a job whose failure was published are killed by its teardown;
//   - a rank whose process still runs or sleeps is waiting, for another
//     rank or in its own computation: it is logged (rank_waiting) at its
//     timeout and reported at twice it, unless by then a verdict published
//     after its last progress (another agent's hang, a lost node) explains
//     the wait. A job where every rank waits (a deadlock with no frozen
//     process) is thus still reported, one timeout later.
func (d *Detector) checkHangs(ctx context.Context) {
	if d.cfg.Hang <= 0 || d.cfg.Progress == nil {
		return
	}
	ps := d.cfg.Progress()
	slices.SortFunc(ps, func(a, b Progress) int { return a.Rank - b.Rank })
	now := time.Now()
	var hung []Progress
	var limits []time.Duration
	d.mu.Lock()
	for _, p := range ps {
		limit := HangTimeout(d.cfg.Hang, d.cfg.HangFactor, p.StepTime)
		silent := now.Sub(p.At)
		if silent < limit || d.hung[p.Rank].Equal(p.At) {
			continue
		}
		switch {
		case p.Process == ProcZombie && explained(d.published, p.At):
			continue // it exited after a published failure: the job's teardown, not another hang
		case frozen(p.Process):
		case explained(d.published, p.At):
			continue // another verdict since its last progress: it waits for that
		case silent < 2*limit:
			if !d.waiting[p.Rank].Equal(p.At) {
				d.waiting[p.Rank] = p.At
				d.log.Info().Str("event", "rank_waiting").Int("rank", p.Rank).Int64("at_step", p.Step).Str("process", p.Process).
					Str("where", p.Where).Dur("silent", silent).Dur("hang_timeout", limit).
					Msgf("rank %d made no progress past step %d for %s, but its process is %s%s: it waits for another rank or computes; "+
						"reported as hung at %s unless another agent names a frozen rank first", p.Rank, p.Step, silent.Round(time.Millisecond),
						orUnknown(p.Process), lastSeen(p.Where), (2 * limit).Round(time.Millisecond))
			}
			continue
		}
		d.hung[p.Rank] = p.At
		hung = append(hung, p)
		limits = append(limits, limit)
	}
	d.mu.Unlock()
	if len(hung) == 0 {
		return
	}
	f := Failure{Node: d.cfg.Self, Class: ClassHang, Reporter: d.cfg.Self, LastHeard: hung[0].At, DetectedAt: now}
	var what []string
	for i, p := range hung {
		f.Ranks = append(f.Ranks, p.Rank)
		if p.At.Before(f.LastHeard) {
			f.LastHeard = p.At
		}
		what = append(what, describeHung(p, limits[i], now, d.cfg.Hang, d.cfg.HangFactor))
	}
	f.Cause = fmt.Sprintf("no progress on %s: %s", d.cfg.Self, strings.Join(what, "; "))
	d.log.Warn().Str("event", "rank_hung").Ints("ranks", f.Ranks).Msg(f.Cause)
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		d.pub.report(ctx, f)
	}()
}

// explained reports whether a verdict published (or learnt) was
// confirmed after t: a rank silent since t waits for that failure.
func explained(published []Failure, t time.Time) bool {
	for _, f := range published {
		if f.DetectedAt.After(t) {
			return true
		}
	}
	return false
}

// describeHung says which rank hung, where and by what measure, for the
// verdict's cause (the recovery log and the job's Comment show it).
func describeHung(p Progress, limit time.Duration, now time.Time, floor time.Duration, factor float64) string {
	var b strings.Builder
	b.WriteString("rank " + strconv.Itoa(p.Rank) + " at step " + strconv.FormatInt(p.Step, 10))
	switch {
	case frozen(p.Process):
		b.WriteString(", process " + p.Process)
	case p.Process != "":
		b.WriteString(", process " + p.Process + " and no other rank named (a deadlock, or stuck in its own computation)")
	}
	b.WriteString(lastSeen(p.Where))
	fmt.Fprintf(&b, ", silent %s (timeout %s: ", now.Sub(p.At).Round(time.Millisecond), limit.Round(time.Millisecond))
	if p.StepTime > 0 && limit > floor {
		fmt.Fprintf(&b, "%g x its median step %s", factor, p.StepTime.Round(time.Microsecond))
	} else {
		fmt.Fprintf(&b, "detect.hang")
		if p.StepTime > 0 {
			fmt.Fprintf(&b, ", above %g x its median step %s", factor, p.StepTime.Round(time.Microsecond))
		}
	}
	b.WriteString(")")
	return b.String()
}

// lastSeen is where, for a sentence: ", last seen in the collective
// gradient all-reduce"; "" when the rank reports no phases.
func lastSeen(where string) string {
	if where == "" {
		return ""
	}
	return ", last seen " + where
}

func orUnknown(s string) string {
	if s == "" {
		return "of unknown state"
	}
	return s
}
