package status

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/reft-hpc/reft/agent/proto"
)

// TestWarnings: each degraded state of an agent's status reply becomes one
// note; a healthy node and a spare without an agent have none.
func TestWarnings(t *testing.T) {
	healthy := func() *proto.Status {
		return &proto.Status{Node: "n1", Spec: "arc",
			Ranks: []proto.RankStatus{{Rank: 0, Newest: 7, Protection: &proto.RankProtection{Connected: true, Mode: proto.ProtectSharded, ARC: true,
				Group: "(pp=0,tp=0)", Members: []int{0, 1}}}},
			Peering: &proto.Peering{State: proto.PeeringOn, Peers: []proto.PeerStatus{{Node: "n2", Connected: true}, {Node: "n3"}}},
			Memory:  &proto.Memory{Held: 10, InUse: 20, Budget: 100}}
	}
	others := []NodeReport{{Node: "n2", InAllocation: true, Agent: AgentUp}, {Node: "n3", InAllocation: true, Agent: AgentNone}}
	for _, tc := range []struct {
		name   string
		node   NodeReport
		change func(*proto.Status)
		want   []string // substrings, one per warning
	}{
		{name: "healthy", want: nil},
		{name: "peering off", change: func(s *proto.Status) { s.Peering = &proto.Peering{State: proto.PeeringOff, Reason: "no scontrol"} },
			want: []string{"peering off: no scontrol"}},
		{name: "peer lost", change: func(s *proto.Status) { s.Peering.Peers[0].Connected = false }, want: []string{"not connected to n2"}},
		{name: "unpinned", change: func(s *proto.Status) { s.Memory.UnpinnedArenas = 2 }, want: []string{"2 arena(s) not pinned"}},
		{name: "saves failed", change: func(s *proto.Status) { s.Store = &proto.StoreCounters{SaveFailures: 3, NoSpace: 1, OverBudget: 2} },
			want: []string{"3 snapshot save(s) failed (1 tmpfs full, 2 over the memory budget"}},
		{name: "corrupt generation", change: func(s *proto.Status) { s.Store = &proto.StoreCounters{BadGenerations: 1, ChecksumFailures: 2} },
			want: []string{"1 generation(s) found corrupt (2 chunk(s) failed"}},
		{name: "store counters without failures", change: func(s *proto.Status) { s.Store = &proto.StoreCounters{Saves: 9, Commits: 9, Restores: 1} }},
		{name: "budget nearly used", change: func(s *proto.Status) { s.Memory.InUse = 95 }, want: []string{"memory budget 95% used"}},
		{name: "unprotected rank", change: func(s *proto.Status) { s.Ranks[0].Protection.Mode = proto.ProtectLocal },
			want: []string{"rank 0 is not protected across nodes"}},
		{name: "local under off is fine", change: func(s *proto.Status) { s.Spec = "off"; s.Ranks[0].Protection.Mode = proto.ProtectLocal }},
		{name: "nothing committed", change: func(s *proto.Status) { s.Ranks[0].Newest = -1 }, want: []string{"rank 0 has committed nothing yet"}},
		{name: "gpu failing", change: func(s *proto.Status) { s.GPU = &proto.GPU{State: proto.GPUFailing, Reason: "GPU 0: XID 79"} },
			want: []string{"GPU failing: GPU 0: XID 79"}},
		{name: "down node", node: NodeReport{Node: "n1", Agent: AgentDown, SlurmState: "DOWN*", InAllocation: true},
			want: []string{"Slurm says the node is DOWN*"}},
		{name: "spare", node: NodeReport{Node: "n1", Agent: AgentNone, SlurmState: "ALLOCATED", InAllocation: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nr := tc.node
			if nr.Agent == "" {
				st := healthy()
				if tc.change != nil {
					tc.change(st)
				}
				nr = NodeReport{Node: "n1", Agent: AgentUp, InAllocation: true, Status: st}
			}
			got := warnings(&nr, append([]NodeReport{nr}, others...))
			if len(got) != len(tc.want) {
				t.Fatalf("warnings %q, want %d like %q", got, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("warning %q, want it to name %q", got[i], w)
				}
			}
		})
	}
}

// TestPrint: the table's cells for an up node, a spare and a lost node,
// and the notes under it.
func TestPrint(t *testing.T) {
	up := &proto.Status{Node: "n1", Spec: "arc+aec",
		Ranks: []proto.RankStatus{
			{Rank: 0, Newest: 12, Protection: &proto.RankProtection{Connected: true, Mode: proto.ProtectSharded, ARC: true, AEC: 1, Group: "(pp=0,tp=0)", Position: 0, Members: []int{0, 2}}},
			{Rank: 1, Newest: 11, Protection: &proto.RankProtection{Connected: false, Mode: proto.ProtectSharded, ARC: true, AEC: 1, Group: "(pp=1,tp=0)", Position: 0, Members: []int{1, 3}}},
		},
		Peering: &proto.Peering{State: proto.PeeringOn, Peers: []proto.PeerStatus{{Node: "n2", Connected: true}, {Node: "n3"}}},
		Memory:  &proto.Memory{Held: 3 << 20, InUse: 8 << 20, Budget: 1 << 30}}
	rep := &Report{Job: "42", State: "RUNNING", User: "alice", Spec: "arc+aec", Nodes: []NodeReport{
		{Node: "n1", Agent: AgentUp, InAllocation: true, Status: up},
		{Node: "n2", Agent: AgentDown, InAllocation: false, Error: "no longer in the job's allocation"},
		{Node: "n3", Agent: AgentNone, InAllocation: true, Error: "no agent: the node runs no step of this job"},
	}}
	var b bytes.Buffer
	Print(&b, rep)
	lines := strings.Split(b.String(), "\n")
	for _, want := range []string{
		"job 42 (alice) RUNNING, --reft=arc+aec, 3 nodes",
		"n1    up     0,1    12,11      arc+aec:1 SG(pp=0,tp=0) 0/2; arc+aec:1 SG(pp=1,tp=0) 0/2 (rank gone)  1/1    3 MiB  8 MiB / 1 GiB",
		"n2    down   -      -          -",
		"n3    none   -      -          -",
		"  n2: no longer in the job's allocation",
		"  n3: no agent: the node runs no step of this job",
	} {
		if !slices.ContainsFunc(lines, func(l string) bool {
			return strings.TrimRight(l, " ") == strings.TrimRight(want, " ") || strings.HasPrefix(l, want)
		}) {
			t.Errorf("no line %q in:\n%s", want, b.String())
		}
	}
}
