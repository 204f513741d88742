package agent

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/event"
	"github.com/reft-hpc/reft/agent/logging/logtest"
	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/agent/runrecord"
)

// lockedBuf is a run record in memory: the server writes it on the
// connections' goroutines.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) records(t *testing.T) []runrecord.Record {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []runrecord.Record
	for _, line := range bytes.Split(bytes.TrimSuffix(l.b.Bytes(), []byte{'\n'}), []byte{'\n'}) {
		r, err := runrecord.Decode(line)
		if err != nil {
			t.Fatalf("run record line %q: %v", line, err)
		}
		out = append(out, r)
	}
	return out
}

// TestRunRecord: what reft run decides on reaches the run record, not
// only the log: a rank's registration and each restore it is served,
// with the step its client's hello named and the client's pid.
func TestRunRecord(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	logs := &logtest.Buffer{}
	logs.CheckEvents(t)
	s, err := Listen(sock, Info{Job: "42", Node: "n1", Spec: "arc", Version: "test", UID: os.Getuid()}, zerolog.New(logs))
	if err != nil {
		t.Fatal(err)
	}
	var rec lockedBuf
	s.AttachRecord(runrecord.NewWriter(&rec, "n1", nil))
	st := openTestStore(t, t.TempDir(), 0, 0)
	s.AttachStore(st)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		st.Close()
	})

	c := newClient(t, sock)
	c.must(proto.THello, proto.Hello{Client: "test", PID: os.Getpid(), Step: "5", Rank: 2}, nil)
	c.must(proto.TRegister, regReq(2, twoBufs...), nil)
	c.saveFilled(7, 0xAB)
	var ar proto.ArenaReply
	c.must(proto.TRestore, proto.StepReq{Step: -1}, &ar)
	c.must(proto.TRelease, proto.StepReq{Step: ar.Step}, nil)

	got := rec.records(t)
	if len(got) != 2 {
		t.Fatalf("%d records, want a registration and a restore: %+v", len(got), got)
	}
	reg, res := got[0], got[1]
	if reg.Kind != runrecord.KindRegistered || reg.Node != "n1" || reg.Rank != 2 || reg.Step != "5" || reg.PID != os.Getpid() {
		t.Errorf("registration record %+v", reg)
	}
	if res.Kind != runrecord.KindRestored || res.Event != event.RestoreLocal || res.Rank != 2 || res.Step != "5" ||
		res.Generation != 7 || res.Bytes != 15_000 || res.PID != os.Getpid() || res.Reason != "" {
		t.Errorf("restore record %+v", res)
	}
}
