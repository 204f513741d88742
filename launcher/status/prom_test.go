package status

import (
	"bytes"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/reft-hpc/reft/agent/metrics"
	"github.com/reft-hpc/reft/agent/proto"
)

// TestWriteProm: `reft status --prom` prints every answering node's
// families, labelled by node, and says on stderr which nodes gave none.
func TestWriteProm(t *testing.T) {
	st := func(node string, step int64) *proto.Status {
		return &proto.Status{Job: "42", Node: node, Spec: "arc", Ranks: []proto.RankStatus{{Rank: 0, Newest: step}},
			Peering: &proto.Peering{State: proto.PeeringOn}, Memory: &proto.Memory{Budget: 1 << 30},
			Store: &proto.StoreCounters{}, Metrics: metrics.NewRecorder().Status()}
	}
	r := &Report{Job: "42", Nodes: []NodeReport{
		{Node: "n1", Agent: AgentUp, Status: st("n1", 5)},
		{Node: "n2", Agent: AgentDown, Error: "connection refused"},
		{Node: "n3", Agent: AgentNone},
		{Node: "n4", Agent: AgentUp, Status: st("n4", 4)},
	}}
	var out, errb bytes.Buffer
	if err := WriteProm(&out, &errb, r); err != nil {
		t.Fatal(err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(out.Bytes()))
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for name := range metrics.Families() {
		if mfs[name] == nil {
			t.Errorf("%s missing", name)
		}
	}
	steps := map[string]float64{}
	for _, m := range mfs["reft_committed_step"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "node" {
				steps[l.GetValue()] = m.GetGauge().GetValue()
			}
		}
	}
	if len(steps) != 2 || steps["n1"] != 5 || steps["n4"] != 4 {
		t.Errorf("committed steps by node %v, want n1 5 and n4 4", steps)
	}
	if e := errb.String(); !strings.Contains(e, "n2: agent down: connection refused; no metrics from it") || strings.Contains(e, "n3") {
		t.Errorf("stderr %q: want n2 named (down), n3 (a spare) not", e)
	}
}
