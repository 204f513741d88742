package client_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/logging/logtest"
	"github.com/reft-hpc/reft/client"
	"github.com/reft-hpc/reft/tests/conformance-agent/agenttest"
)

// lineLog collects a client's log lines.
type lineLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *lineLog) log(msg string) {
	l.mu.Lock()
	l.lines = append(l.lines, msg)
	l.mu.Unlock()
}

func (l *lineLog) all() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

func (l *lineLog) wait(t *testing.T, want string) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(l.all(), want); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no log line with %q; the client logged:\n%s", want, l.all())
		}
	}
}

// syncBuf is a log destination the agent writes while the test reads.
type syncBuf = logtest.Buffer

// commits counts the agent's committed generations.
func committedCount(s *syncBuf) int { return len(s.Events("committed")) }

// jitRank is one rank of a JIT test: a client on a real agent with one
// registered buffer whose contents are a function of the step.
type jitRank struct {
	a    *agenttest.Agent
	c    *client.Client
	buf  []byte
	log  *lineLog
	agnt *syncBuf
}

func newJITRank(t *testing.T, wait time.Duration) *jitRank {
	t.Helper()
	ab := &syncBuf{}
	a := startAgentWith(t, agenttest.Options{Log: zerolog.New(ab).Level(zerolog.DebugLevel)})
	r := &jitRank{a: a, buf: make([]byte, 64<<10), log: &lineLog{}, agnt: ab}
	r.c = open(t, a, client.Options{Log: r.log.log, JITWait: wait, ChunkSize: 16 << 10})
	if err := r.c.Register("state", r.buf, client.Replicated); err != nil {
		t.Fatal(err)
	}
	return r
}

// step trains step: Updating, the update (the buffer becomes step's), Consistent.
func (r *jitRank) step(step int64) {
	r.c.Updating()
	pattern(r.buf, int(step))
	r.c.Consistent(step)
}

func (r *jitRank) save(t *testing.T, step int64) {
	t.Helper()
	if err := r.c.Save(step).Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

// waitGeneration waits until the agent lists step for the rank.
func (r *jitRank) waitGeneration(t *testing.T, step int64) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		gens, err := r.c.Generations(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(gens, step) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("step %d never committed; generations %v; client log:\n%s", step, gens, r.log.all())
		}
	}
}

// checkRestores restores step into a zeroed buffer and checks its bytes.
func (r *jitRank) checkRestores(t *testing.T, step int64) {
	t.Helper()
	clear(r.buf)
	if err := r.c.RestoreStep(ctxT(t), step); err != nil {
		t.Fatal(err)
	}
	mustEqual(t, fmt.Sprintf("restored step %d", step), r.buf, patterned(len(r.buf), int(step)))
}

// TestJITFlush covers what a flush saves, table-driven over where the
// trainer stands when it is asked: the consistent step if newer than the
// last committed one, nothing when there is none or it is committed.
func TestJITFlush(t *testing.T) {
	cases := []struct {
		name      string
		prepare   func(t *testing.T, r *jitRank)
		wantStep  int64
		wantSaved bool
	}{
		{"nothing declared", func(t *testing.T, r *jitRank) { pattern(r.buf, 1); r.save(t, 1) }, -1, false},
		{"newer than the last save", func(t *testing.T, r *jitRank) {
			r.step(10)
			r.save(t, 10)
			r.step(11)
			r.step(12)
		}, 12, true},
		{"already committed", func(t *testing.T, r *jitRank) { r.step(10); r.save(t, 10) }, 10, false},
		{"restored, not changed since", func(t *testing.T, r *jitRank) {
			r.step(5)
			r.save(t, 5)
			r.step(6)
			if err := r.c.RestoreStep(ctxT(t), 5); err != nil {
				t.Fatal(err)
			}
			r.c.Consistent(5)
		}, 5, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newJITRank(t, 0)
			tc.prepare(t, r)
			before := committedCount(r.agnt)
			step, saved, err := r.c.Flush(ctxT(t), "test")
			if err != nil || step != tc.wantStep || saved != tc.wantSaved {
				t.Fatalf("Flush = %d, %v, %v; want %d, %v, nil", step, saved, err, tc.wantStep, tc.wantSaved)
			}
			if got, want := committedCount(r.agnt)-before, map[bool]int{true: 1, false: 0}[tc.wantSaved]; got != want {
				t.Errorf("the flush committed %d generation(s), want %d", got, want)
			}
			if tc.wantSaved {
				if !strings.Contains(r.log.all(), fmt.Sprintf("JIT save of step %d committed", step)) {
					t.Errorf("no JIT save line for step %d:\n%s", step, r.log.all())
				}
				r.checkRestores(t, step)
			}
		})
	}
}

// TestJITNoticeSavesNewestConsistentStep: a peer failure notice from the
// agent makes the watcher save the consistent step, between the
// trainer's periodic saves, with the step's bytes.
func TestJITNoticeSavesNewestConsistentStep(t *testing.T) {
	r := newJITRank(t, 0)
	if err := r.c.WatchFailures(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	for s := int64(1); s <= 13; s++ {
		r.step(s)
		if s%5 == 0 {
			r.save(t, s)
		}
	}
	// Blocked in a collective now, holding step 13.
	r.a.NotifyPeerFailure("n2", "peer_lost: EOF")
	r.log.wait(t, "JIT save of step 13 committed")
	if !strings.Contains(r.log.all(), "node n2 failed: peer_lost: EOF") {
		t.Errorf("the JIT line does not name the failure:\n%s", r.log.all())
	}
	r.checkRestores(t, 13)
}

// TestJITWaitsWhileUpdating: a notice during an update saves nothing until
// the trainer declares the step consistent, then that step; with no
// consistent step in time the flush gives up and says so.
func TestJITWaitsWhileUpdating(t *testing.T) {
	t.Run("consistent later", func(t *testing.T) {
		r := newJITRank(t, 0)
		if err := r.c.WatchFailures(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		r.step(10)
		r.save(t, 10)
		r.step(11)
		r.c.Updating() // the update of step 12 runs
		pattern(r.buf, 99)
		r.a.NotifyPeerFailure("n3", "peer_lost: reset")
		time.Sleep(100 * time.Millisecond) // the flush would have saved by now
		if gens, _ := r.c.Generations(ctxT(t)); slices.Contains(gens, 11) || slices.Contains(gens, 12) {
			t.Fatalf("a flush saved during the update: generations %v", gens)
		}
		pattern(r.buf, 12)
		r.c.Consistent(12)
		r.waitGeneration(t, 12)
		r.log.wait(t, "JIT save of step 12 committed")
		r.checkRestores(t, 12)
	})
	t.Run("gives up", func(t *testing.T) {
		r := newJITRank(t, 150*time.Millisecond)
		if err := r.c.WatchFailures(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		r.step(10)
		r.save(t, 10)
		r.c.Updating() // blocked in the update's own collective, for good
		before := committedCount(r.agnt)
		r.a.NotifyPeerFailure("n3", "peer_lost: reset")
		r.log.wait(t, "did not reach a consistent step")
		if n := committedCount(r.agnt) - before; n != 0 {
			t.Errorf("%d commits after a flush that gave up", n)
		}
	})
}

// TestJITUpdatingWaitsForFlushCopy: Updating returns only once the flush's
// copy is done, so the saved step is never torn.
func TestJITUpdatingWaitsForFlushCopy(t *testing.T) {
	r := newJITRank(t, 0)
	r.c.Hint(time.Nanosecond) // the copier waits for idle windows: only the flush's hurry moves it
	r.step(7)
	flushed := make(chan error, 1)
	go func() {
		_, saved, err := r.c.Flush(context.Background(), "test")
		if err == nil && !saved {
			err = fmt.Errorf("nothing saved")
		}
		flushed <- err
	}()
	r.c.Updating()
	pattern(r.buf, 8) // would tear step 7 if the copy still ran
	r.c.Consistent(8)
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	gens, err := r.c.Generations(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(gens, 7) {
		r.checkRestores(t, 7)
	} else {
		// Updating won the race: the flush then waited and saved step 8.
		r.checkRestores(t, 8)
	}
}

// TestJITNoDuplicateSave: the trainer's save of a step the flush has just
// saved (buffers unchanged) is that save, and a notice for a step already
// saved saves nothing; one notice per failed node.
func TestJITNoDuplicateSave(t *testing.T) {
	r := newJITRank(t, 0)
	if err := r.c.WatchFailures(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	r.step(15)
	r.a.NotifyPeerFailure("n4", "peer_lost: EOF")
	r.log.wait(t, "JIT save of step 15 committed")
	commits := committedCount(r.agnt)
	r.save(t, 15) // the trainer's every-5 save of the same step
	if n := committedCount(r.agnt) - commits; n != 0 {
		t.Errorf("the trainer's save of the flushed step committed %d more generation(s), want 0", n)
	}
	r.a.NotifyPeerFailure("n5", "peer_lost: EOF")
	r.log.wait(t, "step 15 is already saved")
	if n := committedCount(r.agnt) - commits; n != 0 {
		t.Errorf("a notice for a saved step committed %d generation(s)", n)
	}
	// After an update the same step number is a new save (the trainer
	// redoing a step), not the flush's.
	r.step(15)
	r.save(t, 15)
	if n := committedCount(r.agnt) - commits; n != 1 {
		t.Errorf("a save after an update committed %d generation(s), want 1", n)
	}
}

// jitChildEnv makes the test binary a rank that installs FlushOnSignal
// (TestJITFlushOnSIGTERM's child).
const jitChildEnv = "REFT_JIT_SIGTERM_CHILD"

// TestJITFlushOnSIGTERM: a rank that installed FlushOnSignal saves its
// consistent step at SIGTERM, then dies of SIGTERM as it would have.
func TestJITFlushOnSIGTERM(t *testing.T) {
	if sock := os.Getenv(jitChildEnv); sock != "" {
		jitSigtermChild(sock)
		return
	}
	a := startAgent(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestJITFlushOnSIGTERM$", "-test.count=1")
	cmd.Env = append(os.Environ(), jitChildEnv+"="+a.Socket)
	var out syncBuf
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(out.String(), "ready\n"); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("the child never got ready:\n%s", out.String())
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Errorf("the child ended with %v, want death by SIGTERM:\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "JIT save of step 13 committed") || !strings.Contains(out.String(), "signal terminated") {
		t.Errorf("the child did not log its JIT save of step 13 at the signal:\n%s", out.String())
	}
	// The child's rank 0 generation 13 is in the agent's store.
	c := open(t, a, client.Options{})
	buf := make([]byte, 4096)
	if err := c.Register("state", buf, client.Replicated); err != nil {
		t.Fatal(err)
	}
	if err := c.RestoreStep(ctxT(t), 13); err != nil {
		t.Fatalf("restore of the flushed step: %v\n%s", err, out.String())
	}
	mustEqual(t, "step 13", buf, patterned(len(buf), 13))
}

// jitSigtermChild trains to step 13 (saving every 5), installs the signal
// flush, says ready and blocks as in a collective until the signal ends it.
func jitSigtermChild(sock string) {
	ctx := context.Background()
	c, err := client.Open(ctx, client.Options{Socket: sock, Log: func(m string) { fmt.Println("reft:", m) }})
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(2)
	}
	buf := make([]byte, 4096)
	if err := c.Register("state", buf, client.Replicated); err != nil {
		fmt.Println("register:", err)
		os.Exit(2)
	}
	c.FlushOnSignal(3 * time.Second)
	for s := int64(1); s <= 13; s++ {
		c.Updating()
		pattern(buf, int(s))
		c.Consistent(s)
		if s%5 == 0 {
			if err := c.Save(s).Wait(ctx); err != nil {
				fmt.Println("save:", err)
				os.Exit(2)
			}
		}
	}
	fmt.Println("ready")
	time.Sleep(time.Hour)
}

// TestJITStepBack: a flush with a step-back (SetStepBack) has the trainer
// undo the consistent step s's update, saves s-1, has it redo the update
// and saves s, so that survivors still inside step s can agree with it;
// not when the client already holds s-1, at most once per client, and a
// refusal leaves s saved alone and says so.
func TestJITStepBack(t *testing.T) {
	t.Run("no step-back to step 0", func(t *testing.T) {
		r := newJITRank(t, 0)
		r.c.SetStepBack(func(context.Context, int64) (int64, func() error, error) {
			t.Error("step-back of step 1: step 0 is where every rank starts")
			return 0, nil, fmt.Errorf("called")
		})
		r.step(1)
		if step, saved, err := r.c.Flush(ctxT(t), "test"); err != nil || step != 1 || !saved {
			t.Fatalf("Flush = %d, %v, %v; want 1, true, nil", step, saved, err)
		}
		r.checkRestores(t, 1)
	})
	for _, tc := range []struct {
		name      string
		savedPrev bool  // the trainer saved step 6 itself
		savedCur  bool  // the trainer saved step 7 itself
		back      int64 // the step the trainer steps back to; -1: it refuses; -2: none needed
		wantCalls int
		wantGens  []int64
		wantLog   string
	}{
		{"flush saves 6 then 7", false, false, 6, 1, []int64{6, 7}, "JIT save of steps 6 and 7 (step 7's update undone, saved, redone)"},
		{"7 saved by the trainer, saved again after 6", false, true, 6, 1, []int64{6, 7}, "JIT save of steps 6 and 7"},
		{"6 held: no step-back", true, false, 6, 0, []int64{6, 7}, "JIT save of step 7 committed"},
		{"the trainer refuses", false, false, -1, 1, []int64{7}, "step 7 not stepped back, so step 6 is not saved: no update kept"},
		{"the trainer steps back too far", false, false, 5, 1, []int64{7}, "step 7 not stepped back, so step 6 is not saved: the trainer stepped back to step 5, not 6"},
		{"none needed: silent", false, false, -2, 1, []int64{7}, "JIT save of step 7 committed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newJITRank(t, 0)
			calls, redos := 0, 0
			r.c.SetStepBack(func(ctx context.Context, step int64) (int64, func() error, error) {
				calls++
				if step != 7 {
					t.Errorf("step-back of step %d, want 7", step)
				}
				switch tc.back {
				case -1:
					return 0, nil, fmt.Errorf("no update kept")
				case -2:
					return 0, nil, fmt.Errorf("restored: %w", client.ErrStepBackNotNeeded)
				}
				pattern(r.buf, int(tc.back))
				return tc.back, func() error { redos++; pattern(r.buf, int(step)); return nil }, nil
			})
			r.step(6)
			if tc.savedPrev {
				r.save(t, 6)
			}
			r.step(7)
			if tc.savedCur {
				r.save(t, 7)
			}
			step, saved, err := r.c.Flush(ctxT(t), "test")
			if err != nil || step != 7 || !saved {
				t.Fatalf("Flush = %d, %v, %v; want 7, true, nil\n%s", step, saved, err, r.log.all())
			}
			if calls != tc.wantCalls || (tc.back >= 0 && redos != calls) {
				t.Errorf("step-back called %d times, redo %d; want %d each", calls, redos, tc.wantCalls)
			}
			mustEqual(t, "the buffer after the flush", r.buf, patterned(len(r.buf), 7))
			if !strings.Contains(r.log.all(), tc.wantLog) {
				t.Errorf("client log lacks %q:\n%s", tc.wantLog, r.log.all())
			}
			if tc.back == -2 && strings.Contains(r.log.all(), "not stepped back") {
				t.Errorf("a step-back that was not needed was logged:\n%s", r.log.all())
			}
			// Once per client: a second flush (the trainer's own, after its
			// collective failed) steps back no further.
			if _, _, err := r.c.Flush(ctxT(t), "again"); err != nil || calls != tc.wantCalls {
				t.Errorf("second Flush: %v, step-back calls %d, want %d", err, calls, tc.wantCalls)
			}
			gens, err := r.c.Generations(ctxT(t))
			if err != nil {
				t.Fatal(err)
			}
			slices.Sort(gens)
			if !slices.Equal(gens, tc.wantGens) {
				t.Errorf("generations %v, want %v", gens, tc.wantGens)
			}
			for _, s := range gens {
				r.checkRestores(t, s)
			}
		})
	}
}
