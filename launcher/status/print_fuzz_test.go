package status

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/reft-hpc/reft/agent/proto"
)

// FuzzStatusReply: `reft status` decodes each agent's status reply (bytes
// off the network, as ask does) and prints it with its warnings; no reply
// panics that, and every node still gets its line.
func FuzzStatusReply(f *testing.F) {
	full, err := json.Marshal(proto.Status{Job: "42", Node: "n1", Spec: "arc", Ranks: []proto.RankStatus{{Rank: 0}},
		Peering: &proto.Peering{}, GPU: &proto.GPU{}, Memory: &proto.Memory{Held: 1, Budget: 2}, Store: &proto.StoreCounters{},
		PlacementWarnings: []string{"x"}, LostNodes: []string{"n2"}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(full, []byte(`{"node":"n2","spec":"arc+aec,dp=2","ranks":[{"rank":-1}],"peering":{"peers":[{"node":"n1"}]}}`))
	f.Add([]byte(`{"memory":{"held":-1,"budget":0},"store":{},"gpu":{"devices":[{}]}}`), []byte(`{}`))
	f.Add([]byte(`null`), []byte(`{"ranks":null,"lost_nodes":["n1","n1"]}`))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		rep := &Report{Job: "42", State: "RUNNING", User: "alice"}
		for i, raw := range [][]byte{a, b} {
			nr := NodeReport{Node: []string{"n1", "n2"}[i], Index: i, InAllocation: true, Agent: AgentDown, Error: "x"}
			var st proto.Status
			if json.Unmarshal(raw, &st) == nil {
				nr.Agent, nr.Error, nr.Status = AgentUp, "", &st
			}
			rep.Nodes = append(rep.Nodes, nr)
		}
		for i := range rep.Nodes {
			rep.Nodes[i].Warnings = warnings(&rep.Nodes[i], rep.Nodes)
		}
		var out strings.Builder
		Print(&out, rep)
		for _, n := range []string{"n1", "n2"} {
			if !strings.Contains(out.String(), n) {
				t.Fatalf("node %s missing from:\n%s", n, out.String())
			}
		}
	})
}
