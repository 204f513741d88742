package run

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/agent/runrecord"
	"github.com/reft-hpc/reft/launcher/recoverylog"
)

// TestFailGrace: srun is killed at once only after a node verdict on a
// step cancelled in Slurm; otherwise it gets SIGTERM and the grace.
func TestFailGrace(t *testing.T) {
	node := AgentFailure{Node: "n2", Class: recoverylog.KindNode, Quorum: true}
	suspect := AgentFailure{Node: "n2", Class: recoverylog.KindAgent, Suspect: true}
	for _, tc := range []struct {
		name      string
		f         AgentFailure
		cancelled bool
		stopGrace time.Duration
		want      time.Duration
	}{
		{"node lost, step cancelled", node, true, time.Minute, 0},
		{"node lost, cancel failed or step id unknown", node, false, time.Minute, failStopGrace},
		{"node lost, cancel failed, shorter --stop-grace", node, false, time.Second, time.Second},
		{"suspect node kept", suspect, true, time.Minute, failStopGrace},
		{"agent lost", AgentFailure{Node: "n2", Class: recoverylog.KindAgent}, true, time.Minute, failStopGrace},
		{"hang", AgentFailure{Node: "n3", Class: recoverylog.KindHang, Ranks: []int{2}}, true, time.Minute, failStopGrace},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := failGrace(tc.f, tc.cancelled, tc.stopGrace); got != tc.want {
				t.Errorf("failGrace = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestRelaunchDelay: no backoff for the first relaunch after a spare took
// a lost node's slot; the backoff as before otherwise.
func TestRelaunchDelay(t *testing.T) {
	for _, tc := range []struct {
		name    string
		stalled int
		swapped bool
		want    time.Duration
	}{
		{"node swapped, progress", 0, true, 0},
		{"node swapped after a stalled relaunch", 1, true, 2 * time.Second},
		{"same nodes (rank, agent, hang, lost spare)", 0, false, time.Second},
		{"same nodes, stalled twice", 2, false, 4 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := relaunchDelay(time.Second, time.Minute, tc.stalled, tc.swapped); got != tc.want {
				t.Errorf("relaunchDelay = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestRunNodeLossPhases: after a node verdict srun is killed without
// SIGTERM, the probe that stops the agents runs while reft run waits out
// verdictSettle (so the probe phase is that wait, not the two one after
// the other), and the relaunch with the spare starts without run.backoff
// (a minute here). On fake time: the phases are exact.
func TestRunNodeLossPhases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		alloc := []string{"n1", "n2", "n3", "n4", "n5"}
		pol := fastPolicy()
		pol.Backoff, pol.BackoffMax = config.Duration(time.Minute), config.Duration(time.Hour)
		h := newHarness(t, alloc, 1, pol,
			fakeAttempt{block: true, agentLog: map[string][]string{"n1": {agentFailureLine("n1", "n2", "node", "", 0.8)}}},
			fakeAttempt{exit: 0, agentLog: resumeLogs("2", 5, "n1", "n5", "n3", "n4")})
		probeTook := 900 * time.Millisecond // within fastPolicy's probe timeout
		h.f.stopAgents = func(ctx context.Context, _ int, nodes []string) (map[string]AgentReport, error) {
			time.Sleep(probeTook)
			return committedReports(nodes, 6), nil
		}
		if code := h.r.Run(context.Background()); code != ExitOK {
			t.Fatalf("exit %d\n%s", code, h.out.String())
		}
		if slices.Contains(h.f.signals, os.Signal(syscall.SIGTERM)) || !slices.Contains(h.f.signals, os.Signal(syscall.SIGKILL)) {
			t.Errorf("srun got %v; want SIGKILL only", h.f.signals)
		}
		if len(h.f.stopped) != 1 {
			t.Errorf("agents stopped %v, want one probe", h.f.stopped)
		}
		ev := h.events()
		fs, rl := find(ev, recoverylog.FailureDetected), find(ev, recoverylog.StepRelaunched)
		if len(fs) != 1 || len(rl) != 1 {
			t.Fatalf("events %v\n%s", names(ev), h.out.String())
		}
		// The relaunch starts once verdictSettle is waited out after the
		// verdict, which reft run reads on its first tick (the probe ended
		// within the wait), not after the wait, the probe and the backoff.
		if d := rl[0].Time.Sub(fs[0].Time); d < verdictSettle || d >= verdictSettle+probeTook/2 {
			t.Errorf("relaunched %v after the failure, want verdictSettle (%v) and a tick: the probe and the wait did not overlap, or the backoff ran\n%s",
				d, verdictSettle, h.out.String())
		}
	})
}

// TestSettleFindsAnotherNode: a second node found lost while the
// overlapped probe runs (its srun would wait for that node's slurmd)
// cancels that probe; the agents are asked again on the allocation
// without either node, and the answer of an agent the first probe had
// already stopped is kept, so the newest committed step is still known
// (and a lost node's is not).
func TestSettleFindsAnotherNode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		alloc := []string{"n1", "n2", "n3", "n4", "n5", "n6"}
		h := newHarness(t, alloc, 2, fastPolicy(),
			fakeAttempt{block: true, agentLog: map[string][]string{"n1": {agentFailureLine("n1", "n2", "node", "", 0.8)}}},
			fakeAttempt{exit: 0, agentLog: resumeLogs("2", 5, "n1", "n5", "n6", "n4")})
		h.f.stopAgents = func(ctx context.Context, call int, nodes []string) (map[string]AgentReport, error) {
			if call > 0 {
				reps := committedReports(nodes, 6)
				reps["n1"] = AgentReport{Node: "n1", Error: "no agent answers"} // the first probe stopped it
				return reps, nil
			}
			// n3 is found lost while this probe runs: n1's agent
			// answered (and stopped), n3's slurmd never will.
			line := strings.ReplaceAll(agentFailureLine("n1", "n3", "node", "", 0.9), nowMark, time.Now().Format(time.RFC3339Nano))
			fh, err := os.OpenFile(filepath.Join(h.logDir, runrecord.FileName("n1")), os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				return nil, err
			}
			fh.WriteString(line + "\n")
			fh.Close()
			<-ctx.Done()
			// n3's answer came before it died; it is lost now, and its
			// newer step is no survivor's.
			reps := committedReports([]string{"n1"}, 6)
			reps["n3"] = committedReports([]string{"n3"}, 9)["n3"]
			return reps, ctx.Err()
		}
		if code := h.r.Run(context.Background()); code != ExitOK {
			t.Fatalf("exit %d\n%s", code, h.out.String())
		}
		if want := [][]string{{"n1", "n3", "n4", "n5", "n6"}, {"n1", "n4", "n5", "n6"}}; !slices.EqualFunc(h.f.stopped, want, slices.Equal) ||
			!slices.EqualFunc(h.f.shrunk, want, slices.Equal) {
			t.Errorf("agents stopped on %v, job shrunk to %v; want %v for both", h.f.stopped, h.f.shrunk, want)
		}
		ev := h.events()
		fs, rl := find(ev, recoverylog.FailureDetected), find(ev, recoverylog.StepRelaunched)
		if len(fs) != 1 || !slices.Equal(fs[0].Nodes, []string{"n2", "n3"}) || fs[0].Generation != 6 {
			t.Fatalf("failure_detected %+v, want n2 and n3 lost with step 6 committed\n%s", fs, h.out.String())
		}
		if len(rl) != 1 || !slices.Equal(rl[0].Nodes, []string{"n1", "n5", "n6", "n4"}) {
			t.Errorf("step_relaunched %+v, want n1 n5 n6 n4", rl)
		}
		if !strings.Contains(h.out.String(), "asking the agents again on n1,n4,n5,n6") {
			t.Errorf("reft run did not say why it probed twice:\n%s", h.out.String())
		}
	})
}

// TestStopPIDZombie: an agent that exited is stopped even while its
// parent has not reaped it (a zombie; the test process is the parent and
// does not wait until stopPID returns).
func TestStopPIDZombie(t *testing.T) {
	for _, tc := range []struct {
		name string
		argv []string
	}{
		{"ends on SIGTERM", []string{"sleep", "60"}},
		{"already exited", []string{"true"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(tc.argv[0], tc.argv[1:]...)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Wait()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := stopPID(ctx, cmd.Process.Pid); err != nil {
				t.Fatalf("stopPID: %v", err)
			}
			if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid)); err != nil || !strings.Contains(string(b), ") Z ") {
				t.Errorf("the process is not a zombie after stopPID (%v): %q", err, b)
			}
		})
	}
}

func TestProcState(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want byte
		bad  bool
	}{
		{"1234 (reft-agent) S 1 1234 1234 0 -1", 'S', false},
		{"1234 (reft-agent) Z 1 1234", 'Z', false},
		{"1234 (a) b) c) X 1", 'X', false}, // a comm with ") "
		{"1234 (reft-agent)", 0, true},
		{"1234 reft-agent S", 0, true},
		{"", 0, true},
	} {
		got, err := procState([]byte(tc.in))
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("procState(%q) = %q, %v; want %q (error: %v)", tc.in, got, err, tc.want, tc.bad)
		}
	}
}

// TestWaitRanksGone: the stop waits until no rank is connected (the
// ranks' last saves done), at most the bound, and hands back the agent's
// last status.
func TestWaitRanksGone(t *testing.T) {
	// connected ranks of the first, and rank 0's newest step; Clients
	// stays high, as an agent's does while closed sessions wind down.
	status := func(connected int, newest int64) *proto.Status {
		st := &proto.Status{Clients: 4}
		for r := 0; r < 3; r++ {
			rs := proto.RankStatus{Rank: r, Newest: newest}
			if r < connected {
				rs.Progress = &proto.RankProgress{Step: newest}
			}
			st.Ranks = append(st.Ranks, rs)
		}
		return st
	}
	errGone := fmt.Errorf("no agent answers")
	for _, tc := range []struct {
		name       string
		first      *proto.Status
		later      []*proto.Status // the answers to the queries that follow, the last repeated
		laterErr   error
		wantNewest int64
		wantOpen   int
		wantWait   time.Duration
	}{
		{"no rank connected", status(0, 17), nil, nil, 17, 0, 0},
		{"ranks flush, then close", status(3, 17), []*proto.Status{status(3, 17), status(2, 18), status(0, 18)}, nil, 18, 0, 3 * flushPoll},
		{"ranks never close", status(2, 17), []*proto.Status{status(2, 17)}, nil, 17, 2, time.Second},
		{"the agent stops answering", status(1, 17), nil, errGone, 17, 1, flushPoll},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				n := 0
				query := func(context.Context) (*proto.Status, error) {
					if tc.laterErr != nil {
						return nil, tc.laterErr
					}
					st := tc.later[min(n, len(tc.later)-1)]
					n++
					return st, nil
				}
				st, open, waited := waitRanksGone(t.Context(), query, tc.first, time.Second, flushPoll)
				if st.Ranks[0].Newest != tc.wantNewest || open != tc.wantOpen || waited != tc.wantWait {
					t.Errorf("newest %d, open %d, waited %v; want %d, %d, %v", st.Ranks[0].Newest, open, waited, tc.wantNewest, tc.wantOpen, tc.wantWait)
				}
			})
		})
	}
}

// TestStatusLocalStopWaitsForFlush: `status-local --stop-agent` on an
// agent whose ranks are still connected (saving their JIT flush) waits
// until they let go, reports the step their flush committed, then stops
// the agent. Without the wait the report said step 17 and the agent was
// stopped under the ranks' save.
func TestStatusLocalStopWaitsForFlush(t *testing.T) {
	dir := t.TempDir()
	runDir := filepath.Join(dir, "run")
	os.MkdirAll(filepath.Join(runDir, "42"), 0o700)
	conf := filepath.Join(dir, "reft.toml")
	os.WriteFile(conf, []byte("[agent]\nrun_dir = \""+runDir+"\"\n"), 0o644)
	t.Setenv("SLURMD_NODENAME", "n1")
	agentProc := exec.Command("sleep", "60") // the agent's pid: what --stop-agent stops
	if err := agentProc.Start(); err != nil {
		t.Fatal(err)
	}
	defer agentProc.Wait()
	defer agentProc.Process.Kill()

	var mu sync.Mutex
	queries := 0
	fakeStatusAgent(t, socketPath(runDir, "42"), func() proto.Status {
		mu.Lock()
		defer mu.Unlock()
		queries++
		// Rank 0 connected for the first queries, its flush (step 18)
		// committed on the third, its connection closed from the fifth.
		newest := int64(17)
		progress := &proto.RankProgress{Step: 17}
		if queries >= 3 {
			newest = 18
		}
		if queries >= 5 {
			progress = nil
		}
		// Clients stays 4: closed sessions winding down count.
		return proto.Status{Job: "42", Node: "n1", PID: agentProc.Process.Pid, Clients: 4,
			Ranks: []proto.RankStatus{{Rank: 0, Newest: newest, Generations: []int64{newest}, Progress: progress}}}
	})

	var out, errb strings.Builder
	if code := StatusLocal([]string{"--config", conf, "--job", "42", "--stop-agent", "--flush-wait", "20s"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	r := ParseReports([]byte(out.String()), []string{"n1"})["n1"]
	if !r.OK || !r.Stopped || r.OpenAtStop != 0 || r.Status == nil || r.Status.Ranks[0].Newest != 18 {
		t.Fatalf("report %+v (%s): want the agent stopped after its ranks let go, with their flush (step 18) in the report", r, out.String())
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", agentProc.Process.Pid)); err != nil || !strings.Contains(string(b), ") Z ") {
		t.Errorf("the agent was not stopped (%v): %q", err, b)
	}
}
