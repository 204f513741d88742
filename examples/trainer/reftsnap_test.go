package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/rs/zerolog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/reft-hpc/reft/client"
	"github.com/reft-hpc/reft/examples/trainer/train"
	"github.com/reft-hpc/reft/tests/conformance-agent/agenttest"
)

// slotGather is an all-gather over a train.Comm for the in-process tests:
// each member sums its src into its own slot of a zeroed buffer.
func slotGather(c train.Comm) func(dst, src []int64) error {
	return func(dst, src []int64) error {
		if len(dst) != len(src)*c.Size() {
			return fmt.Errorf("allgather: dst has %d elements, want %d x %d", len(dst), c.Size(), len(src))
		}
		buf := make([]int64, len(dst))
		copy(buf[c.Rank()*len(src):], src)
		if err := c.AllReduceSumI64(buf); err != nil {
			return err
		}
		copy(dst, buf)
		return nil
	}
}

func TestGatherSteps(t *testing.T) {
	mine := [][]int64{{9, 8}, {}, {9, 8, 7}, {8}}
	w := train.NewLocalWorld(len(mine))
	got := make([][][]int64, len(mine))
	errs := make([]error, len(mine))
	var wg sync.WaitGroup
	for r := range mine {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[r], errs[r] = gatherSteps(len(mine), slotGather(w.Comm(r)), mine[r])
		}()
	}
	wg.Wait()
	for r := range mine {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
		for i := range mine {
			if !slices.Equal(got[r][i], mine[i]) {
				t.Errorf("rank %d sees rank %d's list %v, want %v", r, i, got[r][i], mine[i])
			}
		}
	}
}

func TestAgreeOffThread(t *testing.T) {
	agree := agreeOver(2, func(dst, src []int64) error { t.Fatal("all-gather called off the MPI thread"); return nil },
		func() error { return errNotMPIThread })
	if _, err := agree(context.Background(), []int64{3}); !errors.Is(err, errNotMPIThread) {
		t.Fatalf("agree off the MPI thread: %v, want errNotMPIThread", err)
	}
}

func TestOpenReftWithoutSocket(t *testing.T) {
	t.Setenv(client.SocketEnv, "")
	s, err := openReft(context.Background(), client.Options{Optional: true, World: 1})
	if err != nil || s != nil {
		t.Fatalf("openReft without a socket: %v, %v; want nil, nil", s, err)
	}
}

// small is a quick configuration that every layout below divides.
func small() train.Config {
	c := train.Defaults()
	c.SizeBytes, c.Layers, c.Steps, c.Batch, c.Micro, c.LR, c.LogEvery, c.Threads = 11400, 4, 9, 16, 4, 1e-2, 1, 1
	c.SaveEvery = 1
	return c
}

// runReft runs cfg on n in-process ranks, each with a reft client session
// on a's socket, and returns rank 0's result and log. A failing rank aborts
// the world, as MPI tears down a job. The sessions are closed afterwards,
// which lets a save in flight commit, as the agent would have it on a node.
func runReft(t *testing.T, a *agenttest.Agent, cfg train.Config, n int) (*train.Result, string, error) {
	t.Helper()
	return runReftNote(t, a, cfg, n, nil)
}

// relaunchFromUndo relaunches crash on two ranks after a flush that undid
// step 6's update: the run must resume from step 5 and end with hash, the
// uninterrupted run's.
func relaunchFromUndo(t *testing.T, a *agenttest.Agent, crash train.Config, hash string) {
	t.Helper()
	got, log, err := runReft(t, a, crash, 2)
	if err != nil {
		t.Fatalf("relaunch: %v\n%s", err, log)
	}
	if got.ResumedFrom != 5 {
		t.Errorf("resumed from %d, want 5 (the step the flush saved after the undo)\n%s", got.ResumedFrom, log)
	}
	if got.Hash != hash {
		t.Errorf("resumed hash %s, uninterrupted %s", got.Hash, hash)
	}
}

// runReftNote is runReft with note as every rank's train.Options.Note.
func runReftNote(t *testing.T, a *agenttest.Agent, cfg train.Config, n int, note func(string)) (*train.Result, string, error) {
	t.Helper()
	return runReftHooks(t, a, cfg, n, hooks{note: note, flushKilled: true})
}

// runReftWith is runReftNote; flushKilled false leaves the rank that
// --fail-at kills without a JIT flush (its node's memory lost with it,
// as under --log-messages, where its state is not its peers' to save).
// Under --log-messages every rank logs into the agent (reftLog).
func runReftWith(t *testing.T, a *agenttest.Agent, cfg train.Config, n int, note func(string), flushKilled bool) (*train.Result, string, error) {
	t.Helper()
	return runReftHooks(t, a, cfg, n, hooks{note: note, flushKilled: flushKilled})
}

// hooks are runReftHooks' ways into a run.
type hooks struct {
	note        func(string)               // every rank's train.Options.Note
	flushKilled bool                       // see runReftWith
	clientLog   func(rank int, msg string) // the clients' lines; nil: the client's default
	world       func(*train.LocalWorld)    // called with the world before the ranks start
	// snap, if set, is the snapshotter the trainer gets over the session.
	snap func(*reftSnap) train.Snapshotter
	// lost, if set, is a rank whose client never flushes (no JIT watch):
	// it stands for a rank lost with its node's memory.
	lost *int
}

// runReftHooks is runReftWith with h.
func runReftHooks(t *testing.T, a *agenttest.Agent, cfg train.Config, n int, h hooks) (*train.Result, string, error) {
	t.Helper()
	w := train.NewLocalWorld(n)
	if h.world != nil {
		h.world(w)
	}
	note, flushKilled := h.note, h.flushKilled
	res := make([]*train.Result, n)
	errs := make([]error, n)
	var log bytes.Buffer
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			comm := w.Comm(r)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			opt := client.Options{Socket: a.Socket, Rank: r, World: n, LocalRank: r,
				Layout: fmt.Sprintf("dp=%d,pp=%d", cfg.DP, cfg.PP), Agree: agreeOver(n, slotGather(comm), nil)}
			if h.clientLog != nil {
				opt.Log = func(msg string) { h.clientLog(r, msg) }
			}
			snap, err := openReft(ctx, opt)
			if err != nil {
				errs[r] = err
				w.Abort()
				return
			}
			defer func() {
				if err := snap.Close(); err != nil && errs[r] == nil {
					errs[r] = err
				}
			}()
			isLost := h.lost != nil && *h.lost == r
			if cfg.JIT && !isLost {
				snap.startJIT(ctx, func(msg string) { t.Errorf("rank %d: %s", r, msg) })
			}
			o := train.Options{Comm: comm, Snap: snap, Note: note}
			if h.snap != nil {
				o.Snap = h.snap(snap)
			}
			if cfg.LogMessages != train.LogOff {
				o.MsgLog = snap.messageLog()
			}
			if r == 0 {
				o.Log = &log
			}
			res[r], errs[r] = train.Run(cfg, o)
			if errs[r] != nil {
				// As reft-train's main: the collective failed, the state
				// of the last step is consistent (every rank flushes here,
				// the killed one standing in for its state's copies on
				// the survivors).
				if cfg.JIT && !isLost && (flushKilled || !errors.Is(errs[r], train.ErrKilled)) {
					if err := snap.flush(errs[r]); err != nil {
						errs[r] = errors.Join(errs[r], err)
					}
				}
				w.Abort()
			}
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil && !errors.Is(err, train.ErrAborted) {
			return nil, log.String(), fmt.Errorf("rank %d: %w", r, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, log.String(), err
	}
	return res[0], log.String(), nil
}

var (
	_ train.Consistency   = (*reftSnap)(nil)
	_ train.LocalRestorer = (*reftSnap)(nil)
	_ train.MessageLog    = reftLog{}
)

// TestReftLoggingReplay: a 3-stage pipeline logging its messages into the
// agent (reftLog), snapshots every 4 steps; stage 1 dies at the start of
// step 10 with no flush (its node's memory gone), so its newest generation
// is step 8, while the survivors' JIT flushes save step 9. The relaunch
// restores each rank's step (LocalRestorer), stage 1 alone replays step 9
// from its neighbours' logs read back from the agent, and the run ends
// with the bits of an uninterrupted run without logging. With selective
// logging (--log-groups 0-1,2) stages 0 and 1 form a group whose inner
// messages are not logged (rank 0 logs nothing): stage 0 goes back to
// step 8 with its group's lost stage, and both replay step 9, stage 2
// serving its log.
func TestReftLoggingReplay(t *testing.T) {
	for _, tc := range []struct {
		name   string
		groups [][2]int
		want   []string // lines of rank 0's log
		lines  int      // REPLAY lines
	}{
		{"every boundary", nil, []string{"REPLAY stage 1 from 8 to 9 steps 1 "}, 1},
		{"groups 0-1,2", [][2]int{{0, 1}, {2, 2}},
			[]string{"replay: stages 0-1 replay together from step 8", "REPLAY stage 0 from 8 to 9 steps 1 ", "REPLAY stage 1 from 8 to 9 steps 1 "}, 2},
	} {
		for _, mode := range []string{train.LogSync, train.LogBubble} {
			t.Run(tc.name+"/"+mode, func(t *testing.T) {
				cfg := small()
				cfg.PP, cfg.DP, cfg.Steps, cfg.SaveEvery, cfg.LogEvery = 3, 1, 14, 4, 1
				ref, errs := train.RunLocal(cfg, 3, nil)
				if err := errors.Join(errs...); err != nil {
					t.Fatal(err)
				}
				// The log's cap is half the node's memory budget, split
				// among the ranks.
				a, err := agenttest.Start(agenttest.Options{MemoryBudget: 64 << 20, Log: zerolog.New(zerolog.NewTestWriter(t))})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { a.Close() })
				crash := cfg
				crash.LogMessages, crash.JIT, crash.LogGroups = mode, true, tc.groups
				crash.FailStep, crash.FailRank = 10, 1
				if _, log, err := runReftWith(t, a, crash, 3, nil, false); !errors.Is(err, train.ErrKilled) {
					t.Fatalf("the run with --fail-at 10:1: %v, want ErrKilled\n%s", err, log)
				}
				got, log, err := runReftWith(t, a, crash, 3, nil, false)
				if err != nil {
					t.Fatalf("relaunch: %v\n%s", err, log)
				}
				if got.Hash != ref[0].Hash {
					t.Errorf("final-params-sha256 %s after the replay, %s uninterrupted\n%s", got.Hash, ref[0].Hash, log)
				}
				for _, want := range tc.want {
					if !strings.Contains(log, want) {
						t.Errorf("no %q line\n%s", want, log)
					}
				}
				if n := strings.Count(log, "REPLAY stage"); n != tc.lines {
					t.Errorf("%d REPLAY lines, want %d (the lost stage's group)\n%s", n, tc.lines, log)
				}
				if tc.groups != nil && got.LogBytes != 0 {
					t.Errorf("rank 0 logged %d bytes; its only boundary is inside its group, which is not logged", got.LogBytes)
				}
			})
		}
	}
}

// TestReftLoggingStraddle: a 4-stage pipeline logging its messages, with
// snapshots every 4 steps, and the survivors' flushes on either side of a
// step boundary: stage 0 holds before its update of step 7 (a stage
// still inside the step) while stages 1-3 finish it and wait in the loss
// reduction, and stage 1 is lost with no flush (its client never flushes:
// its newest generation is step 4). The
// JIT step-back makes stage 0 save steps 5 and 6, stages 2 and 3 steps 6
// and 7, so the job goes on from step 6 and only stage 1 replays (5..6),
// where going on from step 7 would have stage 0 replay a step too; the run
// ends with the bits of an uninterrupted one.
func TestReftLoggingStraddle(t *testing.T) {
	for _, mode := range []string{train.LogSync, train.LogBubble} {
		t.Run(mode, func(t *testing.T) {
			cfg := small()
			cfg.PP, cfg.DP, cfg.Steps, cfg.SaveEvery, cfg.LogEvery = 4, 1, 12, 4, 1
			ref, errs := train.RunLocal(cfg, 4, nil)
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			a, err := agenttest.Start(agenttest.Options{MemoryBudget: 64 << 20, Log: zerolog.New(zerolog.NewTestWriter(t))})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { a.Close() })
			crash := cfg
			crash.LogMessages, crash.JIT, crash.Undo = mode, true, true
			crash.HoldBeforeStep, crash.HoldBeforeRanks = 7, []int{0}
			lost := 1
			worlds := make(chan *train.LocalWorld, 1)
			notes := make(chan string, 8)
			backs := make(chan string, 4)
			var mu sync.Mutex
			lines := map[int][]string{}
			var seen []string
			done := make(chan struct{})
			go func() {
				defer close(done)
				w := <-worlds
				defer w.Abort() // the job torn down after the flushes
				for range 4 {   // stage 0 holds; 1, 2 and 3 finish step 7
					seen = append(seen, <-notes)
				}
				a.NotifyPeerFailure("n2", "test: stage 1's node lost after step 7")
				for range 3 {
					select {
					case <-backs:
					case <-time.After(time.Minute):
						t.Errorf("not every survivor's flush stepped back within a minute")
						return
					}
				}
			}()
			_, log, err := runReftHooks(t, a, crash, 4, hooks{
				lost:  &lost,
				note:  func(msg string) { notes <- msg },
				world: func(w *train.LocalWorld) { worlds <- w },
				clientLog: func(r int, msg string) {
					mu.Lock()
					lines[r] = append(lines[r], msg)
					mu.Unlock()
					if strings.Contains(msg, "JIT save of steps") {
						backs <- msg
					}
				},
			})
			<-done
			if !errors.Is(err, train.ErrAborted) {
				t.Fatalf("the held run: %v, want every rank ended by the world's abort after the flushes\n%s", err, log)
			}
			all := strings.Join(seen, "\n")
			for r, want := range map[int]string{
				0: "JIT save of steps 5 and 6 (step 6's update undone, saved, redone)",
				2: "JIT save of steps 6 and 7 (step 7's update undone, saved, redone)",
				3: "JIT save of steps 6 and 7 (step 7's update undone, saved, redone)",
			} {
				mu.Lock()
				rl := strings.Join(lines[r], "\n")
				mu.Unlock()
				if !strings.Contains(rl, want) {
					t.Errorf("rank %d's client did not log %q:\n%s\nnotes:\n%s", r, want, rl, all)
				}
			}
			got, log, err := runReftWith(t, a, crash, 4, nil, false)
			if err != nil {
				t.Fatalf("relaunch: %v\n%s", err, log)
			}
			if got.Hash != ref[0].Hash {
				t.Errorf("final-params-sha256 %s after the replay, %s uninterrupted\n%s", got.Hash, ref[0].Hash, log)
			}
			if want := "the job goes on from step 6"; !strings.Contains(log, want) {
				t.Errorf("no %q line\n%s", want, log)
			}
			if want := "REPLAY stage 1 from 4 to 6 steps 2 "; !strings.Contains(log, want) {
				t.Errorf("no %q line: stage 1 should replay steps 5 and 6 alone\n%s", want, log)
			}
			if n := strings.Count(log, "REPLAY stage"); n != 1 {
				t.Errorf("%d REPLAY lines, want 1 (only the lost stage replays)\n%s", n, log)
			}
		})
	}
}

// TestReftJITResume: snapshots every 5 steps, a rank lost at the start of
// step 13: every rank's JIT flush saves step 12 (the killed rank's stands
// for the copies of its state that the survivors' saves carry under arc),
// and the relaunch resumes at 12, not 10, with the uninterrupted bits.
func TestReftJITResume(t *testing.T) {
	cfg := small()
	cfg.DP, cfg.Steps, cfg.SaveEvery = 2, 16, 5
	ref, a := referenceAndAgent(t, cfg, 2, "")
	crash := cfg
	crash.FailStep, crash.FailRank = 13, 1
	if _, log, err := runReft(t, a, crash, 2); !errors.Is(err, train.ErrKilled) {
		t.Fatalf("the run with --fail-at 13:1: %v, want ErrKilled\n%s", err, log)
	}
	got, log, err := runReft(t, a, crash, 2)
	if err != nil {
		t.Fatalf("relaunch: %v\n%s", err, log)
	}
	if got.ResumedFrom != 12 {
		t.Errorf("relaunch resumed from %d, want 12 (JIT flush), not 10 (--save-every 5)\n%s", got.ResumedFrom, log)
	}
	if got.Hash != ref[0].Hash {
		t.Errorf("final-params-sha256 %s after the resume, %s uninterrupted", got.Hash, ref[0].Hash)
	}
}

var (
	resumedRe = regexp.MustCompile(`(?m)^resumed from step (\d+)$`)
	lossRe    = regexp.MustCompile(`(?m)^step (\d+) loss `)
)

// TestReftCrashResume: a rank dies at step 6; the relaunch restores every
// rank from the agent's store, resumes at the step after the restored one
// and ends with the bits of an uninterrupted run, for replicated and
// sharded (ZeRO-1) optimizer state and for a pipeline; and in a job with
// aor, whose ZeRO-1 ranks register the gradient and their optimizer shards
// with aor objects (restored like any other buffer).
func TestReftCrashResume(t *testing.T) {
	for _, tc := range []struct {
		name   string
		n      int
		layout func(*train.Config)
		spec   string // the agent's SPEC; "": agenttest's
	}{
		{"dp2", 2, func(c *train.Config) { c.DP = 2 }, ""},
		{"dp2-zero1-adamw", 2, func(c *train.Config) { c.DP, c.Zero1, c.Optimizer = 2, true, train.AdamW }, ""},
		{"dp2-pp2", 4, func(c *train.Config) { c.DP, c.PP = 2, 2 }, ""},
		{"dp2-zero1-adam-aor", 2, func(c *train.Config) { c.DP, c.Zero1, c.Optimizer = 2, true, train.Adam }, "aor"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := small()
			tc.layout(&cfg)
			ref, a := referenceAndAgent(t, cfg, tc.n, tc.spec)
			if tc.spec == "aor" {
				snap, err := openReft(context.Background(), client.Options{Socket: a.Socket})
				if err != nil || !snap.AOR() {
					t.Fatalf("a client of an aor agent: AOR false (%v)", err)
				}
				snap.Close()
			}

			crash := cfg
			crash.FailStep, crash.FailRank = 6, tc.n-1
			if _, log, err := runReft(t, a, crash, tc.n); !errors.Is(err, train.ErrKilled) {
				t.Fatalf("the run with --fail-at 6:%d: %v, want ErrKilled\n%s", tc.n-1, err, log)
			} else if resumedRe.MatchString(log) {
				t.Fatalf("the first run resumed:\n%s", log)
			}
			got, log, err := runReft(t, a, crash, tc.n)
			if err != nil {
				t.Fatalf("relaunch: %v\n%s", err, log)
			}
			m := resumedRe.FindStringSubmatch(log)
			if m == nil || m[1] != "5" || got.ResumedFrom != 5 {
				t.Fatalf("relaunch resumed from %d, want 5 (the step before the failure)\n%s", got.ResumedFrom, log)
			}
			if first := lossRe.FindStringSubmatch(log); first == nil || first[1] != "6" {
				t.Errorf("the relaunch's first loss line is not step 6:\n%s", log)
			}
			if got.Hash != ref[0].Hash {
				t.Errorf("final-params-sha256 %s after the resume, %s uninterrupted", got.Hash, ref[0].Hash)
			}
			for _, l := range ref[0].Losses[5:] {
				if !slices.Contains(got.Losses, l) {
					t.Errorf("resumed run lacks the uninterrupted run's %+v; has %+v", l, got.Losses)
				}
			}
		})
	}
}

// TestReftUndoResume: no snapshots on the step path (--save-every 0), ZeRO-1
// over two ranks, and rank 1's optimizer update of step 6 fails after one
// tensor (--fail-in-update 6:1:1); rank 0's all-gather then fails after its
// whole update. Both undo, the JIT flush through the real client and agent
// saves step 5, and the relaunch resumes at 5 with the uninterrupted bits.
func TestReftUndoResume(t *testing.T) {
	for _, opt := range []string{train.Momentum, train.Adam, train.AdamW} {
		t.Run(opt, func(t *testing.T) {
			cfg := small()
			cfg.Optimizer, cfg.DP, cfg.Zero1, cfg.Steps, cfg.SaveEvery, cfg.JIT, cfg.Undo = opt, 2, true, 10, 0, true, true
			ref, a := referenceAndAgent(t, cfg, 2, "")
			crash := cfg
			crash.FailUpdateStep, crash.FailUpdateRank, crash.FailUpdateTensor = 6, 1, 1
			_, log, err := runReft(t, a, crash, 2)
			var ue *train.UndoneError
			if !errors.Is(err, train.ErrUpdateFailed) || !errors.As(err, &ue) || ue.Step != 5 || ue.Tensors != 1 {
				t.Fatalf("the run with --fail-in-update 6:1:1: %v, want rank 1's update undone on 1 tensor, back at step 5\n%s", err, log)
			}
			if !strings.Contains(log, "undo: step 6's update was interrupted") {
				t.Errorf("rank 0 did not log its undo:\n%s", log)
			}
			relaunchFromUndo(t, a, crash, ref[0].Hash)
		})
	}
}

// TestReftEvery0: the job runs --reft=arc,every=0, so the trainer's saves
// keep nothing (the client sends progress instead), and every rank stops
// inside step 6's update before its third tensor (--hold-in-update 6:2,
// the first two applied) when the agent reports a failed node: each rank's
// JIT flush interrupts the update, which is undone, and saves step 5; the
// relaunch resumes there, one step lost, with the uninterrupted bits.
// Without --undo rank 0 says once what every=0 then risks, and with
// --jit=false the run is refused.
func TestReftEvery0(t *testing.T) {
	for _, opt := range []string{train.SGD, train.Adam} {
		t.Run(opt, func(t *testing.T) {
			cfg := small()
			cfg.Optimizer, cfg.DP, cfg.Steps, cfg.JIT, cfg.Undo = opt, 2, 10, true, true
			ref, a := referenceAndAgent(t, cfg, 2, "arc,every=0")
			crash := cfg
			crash.HoldUpdateStep, crash.HoldUpdateTensor = 6, 2
			held := make(chan string, 2)
			go func() {
				for range 2 {
					<-held
				}
				a.NotifyPeerFailure("n2", "test: node lost while the ranks are inside the update")
			}()
			var clog lineLog
			_, log, err := runReftHooks(t, a, crash, 2, hooks{note: func(msg string) { held <- msg },
				clientLog: func(r int, msg string) { clog.add(fmt.Sprintf("rank %d: %s", r, msg)) }})
			var ue *train.UndoneError
			if !errors.Is(err, train.ErrUpdateInterrupted) || !errors.As(err, &ue) || ue.Step != 5 || ue.Tensors != 2 {
				t.Fatalf("the held run: %v, want the update of step 6 interrupted and undone on 2 tensors, back at step 5\n%s", err, log)
			}
			// Inside step 6's update every rank had passed its all-reduce:
			// no step-back is needed, and none is tried aloud.
			if l := clog.String(); strings.Contains(l, "not stepped back") || strings.Count(l, "JIT save of step 5 committed") != 2 {
				t.Errorf("want one plain JIT save of step 5 per rank and no step-back line:\n%s", l)
			}
			if !strings.Contains(log, "every=0: no snapshot on the step path") || !strings.Contains(log, "undo: step 6's update was interrupted") {
				t.Errorf("rank 0 did not log every=0 and its undo:\n%s", log)
			}
			relaunchFromUndo(t, a, crash, ref[0].Hash)
		})
	}
	t.Run("without undo", func(t *testing.T) {
		cfg := small()
		cfg.DP, cfg.Steps, cfg.Undo = 2, 3, false
		_, a := referenceAndAgent(t, cfg, 2, "arc,every=0")
		_, log, err := runReft(t, a, cfg, 2)
		if err != nil || strings.Count(log, "every=0 without --undo") != 1 {
			t.Errorf("every=0 without --undo: %v; want one warning line from rank 0 in:\n%s", err, log)
		}
	})
	t.Run("jit off", func(t *testing.T) {
		cfg := small()
		cfg.DP, cfg.Steps, cfg.JIT = 2, 3, false
		_, a := referenceAndAgent(t, cfg, 2, "arc,every=0")
		if _, _, err := runReft(t, a, cfg, 2); err == nil || !strings.Contains(err.Error(), "--jit=false: nothing would ever be saved") {
			t.Errorf("every=0 with --jit=false: %v, want a refusal", err)
		}
	})
}

// referenceAndAgent runs cfg on n ranks without snapshots (the
// uninterrupted bits) and starts a conformance agent protecting spec ("":
// its default), closed when the test ends.
func referenceAndAgent(t *testing.T, cfg train.Config, n int, spec string) ([]*train.Result, *agenttest.Agent) {
	t.Helper()
	ref, errs := train.RunLocal(cfg, n, nil)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	a, err := agenttest.Start(agenttest.Options{Spec: spec, Log: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return ref, a
}

// TestReftStraddle: survivors on either side of a step boundary. Over
// DP=4, ranks 2 and 3 stay after the gradient all-reduce of step 7, before
// their update (--hold-before-update 7:2,3, standing in for ranks still
// blocked in an all-reduce that the others finished), holding step 6,
// while ranks 0 and 1 finish step 7. Under arc each save holds the rank's
// shard of the replicated state and its ring successor's, so neither step
// has every shard: 7 lacks shard 3 (saved by ranks 0 and 1: shards 0-2),
// 6 lacks shard 1 (ranks 2 and 3: shards 2, 3, 0). With the step-back at
// the failure notice, ranks 0 and 1 save 6 and 7, ranks 2 and 3 save 5 and
// 6, and the relaunch resumes at 6, one step lost, with the uninterrupted
// bits, rather than from scratch (every=0) or step 4 (--save-every 4).
// With DP=2 one rank's save holds both shards, so a step that one survivor
// saved is restorable for both: the relaunch resumes at 7. Once every
// rank's flush is done the test tears the world down, as Slurm ends a step
// whose node died.
func TestReftStraddle(t *testing.T) {
	for _, tc := range []struct {
		name, spec string
		every      int64
		opt        string
		dp         int
		held       []int
		want       int64
	}{
		{"every=0 sgd dp4", "arc,every=0", 1, train.SGD, 4, []int{2, 3}, 6},
		{"every=0 adam dp4", "arc,every=0", 1, train.Adam, 4, []int{2, 3}, 6},
		{"save-every 4 momentum dp4", "", 4, train.Momentum, 4, []int{2, 3}, 6},
		{"save-every 4 adamw dp4", "", 4, train.AdamW, 4, []int{2, 3}, 6},
		{"every=0 adam dp2", "arc,every=0", 1, train.Adam, 2, []int{1}, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := small()
			cfg.Optimizer, cfg.DP, cfg.Steps, cfg.SaveEvery, cfg.JIT, cfg.Undo = tc.opt, tc.dp, 10, tc.every, true, true
			ref, a := referenceAndAgent(t, cfg, tc.dp, tc.spec)
			crash := cfg
			crash.HoldBeforeStep, crash.HoldBeforeRanks = 7, tc.held
			notes := make(chan string, tc.dp)
			backs := make(chan string, tc.dp)
			var mu sync.Mutex
			lines := map[int][]string{}
			worlds := make(chan *train.LocalWorld, 1)
			var seen []string
			done := make(chan struct{})
			go func() {
				defer close(done)
				w := <-worlds
				defer w.Abort()
				for range tc.dp {
					seen = append(seen, <-notes)
				}
				a.NotifyPeerFailure("n2", "test: node lost inside step 7's all-reduce")
				for range tc.dp {
					select {
					case <-backs:
					case <-time.After(time.Minute):
						t.Errorf("not every rank's flush stepped back within a minute")
						return
					}
				}
			}()
			_, log, err := runReftHooks(t, a, crash, tc.dp, hooks{
				note:  func(msg string) { notes <- msg },
				world: func(w *train.LocalWorld) { worlds <- w },
				clientLog: func(r int, msg string) {
					mu.Lock()
					lines[r] = append(lines[r], msg)
					mu.Unlock()
					if strings.Contains(msg, "JIT save of steps") {
						backs <- msg
					}
				},
			})
			<-done
			if !errors.Is(err, train.ErrAborted) {
				t.Fatalf("the held run: %v, want every rank ended by the world's abort after the flushes\n%s", err, log)
			}
			all := strings.Join(seen, "\n")
			for r := range tc.dp {
				note := fmt.Sprintf("rank %d finished step 7", r)
				back := "JIT save of steps 6 and 7 (step 7's update undone, saved, redone)"
				if slices.Contains(tc.held, r) {
					note = fmt.Sprintf("rank %d holds after step 7's gradient all-reduce", r)
					back = "JIT save of steps 5 and 6 (step 6's update undone, saved, redone)"
				}
				if !strings.Contains(all, note) {
					t.Errorf("no note %q in:\n%s", note, all)
				}
				mu.Lock()
				rl := strings.Join(lines[r], "\n")
				mu.Unlock()
				if !strings.Contains(rl, back) {
					t.Errorf("rank %d's client did not log %q:\n%s", r, back, rl)
				}
			}
			if strings.Contains(log, "step 7 loss") {
				t.Errorf("rank 0 logged step 7's loss, which needs the held ranks:\n%s", log)
			}
			got, log, err := runReft(t, a, crash, tc.dp)
			if err != nil {
				t.Fatalf("relaunch: %v\n%s", err, log)
			}
			if got.ResumedFrom != tc.want {
				t.Errorf("resumed from %d, want %d\n%s", got.ResumedFrom, tc.want, log)
			}
			if got.Hash != ref[0].Hash {
				t.Errorf("resumed hash %s, uninterrupted %s", got.Hash, ref[0].Hash)
			}
		})
	}
}

// TestReftStepBackRefused: where the step-back is not correct (ZeRO-1's
// parameter shards) the trainer does not offer it and rank 0 says once
// why, in a job that saves less often than every step; --hold-before-update,
// which needs it, is refused there. A pipeline has it (no line).
func TestReftStepBackRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		n      int
		layout func(*train.Config)
		want   string
	}{
		{"zero1", 2, func(c *train.Config) { c.DP, c.Zero1, c.Optimizer = 2, true, train.Adam }, "undo: no JIT step-back under --zero1"},
		{"pp2", 2, func(c *train.Config) { c.DP, c.PP = 1, 2 }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := small()
			cfg.Steps, cfg.SaveEvery, cfg.JIT, cfg.Undo = 3, 2, true, true
			tc.layout(&cfg)
			_, a := referenceAndAgent(t, cfg, tc.n, "")
			_, log, err := runReft(t, a, cfg, tc.n)
			if tc.want == "" {
				if err != nil || strings.Contains(log, "no JIT step-back") {
					t.Errorf("%v; want no step-back refusal in:\n%s", err, log)
				}
				return
			}
			if err != nil || strings.Count(log, tc.want) != 1 {
				t.Errorf("%v; want one line %q from rank 0 in:\n%s", err, tc.want, log)
			}
			held := cfg
			held.HoldBeforeStep, held.HoldBeforeRanks = 2, []int{0}
			if _, _, err := runReft(t, a, held, tc.n); err == nil || !strings.Contains(err.Error(), "--hold-before-update with --zero1") {
				t.Errorf("--hold-before-update: %v, want a refusal", err)
			}
		})
	}
}

// TestReftStepBackRedo: the step-back is transparent to a trainer that
// goes on (a failure notice with no failure, or a SIGTERM flush before the
// kill): at a notice once both ranks hold step 3, every rank's flush waits for
// the trainer to reach a collective, undoes its last update, saves that
// step and the one before, redoes the update, and the run ends with the
// bits of an uninterrupted one. (The session is given without its update
// interrupt, uninterrupted: a notice landing inside an update would
// otherwise stop the run, as it should at a real failure.)
func TestReftStepBackRedo(t *testing.T) {
	for _, opt := range []string{train.SGD, train.Momentum, train.Adam, train.AdamW} {
		t.Run(opt, func(t *testing.T) {
			cfg := small()
			cfg.Optimizer, cfg.DP, cfg.Steps, cfg.JIT, cfg.Undo = opt, 2, 40, true, true
			// Paced, so that the notice (sent at step 3) lands inside the
			// run; if it came after, the sessions' close would cut the flush
			// and the check of its lines below fails, loudly.
			cfg.MinStep = 2 * time.Millisecond
			ref, a := referenceAndAgent(t, cfg, 2, "arc,every=0")
			var mu sync.Mutex
			backs := map[int]string{}
			started := 0
			snap := func(s *reftSnap) train.Snapshotter {
				return uninterrupted{s: s, onSave: func(step int64) {
					mu.Lock()
					defer mu.Unlock()
					if step == 3 { // after the update of step 3
						if started++; started == 2 {
							a.NotifyPeerFailure("n2", "test: a notice while training goes on")
						}
					}
				}}
			}
			got, log, err := runReftHooks(t, a, cfg, 2, hooks{snap: snap, clientLog: func(r int, msg string) {
				mu.Lock()
				defer mu.Unlock()
				if strings.Contains(msg, "JIT save of steps") {
					backs[r] = msg
				}
			}})
			if err != nil {
				t.Fatalf("%v\n%s", err, log)
			}
			if got.Hash != ref[0].Hash {
				t.Errorf("final-params-sha256 %s after the step-back and redo, %s uninterrupted", got.Hash, ref[0].Hash)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(backs) != 2 {
				t.Errorf("step-back saves by rank: %v, want one per rank", backs)
			}
			t.Logf("step-back saves by rank: %v", backs)
		})
	}
}

// uninterrupted is the session without SetUpdateInterrupt: a flush that
// finds the trainer updating waits for the update to end rather than stop
// it, so that a test of a trainer that goes on after a flush is not
// timing-bound. onSave, if set, is called at each Save first.
type uninterrupted struct {
	s      *reftSnap
	onSave func(step int64)
}

func (u uninterrupted) Register(name string, buf []byte, replicated bool) error {
	return u.s.Register(name, buf, replicated)
}
func (u uninterrupted) Save(step int64) (train.Waiter, error) {
	if u.onSave != nil {
		u.onSave(step)
	}
	return u.s.Save(step)
}
func (u uninterrupted) Restore() (int64, bool, error) { return u.s.Restore() }
func (u uninterrupted) Close() error                  { return nil } // runReftHooks closes the session
func (u uninterrupted) Consistent(step int64)         { u.s.Consistent(step) }
func (u uninterrupted) Updating()                     { u.s.Updating() }
func (u uninterrupted) Every() int                    { return u.s.Every() }
func (u uninterrupted) SetStepBack(fn func(context.Context, int64) (int64, func() error, error)) {
	u.s.SetStepBack(fn)
}

// lineLog collects lines from several goroutines.
type lineLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *lineLog) add(s string) {
	l.mu.Lock()
	l.lines = append(l.lines, s)
	l.mu.Unlock()
}

func (l *lineLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}
