package agent

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/agent/shard"
	"github.com/reft-hpc/reft/spank/spec"
)

// fuzzSpecs are the --reft SPECs FuzzRegister lays registrations out
// under: node-local, and each sharded layout.
var fuzzSpecs = []string{"off", "arc,dp=2", "aec,dp=3", "arc+aec:2,dp=4", "arc+aor,dp=2", "aec+aor,dp=4,pp=1,tp=1"}

// FuzzRegister: a register request comes from any process of the job's
// user on the agent's socket. Decoded and checked as register does, it is
// either refused or laid out (identity, scatter or sharded) into sections
// and regions that satisfy the protocol's own rules (proto.CheckLayout):
// applyLayout treats a violation as an agent bug, so none must exist for
// any request the checks let through.
func FuzzRegister(f *testing.F) {
	seed := func(sp uint8, scatter bool, req proto.Register) {
		b, err := json.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, sp, scatter)
	}
	plain := []proto.BufferSpec{{Name: "w", Size: 10000, Replicated: true}, {Name: "opt", Size: 777}, {Name: "e", Replicated: true}}
	seed(0, false, proto.Register{Rank: 0, World: 1, Buffers: plain})
	seed(0, true, proto.Register{Rank: 0, World: 1, ChunkSize: 4096, Buffers: plain})
	seed(1, false, proto.Register{Rank: 1, World: 2, Layout: "dp=2", Buffers: plain})
	seed(2, false, proto.Register{Rank: 2, World: 3, Buffers: plain})
	seed(3, false, proto.Register{Rank: 3, World: 4, Buffers: append(slices.Clone(plain), proto.BufferSpec{Name: "big", Size: 1 << 40, Replicated: true})})
	aorBufs := []proto.BufferSpec{{Name: "grads", Size: 4 * 64, Replicated: true},
		{Name: "m", Size: 4 * 32, AOR: &proto.AOR{Optimizer: "momentum", State: "m", Momentum: 0.9, Grad: "grads", Shards: [][2]int64{{0, 32}, {32, 32}}, Index: 1}}}
	seed(4, false, proto.Register{Rank: 1, World: 2, Buffers: aorBufs})
	seed(1, false, proto.Register{Rank: 0, World: 2, Buffers: []proto.BufferSpec{{Name: "a", Size: 1 << 62, Replicated: true}, {Name: "b", Size: 1 << 62, Replicated: true}}})
	seed(0, false, proto.Register{Rank: 0, World: 1, Buffers: []proto.BufferSpec{{Name: "a", Size: 9223372036854771712}, {Name: "b", Size: 4096}}})
	f.Add([]byte(`{"rank":0,"world":1,"buffers":[{"name":"a@b","size":-1}]}`), uint8(0), false)
	f.Fuzz(func(t *testing.T, payload []byte, spIdx uint8, scatter bool) {
		var req proto.Register
		if err := (proto.Frame{Payload: payload}).Unmarshal(&req); err != nil {
			return
		}
		sp, err := spec.Parse(fuzzSpecs[int(spIdx)%len(fuzzSpecs)])
		if err != nil {
			t.Fatal(err)
		}
		if checkRegister(sp, req) != nil {
			return
		}
		si, err := shard.NewGeometry(sp, req)
		if err != nil {
			return
		}
		_ = whyLocal(sp, req, si)
		s := &snapshots{}
		if scatter {
			s.layout = scatterLayout
		}
		tspec, secs, size, agentSecs, err := s.planLayout(req, si)
		if err != nil {
			return
		}
		if size <= 0 {
			t.Fatalf("arena of %d bytes", size)
		}
		layout := newReplyLayout(tspec.Sources, secs, tspec.Regions)
		layout.sections = slices.DeleteFunc(layout.sections, func(sec proto.Section) bool { return slices.Contains(agentSecs, sec.Name) })
		if err := layout.check(size, true); err != nil {
			t.Fatalf("a checked registration laid out against the protocol: %v", err)
		}
	})
}
