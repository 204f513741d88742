package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/detect"
	"github.com/reft-hpc/reft/agent/logging/logtest"
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
	if got := s.progress.list(); len(got) != 1 || got[0].Rank != 2 || got[0].Step != 4 {
		t.Fatalf("progress %+v, want rank 2 at step 4", got)
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
