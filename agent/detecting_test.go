package agent

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/detect"
	"github.com/reft-hpc/reft/agent/logging/logtest"
	"github.com/reft-hpc/reft/agent/metrics"
	"github.com/reft-hpc/reft/agent/proto"
)

// TestProgress: the progress heartbeat and saves feed hang detection's
// table; a closed connection's rank leaves it.
func TestProgress(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	s, err := Listen(sock, Info{Job: "42", Node: "n1", Spec: "arc", Version: "test", UID: os.Getuid()}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	st := openTestStore(t, t.TempDir(), 0, 0)
	s.AttachStore(st)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	defer func() {
		cancel()
		<-done
		st.Close()
	}()

	c := newClient(t, sock)
	registered := false
	for _, tc := range []struct {
		name     string
		register bool
		step     int64
		code     string
	}{
		{"before register", false, 3, proto.CodeBadState},
		{"negative step", true, -2, proto.CodeInvalid},
		{"after register", true, 3, ""},
		{"next step", true, 4, ""},
	} {
		if tc.register && !registered {
			c.must(proto.TRegister, regReq(2, twoBufs...), nil)
			registered = true
		}
		var rep proto.StepReq
		if code := c.call(proto.TProgress, proto.StepReq{Step: tc.step}, &rep); code != tc.code {
			t.Errorf("%s: progress of step %d answered %q, want %q", tc.name, tc.step, code, tc.code)
		} else if code == "" && rep.Step != tc.step {
			t.Errorf("%s: reply step %d, want %d", tc.name, rep.Step, tc.step)
		}
	}
	// The process state is this test's own (it is the client): its main
	// thread's, running or asleep while another runs the test; two step
	// times are too few for a median.
	if got := s.progress.list(); len(got) != 1 || got[0].Rank != 2 || got[0].Step != 4 ||
		(got[0].Process != detect.ProcRunning && got[0].Process != detect.ProcSleeping) || got[0].StepTime != 0 {
		t.Fatalf("progress %+v, want rank 2 at step 4, process running or sleeping, no median yet", got)
	}
	c.saveFilled(5, 1) // a save is progress
	if got := s.progress.list(); len(got) != 1 || got[0].Step != 5 {
		t.Fatalf("progress after a save %+v, want step 5", got)
	}
	c.c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for len(s.progress.list()) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("progress %+v after the rank's connection closed, want none", s.progress.list())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestPeerFailureHooks(t *testing.T) {
	s := &Server{notes: newNotifier(zerolog.Nop(), nil)}
	var got []string
	s.notes.OnPeerFailure(func(f detect.Failure) { got = append(got, "a:"+f.Node) })
	s.notes.OnPeerFailure(func(f detect.Failure) { got = append(got, "b:"+f.Class) })
	s.notes.peerFailed(detect.Failure{Node: "n3", Class: detect.ClassNode})
	if len(got) != 2 || got[0] != "a:n3" || got[1] != "b:node" {
		t.Errorf("hooks saw %v, want both, in order", got)
	}
}

// TestPeerFailureHooksSeeTheVerdict: the first hook (the metrics
// textfile's kick, registered before any other) already sees the node
// lost and the failure counted with its latency: a kick that wrote the
// status before the lost node was added left reft_lost_nodes 0 in the
// file of an agent reft run stopped at once.
func TestPeerFailureHooksSeeTheVerdict(t *testing.T) {
	met := metrics.NewRecorder()
	s := &Server{notes: newNotifier(zerolog.Nop(), met)}
	var lost []string
	var counted, latencies uint64
	s.notes.OnPeerFailure(func(detect.Failure) {
		lost = s.notes.lostNodes()
		m := met.Status()
		counted, latencies = m.FailuresDetected["node"], m.DetectionSeconds.Count
	})
	s.notes.noticeFailures()
	now := time.Now()
	s.notes.peerFailed(detect.Failure{Node: "n2", Class: detect.ClassNode, LastHeard: now.Add(-2 * time.Second), DetectedAt: now})
	if !slices.Equal(lost, []string{"n2"}) || counted != 1 || latencies != 1 {
		t.Errorf("the first hook saw lost nodes %v, %d node failures, %d latencies; want [n2], 1, 1", lost, counted, latencies)
	}
}

// TestJITFlushFollowsVerdicts: with a detector running, a lost peer
// connection (a flap, or this node cut off) notifies no rank; the
// detector's published verdict does, once. Without a detector the lost
// connection is the signal.
func TestJITFlushFollowsVerdicts(t *testing.T) {
	for _, tc := range []struct {
		name     string
		detector bool
		lost     []string         // lost connections, in order
		verdicts []detect.Failure // published verdicts, after them
		want     []string         // notified nodes, in order
	}{
		{name: "lost connection, detector on", detector: true, lost: []string{"n2"}},
		{name: "verdict, detector on", detector: true, lost: []string{"n2"},
			verdicts: []detect.Failure{{Node: "n2", Class: detect.ClassNode, Cause: "x"}}, want: []string{"n2"}},
		{name: "hang verdict", detector: true,
			verdicts: []detect.Failure{{Node: "n3", Class: detect.ClassHang, Cause: "x"}}, want: []string{"n3"}},
		{name: "lost connection, detector off", lost: []string{"n2", "n2"}, want: []string{"n2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logBuf logtest.Buffer
			s := &Server{notes: newNotifier(zerolog.New(&logBuf), nil)}
			w := &watcher{out: make(chan proto.Notice, 8)}
			s.notes.watchers[w] = struct{}{}
			s.notes.flushOnLost.Store(!tc.detector)
			s.notes.noticeFailures()
			for _, n := range tc.lost {
				s.notes.peerLost(n, errors.New("connection reset"))
			}
			for _, f := range tc.verdicts {
				s.notes.peerFailed(f)
			}
			close(w.out)
			var got []string
			for n := range w.out {
				got = append(got, n.Node)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("notified %v, want %v", got, tc.want)
			}
		})
	}
}

// TestProgressStepTime: the median step time over a rank's recent
// progress, between the reports when they skip steps, none before
// minStepSamples, forgotten when another connection takes the rank over;
// and the communication phase shows as where the rank is.
func TestProgressStepTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tab := &progressTable{proc: func(int32) string { return detect.ProcSleeping }}
		a, b := &rankConn{pid: 10}, &rankConn{pid: 11}
		steps := []struct {
			after time.Duration
			step  int64
			want  time.Duration // the median after it
		}{
			{0, 1, 0},
			{100 * time.Millisecond, 2, 0},
			{100 * time.Millisecond, 3, 0},
			{100 * time.Millisecond, 3, 0},                      // the same step again (save and progress): no sample
			{400 * time.Millisecond, 5, 100 * time.Millisecond}, // reports skip a step: 500 ms since step 3's first report; samples 100 100 500
			{900 * time.Millisecond, 6, 300 * time.Millisecond}, // 100 100 500 900
			{200 * time.Millisecond, 7, 200 * time.Millisecond}, // 100 100 200 500 900
		}
		for i, st := range steps {
			time.Sleep(st.after)
			tab.note(a, 4, st.step)
			got := tab.list()
			if len(got) != 1 || got[0].Step != st.step || got[0].StepTime != st.want || got[0].Process != detect.ProcSleeping || !got[0].At.Equal(time.Now()) {
				t.Fatalf("after note %d (step %d): %+v, want step time %s", i, st.step, got, st.want)
			}
		}
		// Where: none before any phase, then each phase in turn, named
		// when the client named the collective.
		for _, ph := range []struct {
			active bool
			op     string
			want   string
		}{
			{true, "", "in a communication phase"},
			{false, "", "outside its collectives (its own computation or I/O) since its last communication phase ended"},
			{true, "gradient all-reduce", "in the collective gradient all-reduce"},
			{true, "ignored: the phase is unchanged", "in the collective gradient all-reduce"},
			{false, "", "outside its collectives (its own computation or I/O) since its last collective (gradient all-reduce) ended"},
		} {
			tab.comm(a, ph.active, ph.op)
			if got := tab.list(); got[0].Where != ph.want {
				t.Errorf("after comm(%v, %q): where %q, want %q", ph.active, ph.op, got[0].Where, ph.want)
			}
		}
		// A relaunched rank on a new connection starts afresh.
		time.Sleep(time.Second)
		tab.note(b, 4, 7)
		if got := tab.list(); len(got) != 1 || got[0].StepTime != 0 {
			t.Errorf("after another connection took rank 4: %+v, want no median", got)
		}
		for range stepSamples + 5 {
			time.Sleep(50 * time.Millisecond)
			tab.note(b, 4, tab.list()[0].Step+1)
		}
		if e := tab.ranks[4]; len(e.times) != stepSamples {
			t.Errorf("%d step times kept, want the last %d", len(e.times), stepSamples)
		}
	})
}

func TestParseProcState(t *testing.T) {
	for _, tc := range []struct{ stat, want string }{
		{"1234 (python3) S 1 1234 1234 0 -1", detect.ProcSleeping},
		{"1234 (python3) R 1 1234", detect.ProcRunning},
		{"1234 (reft-train) T 1 1234", detect.ProcStopped},
		{"1234 (gdb-traced) t 1", detect.ProcStopped},
		{"1234 (io) D 1", detect.ProcDiskSleep},
		{"1234 (dead) Z 1", detect.ProcZombie},
		{"1234 (kworker) I 2", detect.ProcSleeping},
		{"1234 (a) b (c)) T 1", detect.ProcStopped}, // a name with ") b (" in it
		{"1234 (x) W 1", ""},
		{"1234 (x)", ""},
		{"1234 (x)T", ""},
		{"garbage", ""},
		{"", ""},
	} {
		if got := parseProcState([]byte(tc.stat)); got != tc.want {
			t.Errorf("parseProcState(%q) = %q, want %q", tc.stat, got, tc.want)
		}
	}
}

// TestProcStateOfAProcess: a real process's state as a hang verdict sees
// it: asleep, stopped by SIGSTOP, asleep again after SIGCONT, and nothing
// once it is gone.
func TestProcStateOfAProcess(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := int32(cmd.Process.Pid)
	defer cmd.Process.Kill()
	until := func(want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for procState(pid) != want {
			if time.Now().After(deadline) {
				t.Fatalf("process state %q, want %q", procState(pid), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	until(detect.ProcSleeping)
	for _, step := range []struct {
		sig  syscall.Signal
		want string
	}{{syscall.SIGSTOP, detect.ProcStopped}, {syscall.SIGCONT, detect.ProcSleeping}} {
		if err := cmd.Process.Signal(step.sig); err != nil {
			t.Fatal(err)
		}
		until(step.want)
	}
	cmd.Process.Kill()
	cmd.Wait()
	until("")
}

// TestProgressCompute: a rank's own work per step is the span from the end
// of one communication phase to the start of the next (the wait for other
// ranks inside the phase left out); its median shows in the status reply
// with the step, the silence and whether the rank is in a phase now.
func TestProgressCompute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tab := &progressTable{}
		a := &rankConn{pid: 10}
		tab.note(a, 2, 1)
		phases := []struct {
			work, wait time.Duration // before the phase, in it
		}{
			{50 * time.Millisecond, 10 * time.Millisecond}, // no phase ended before: no sample
			{100 * time.Millisecond, 5 * time.Millisecond},
			{300 * time.Millisecond, 5 * time.Millisecond},
			{120 * time.Millisecond, 400 * time.Millisecond}, // a long wait is no work
		}
		for _, p := range phases {
			time.Sleep(p.work)
			tab.comm(a, true, "")
			tab.comm(a, true, "") // repeated: no new phase
			time.Sleep(p.wait)
			tab.comm(a, false, "")
		}
		tab.note(a, 2, 2)
		time.Sleep(time.Second)
		tab.comm(a, true, "")
		st := tab.status(time.Now())[2]
		if st == nil || st.ComputeS != 0.21 || st.Step != 2 || st.SilentS != 1 || !st.InComm {
			t.Errorf("status %+v, want step 2, compute median 0.21 s (of 100 120 300 1000 ms: 120 and 300), silent 1 s, in a phase", st)
		}
		if len(tab.status(time.Now())) != 1 {
			t.Errorf("status of %d ranks, want 1", len(tab.status(time.Now())))
		}
	})
}
