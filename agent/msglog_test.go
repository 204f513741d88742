package agent

import (
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/tmpfs"
)

// TestLogRefusals: a message log request is refused, with the code and a
// message that says why, when the job has no store, when the connection
// registered no rank, and when a newer registration of its rank fenced it.
func TestLogRefusals(t *testing.T) {
	store, err := tmpfs.Open(tmpfs.Options{Root: t.TempDir(), JobID: "9"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	registered := func(regs *registry) *rankConn {
		rc := &rankConn{pid: 100, registered: true, key: tmpfs.Key{Rank: 3, Shard: tmpfs.DefaultShard}}
		regs.registered(rc, 3, 4, nil)
		return rc
	}
	for _, tc := range []struct {
		name  string
		store *tmpfs.Store
		conn  func(regs *registry) *rankConn
		code  string
		says  string
	}{
		{"no store", nil, registered, proto.CodeDisabled, "no snapshot store"},
		{"not registered", store, func(*registry) *rankConn { return &rankConn{pid: 100} }, proto.CodeBadState, "log_steps before register"},
		{"fenced", store, func(regs *registry) *rankConn {
			old := registered(regs)
			regs.registered(&rankConn{pid: 200, registered: true, key: old.key}, 3, 4, nil)
			return old
		}, proto.CodeBadState, "fenced from the rank's log (end it: the rank runs in pid 200 now)"},
		{"served", store, registered, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			regs := &registry{log: zerolog.Nop()}
			m := &msgLogs{attached: &attached{info: Info{Job: "9", MemoryBudget: 1 << 30}, store: tc.store}, regs: regs, warned: &onceWarnings{}}
			t.Cleanup(func() { m.close() })
			rc := tc.conn(regs)
			c := &bufConn{}
			if err := m.handle(c, rc, proto.Frame{Version: proto.Version, Type: proto.TLogSteps, ID: 1, Payload: []byte(`{"stream":"act>1"}`)}, zerolog.Nop()); err != nil {
				t.Fatal(err)
			}
			r, err := proto.Decode(&c.out)
			if err != nil {
				t.Fatal(err)
			}
			if tc.code == "" {
				var rep proto.LogStepsReply
				if r.Type != proto.TLogSteps|proto.ReplyBit || r.Unmarshal(&rep) != nil || rep.Steps == nil || len(rep.Steps) != 0 {
					t.Fatalf("reply %s %s, want an empty steps list", r.Type, r.Payload)
				}
				return
			}
			var e proto.Error
			if r.Type != proto.TError || r.Unmarshal(&e) != nil || e.Code != tc.code || !strings.Contains(e.Message, tc.says) {
				t.Fatalf("reply %s %s, want %s saying %q", r.Type, r.Payload, tc.code, tc.says)
			}
		})
	}
}
