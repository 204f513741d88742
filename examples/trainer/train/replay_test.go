package train

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
)

// pipeCfg is a pipeline run for the logging tests: 4 layers of width 30,
// dp 1, 4 microbatches of 4 samples, AdamW, a snapshot every 3 steps.
func pipeCfg(pp int, mode string) Config {
	c := small()
	c.Layers, c.SizeBytes = 4, 4*(30*30+30)*4
	c.PP, c.DP, c.Micro, c.Batch = pp, 1, 4, 16
	c.Optimizer, c.LogEvery, c.Steps, c.SaveEvery = AdamW, 1, 16, 3
	c.LogMessages = mode
	return c
}

// runAll runs c on n in-process ranks and fails the test on any error.
func runAll(t *testing.T, c Config, n int, opts func(int) Options) []*Result {
	t.Helper()
	res, errs := RunLocal(c, n, opts)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return res
}

// sameParams compares every rank's parameters bit for bit.
func sameParams(t *testing.T, got, want []*Result) {
	t.Helper()
	for r := range want {
		for i := range want[r].Params {
			if !same(got[r].Params[i], want[r].Params[i]) {
				t.Errorf("rank %d tensor %d differs from the uninterrupted run", r, i)
			}
		}
	}
	if got[0].Hash != want[0].Hash {
		t.Errorf("hash %s, uninterrupted %s", got[0].Hash, want[0].Hash)
	}
}

// syncBuf is a Log writer that the test reads after the ranks finish.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// TestLoggingChangesNoBits: a run that logs its messages (either mode)
// ends with the bits and losses of one that does not, its logs hold the
// steps after the second newest snapshot (truncation), every message sent
// was logged, and bubble mode hands each message to the log at the rank's
// next wait for a message (all but those sent after the run's last wait).
func TestLoggingChangesNoBits(t *testing.T) {
	for _, pp := range []int{2, 3, 4} {
		for _, mode := range []string{LogSync, LogBubble} {
			t.Run(fmt.Sprintf("pp%d-%s", pp, mode), func(t *testing.T) {
				want := runAll(t, pipeCfg(pp, LogOff), pp, nil)
				c := pipeCfg(pp, mode)
				store := NewMemStore(pp)
				logs := make([]*MemLog, pp)
				got := runAll(t, c, pp, func(r int) Options {
					logs[r] = NewMemLog(DefaultLogCap)
					return Options{Snap: store.Rank(r), MsgLog: logs[r]}
				})
				sameParams(t, got, want)
				if fmt.Sprint(got[0].Losses) != fmt.Sprint(want[0].Losses) {
					t.Errorf("losses %v, want %v", got[0].Losses, want[0].Losses)
				}
				// Generations 3..15 committed: the logs keep 13..16.
				msg := int64(c.Micro * c.Width() * 4)
				local := int64(c.Microbatches())
				for r := 0; r < pp; r++ {
					var streams []string
					if r < pp-1 {
						streams = append(streams, actStream(r+1))
					}
					if r > 0 {
						streams = append(streams, gradStream(r-1))
					}
					for _, st := range streams {
						if steps, _ := logs[r].Steps(st); fmt.Sprint(steps) != "[13 14 15 16]" {
							t.Errorf("rank %d %s: log holds steps %v, want [13 14 15 16]", r, st, steps)
						}
					}
					sent := c.Steps * local * msg * int64(len(streams))
					if got[r].LogBytes != sent {
						t.Errorf("rank %d logged %d bytes, sent %d", r, got[r].LogBytes, sent)
					}
					if logs[r].Bytes() != 4*local*msg*int64(len(streams)) {
						t.Errorf("rank %d's log holds %d bytes, want 4 steps' worth", r, logs[r].Bytes())
					}
					wantBubble := int64(0)
					if mode == LogBubble {
						// What a stage sends goes to the log at its next
						// wait for a message; what it sent after the
						// step's last wait goes at the step's end, before
						// the step is declared consistent (a JIT flush
						// of it needs its messages in the log): the
						// first stage's last wait follows its sends, a
						// middle stage sends one gradient after it, the
						// last stage all gradients of the step.
						wantBubble = sent
						switch {
						case r == pp-1:
							wantBubble -= c.Steps * local * msg
						case r > 0:
							wantBubble -= c.Steps * msg
						}
					}
					if got[r].LogBubbleBytes != wantBubble {
						t.Errorf("rank %d: %d bytes logged in bubbles, want %d", r, got[r].LogBubbleBytes, wantBubble)
					}
				}
			})
		}
	}
}

var replayLine = regexp.MustCompile(`REPLAY stage (\d+) from (\d+) to (\d+) steps (\d+) seconds [0-9.]+\n`)

// TestReplay: a pipeline with message logging loses stages at the start of
// step 11 (snapshots every 3 steps); the survivors flush step 10, the lost
// stages restore an older snapshot (6: the node took generation 9 with it
// before its peer copy landed; or 9) and get an empty log. The relaunch
// replays only the lost stages, from their neighbours' logs, to step 10,
// and the run ends bit-identical to an uninterrupted one, for every
// optimizer.
func TestReplay(t *testing.T) {
	for _, tc := range []struct {
		pp   int
		lost []int
		keep int64 // the lost stages' newest surviving generation
		mode string
		opt  string
	}{
		{2, []int{0}, 6, LogSync, SGD},
		{2, []int{1}, 6, LogBubble, Momentum},
		{3, []int{1}, 6, LogBubble, Adam},
		{3, []int{2}, 9, LogSync, AdamW},
		{4, []int{0}, 6, LogBubble, AdamW},
		{4, []int{1}, 6, LogSync, Momentum},
		{4, []int{2}, 9, LogBubble, Adam},
		{4, []int{3}, 6, LogSync, AdamW},
		{4, []int{1, 2}, 6, LogBubble, AdamW}, // one node with two adjacent stages
	} {
		t.Run(fmt.Sprintf("pp%d-lost%v-from%d-%s-%s", tc.pp, tc.lost, tc.keep, tc.mode, tc.opt), func(t *testing.T) {
			const T = 10
			n := tc.pp
			ref := pipeCfg(n, LogOff)
			ref.Optimizer = tc.opt
			want := runAll(t, ref, n, nil)

			c := pipeCfg(n, tc.mode)
			c.Optimizer = tc.opt
			store := NewMemStore(n)
			snaps := make([]Snapshotter, n)
			logs := make([]*MemLog, n)
			for r := range snaps {
				snaps[r], logs[r] = store.Rank(r), NewMemLog(DefaultLogCap)
			}
			c.FailStep, c.FailRank = T+1, tc.lost[0]
			_, errs := RunLocal(c, n, func(r int) Options { return Options{Snap: snaps[r], MsgLog: logs[r]} })
			if !errors.Is(errs[tc.lost[0]], ErrKilled) {
				t.Fatalf("rank %d: %v, want ErrKilled", tc.lost[0], errs[tc.lost[0]])
			}
			for r := range snaps {
				if slices.Contains(tc.lost, r) {
					store.Lose(r, tc.keep)
					logs[r] = NewMemLog(DefaultLogCap)
					continue
				}
				if step, ok, err := snaps[r].(*memSnap).Flush(); err != nil || !ok || step != T {
					t.Fatalf("rank %d: JIT flush = step %d, %v, %v; want step %d", r, step, ok, err, T)
				}
			}

			out := &syncBuf{}
			got := runAll(t, c, n, func(r int) Options {
				return Options{Snap: store.Rank(r), MsgLog: logs[r], Log: out}
			})
			sameParams(t, got, want)
			if fmt.Sprint(got[0].Losses) != fmt.Sprint(want[0].Losses[T:]) {
				t.Errorf("losses %v, want %v", got[0].Losses, want[0].Losses[T:])
			}
			var lines []string
			for r, res := range got {
				if slices.Contains(tc.lost, r) {
					if res.Replayed != T-tc.keep || res.ReplayFrom != tc.keep || res.ResumedFrom != tc.keep {
						t.Errorf("lost rank %d: resumed from %d, replayed %d steps from %d; want %d steps from %d",
							r, res.ResumedFrom, res.Replayed, res.ReplayFrom, T-tc.keep, tc.keep)
					}
					lines = append(lines, fmt.Sprintf("%d %d %d %d", r, tc.keep, T, T-tc.keep))
				} else if res.Replayed != 0 || res.ResumedFrom != T {
					t.Errorf("surviving rank %d: resumed from %d, replayed %d steps; want step %d and no replay", r, res.ResumedFrom, res.Replayed, T)
				}
			}
			var reported []string
			for _, m := range replayLine.FindAllStringSubmatch(out.b.String(), -1) {
				reported = append(reported, strings.Join(m[1:], " "))
			}
			if fmt.Sprint(reported) != fmt.Sprint(lines) {
				t.Errorf("REPLAY lines %q, want %q; output:\n%s", reported, lines, out.b.String())
			}
		})
	}
}

// TestReplayTruncated: a lost stage whose snapshot is older than what its
// neighbours' logs keep (generation 3; they keep the steps after 6) cannot
// be replayed: every rank fails with an error that names the gap and the
// fix, and nobody trains on. The fix it names, a relaunch without logging,
// restores the newest generation every rank holds and ends bit-identical.
func TestReplayTruncated(t *testing.T) {
	const n, T, lost = 3, 10, 1
	want := runAll(t, pipeCfg(n, LogOff), n, nil)
	c := pipeCfg(n, LogSync)
	store := NewMemStore(n)
	snaps := make([]Snapshotter, n)
	logs := make([]*MemLog, n)
	for r := range snaps {
		snaps[r], logs[r] = store.Rank(r), NewMemLog(DefaultLogCap)
	}
	c.FailStep, c.FailRank = T+1, lost
	RunLocal(c, n, func(r int) Options { return Options{Snap: snaps[r], MsgLog: logs[r]} })
	for r := range snaps {
		if r == lost {
			continue
		}
		if _, ok, err := snaps[r].(*memSnap).Flush(); err != nil || !ok {
			t.Fatalf("rank %d: flush: %v %v", r, ok, err)
		}
	}
	store.Lose(lost, 3)
	logs[lost] = NewMemLog(DefaultLogCap)

	res, errs := RunLocal(c, n, func(r int) Options { return Options{Snap: store.Rank(r), MsgLog: logs[r]} })
	for r, err := range errs {
		if err == nil {
			t.Errorf("rank %d trained on: %+v", r, res[r])
			continue
		}
		for _, w := range []string{"stage 1 restored step 3 and needs act>1 of step 4 from rank 0's message log, which no longer has it",
			"cannot be brought to step 10", "relaunch with --log-messages=off"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("rank %d: %v\nwant it to contain %q", r, err, w)
			}
		}
	}
	// Step 11's activations are in rank 0's log if it sent them before the
	// world was aborted.
	if !regexp.MustCompile(`\(it holds steps 7\.\.1[01] of act>1\)`).MatchString(errs[0].Error()) {
		t.Errorf("rank 0 does not say what its log holds: %v", errs[0])
	}
	c.LogMessages = LogOff
	got := runAll(t, c, n, func(r int) Options { return Options{Snap: store.Rank(r)} })
	if got[0].ResumedFrom != 3 {
		t.Errorf("resumed from %d, want 3 (the newest generation every rank holds)", got[0].ResumedFrom)
	}
	sameParams(t, got, want)
}

// jobWide hides MemStore's per-rank restore, as reft's client does today.
type jobWide struct{ Snapshotter }

// everyZero is a snapshotter of a job launched with every=0.
type everyZero struct{ Snapshotter }

func (everyZero) Every() int { return 0 }

// TestLoggingNeeds: logging without a log or snapshots is refused; with a
// snapshotter that restores only a common step it logs, says once that no
// replay can happen, and changes no bits.
func TestLoggingNeeds(t *testing.T) {
	c := pipeCfg(2, LogSync)
	_, errs := RunLocal(c, 2, func(r int) Options { return Options{Snap: NewMemStore(2).Rank(r)} })
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "no message log configured") {
		t.Errorf("no log: %v", errs[0])
	}
	_, errs = RunLocal(c, 2, func(r int) Options { return Options{MsgLog: NewMemLog(DefaultLogCap)} })
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "--log-messages needs snapshots") {
		t.Errorf("no snapshots: %v", errs[0])
	}
	_, errs = RunLocal(c, 2, func(r int) Options {
		return Options{Snap: everyZero{NewMemStore(2).Rank(r)}, MsgLog: NewMemLog(DefaultLogCap)}
	})
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "--log-messages under every=0") {
		t.Errorf("every=0: %v", errs[0])
	}
	want := runAll(t, pipeCfg(2, LogOff), 2, nil)
	store := NewMemStore(2)
	out := &syncBuf{}
	got := runAll(t, c, 2, func(r int) Options {
		return Options{Snap: jobWide{store.Rank(r)}, MsgLog: NewMemLog(DefaultLogCap), Log: out}
	})
	sameParams(t, got, want)
	if n := strings.Count(out.b.String(), "the logs are not replayed"); n != 1 {
		t.Errorf("said %d times that logs are not replayed, want once:\n%s", n, out.b.String())
	}
	// A cap too small for two snapshot intervals fails, naming the fix.
	_, errs = RunLocal(c, 2, func(r int) Options { return Options{Snap: NewMemStore(2).Rank(r), MsgLog: NewMemLog(4096)} })
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "message log full") || !strings.Contains(errs[0].Error(), "raise --log-cap") {
		t.Errorf("small cap: %v", errs[0])
	}
}

// TestReplayTarget: the step the job goes on from, for the ranks' newest
// two steps each ([older, newer]; 0: none).
func TestReplayTarget(t *testing.T) {
	for _, tc := range []struct {
		name      string
		held      [][2]int64
		target    int64
		replaying int
	}{
		{"fresh start", [][2]int64{{0, 0}, {0, 0}}, 0, 0},
		{"every rank at the same step", [][2]int64{{4, 8}, {4, 8}, {4, 8}}, 8, 0},
		{"a lost stage behind", [][2]int64{{4, 9}, {0, 4}, {4, 9}, {4, 9}}, 9, 1},
		{"survivors also hold the step before", [][2]int64{{8, 9}, {0, 4}, {8, 9}}, 9, 1},
		{"straddle, stepped back", [][2]int64{{5, 6}, {0, 4}, {6, 7}, {6, 7}}, 6, 1},
		{"straddle without a step-back: the ones ahead cannot go back", [][2]int64{{5, 6}, {0, 4}, {4, 7}, {4, 7}}, 7, 2},
		{"two ranks, the one ahead stepped back: going back would replay none", [][2]int64{{5, 6}, {6, 7}}, 7, 1},
		{"the lost stage one behind: it replays, the survivors keep their step", [][2]int64{{7, 8}, {0, 7}, {7, 8}}, 8, 1},
		{"a rank with nothing", [][2]int64{{5, 6}, {0, 0}, {6, 7}}, 6, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, n := replayTarget(tc.held)
			if got != tc.target || n != tc.replaying {
				t.Errorf("replayTarget(%v) = %d with %d replaying, want %d with %d", tc.held, got, n, tc.target, tc.replaying)
			}
		})
	}
}

// TestRestoreSteps: the step each rank restores, from the ranks' newest
// three steps ([oldest .. newest]; 0: none) and the stages' groups.
func TestRestoreSteps(t *testing.T) {
	one := []int{0, 1, 2, 3}
	for _, tc := range []struct {
		name   string
		held   [][]int64
		groups []int
		want   []int64
		target int64
		err    string
	}{
		{"every stage its own group, stage 1 lost", [][]int64{{4, 8, 9}, {0, 4, 8}, {4, 8, 9}}, one[:3], []int64{9, 8, 9}, 9, ""},
		{"stages 0-1 one group: stage 0 goes back with stage 1", [][]int64{{4, 8, 9}, {0, 4, 8}, {4, 8, 9}}, []int{0, 0, 1}, []int64{8, 8, 9}, 9, ""},
		{"the group's common step is older", [][]int64{{8, 9, 10}, {0, 4, 8}, {0, 0, 0}, {8, 9, 10}}, []int{0, 0, 1, 1}, []int64{8, 8, 0, 0}, 10, ""},
		{"a group with nothing in common", [][]int64{{9, 10, 11}, {0, 4, 8}, {9, 10, 11}}, []int{0, 0, 1}, nil, 0, "hold none in common"},
		{"a straddle and a group", [][]int64{{4, 5, 6}, {0, 0, 4}, {4, 6, 7}, {4, 6, 7}}, []int{0, 1, 1, 2}, []int64{6, 4, 4, 6}, 6, ""},
		{"a fresh start", [][]int64{{0, 0, 0}, {0, 0, 0}}, []int{0, 0}, []int64{0, 0}, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, target, note, err := restoreSteps(tc.held, tc.groups)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("restoreSteps = %v, %v; want an error containing %q", want, err, tc.err)
				}
				return
			}
			if err != nil || target != tc.target || !slices.Equal(want, tc.want) {
				t.Errorf("restoreSteps(%v, %v) = %v, T %d, %v; want %v, T %d (%s)", tc.held, tc.groups, want, target, err, tc.want, tc.target, note)
			}
		})
	}
}

// TestParseLogGroups: --log-groups' syntax, and Validate's checks of the
// groups against the layout.
func TestParseLogGroups(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want [][2]int
		err  string
	}{
		{"0,1-2,3", [][2]int{{0, 0}, {1, 2}, {3, 3}}, ""},
		{"0-1,2", [][2]int{{0, 1}, {2, 2}}, ""},
		{"1,2", nil, "starts at stage 1, want 0"},
		{"0,2", nil, "starts at stage 2, want 1"},
		{"0,x", nil, `"x" is not a stage or a range`},
		{"0-", nil, "is not a stage or a range"},
		{"1-0", nil, "is not a stage or a range"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseLogGroups(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ParseLogGroups(%q) = %v, %v; want an error containing %q", tc.in, got, err, tc.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("ParseLogGroups(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
		})
	}
}
