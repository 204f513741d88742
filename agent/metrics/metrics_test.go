package metrics

import (
	"bytes"
	"os/exec"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/reft-hpc/reft/agent/proto"
)

// status is a two-rank node of an arc job with a little of everything.
func status(job, node string) proto.Status {
	rec := NewRecorder()
	rec.Snapshot(0.012)
	rec.Snapshot(0.5)
	rec.Encode(0.003)
	rec.Restore("peer", 1.5)
	rec.Failure("node", 3.2)
	rec.Failure("hang", -1) // latency unknown: counted, not observed
	rec.Replicated(4096, 0.02)
	return proto.Status{
		Job: job, Node: node, Spec: "arc", AgentVersion: "test", UptimeSeconds: 12,
		Ranks: []proto.RankStatus{
			{Rank: 0, Newest: 7, Bytes: 1 << 20, Protection: &proto.RankProtection{Connected: true, Mode: proto.ProtectSharded}},
			{Rank: 1, Newest: 6, Bytes: 1 << 20},
			{Rank: 2, Newest: -1}, // registered, nothing committed: no step sample
		},
		Peering: &proto.Peering{State: proto.PeeringOn, Peers: []proto.PeerStatus{{Node: "n2", Connected: true}, {Node: "n3", Met: true}}},
		Memory:  &proto.Memory{Budget: 8 << 30, InUse: 2 << 30, Held: 3 << 20, PinnedBytes: 1 << 30},
		Store:   &proto.StoreCounters{Commits: 14, SaveFailures: 0},
		MsgLog:  &proto.MsgLogStatus{Bytes: 5 << 20, AppendedBytes: 9 << 20},
		Metrics: rec.Status(),
	}
}

// parse reads text exposition format back.
func parse(t *testing.T, b []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("parsing the exposition back: %v\n%s", err, b)
	}
	return mfs
}

// sample is the value of name's sample with the given labels (all of
// them must match); ok false when there is none.
func sample(mfs map[string]*dto.MetricFamily, name string, labels map[string]string) (v float64, ok bool) {
	mf := mfs[name]
	if mf == nil {
		return 0, false
	}
next:
	for _, m := range mf.GetMetric() {
		have := map[string]string{}
		for _, lp := range m.GetLabel() {
			have[lp.GetName()] = lp.GetValue()
		}
		for k, v := range labels {
			if have[k] != v {
				continue next
			}
		}
		switch mf.GetType() {
		case dto.MetricType_COUNTER:
			return m.GetCounter().GetValue(), true
		case dto.MetricType_GAUGE:
			return m.GetGauge().GetValue(), true
		case dto.MetricType_HISTOGRAM:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

// promtool runs `promtool check metrics` on b (make deps installs it).
func promtool(t *testing.T, b []byte) {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: make deps installs Debian's prometheus package, which has it")
	}
	cmd := exec.Command(path, "check", "metrics")
	cmd.Stdin = bytes.NewReader(b)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool check metrics: %v\n%s\n--- input:\n%s", err, out, b)
	}
}

func TestWriteParsesBack(t *testing.T) {
	var buf bytes.Buffer
	if err := Write(&buf, status("42", "n1"), status("42", "n2")); err != nil {
		t.Fatal(err)
	}
	promtool(t, buf.Bytes())
	mfs := parse(t, buf.Bytes())
	for name, kind := range Families() {
		mf := mfs[name]
		if mf == nil {
			t.Errorf("family %s missing", name)
			continue
		}
		if got := strings.ToLower(mf.GetType().String()); got != kind {
			t.Errorf("%s is a %s, want %s", name, got, kind)
		}
	}
	if len(mfs) != len(Families()) {
		t.Errorf("%d families written, %d declared", len(mfs), len(Families()))
	}
	n1 := func(extra ...string) map[string]string {
		l := map[string]string{"job_id": "42", "node": "n1"}
		for i := 0; i+1 < len(extra); i += 2 {
			l[extra[i]] = extra[i+1]
		}
		return l
	}
	tests := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"reft_committed_step", n1("rank", "0"), 7},
		{"reft_committed_step", n1("rank", "1"), 6},
		{"reft_snapshot_bytes", n1("rank", "0"), 1 << 20},
		{"reft_snapshot_duration_seconds", n1(), 2},
		{"reft_redundancy_encode_seconds", n1(), 1},
		{"reft_restore_duration_seconds", n1("source", "peer"), 1},
		{"reft_restore_duration_seconds", n1("source", "local"), 0},
		{"reft_failures_detected_total", n1("class", "node"), 1},
		{"reft_failures_detected_total", n1("class", "hang"), 1},
		{"reft_failures_detected_total", n1("class", "agent"), 0},
		{"reft_failure_detection_latency_seconds", n1(), 1},
		{"reft_replication_bytes_total", n1(), 4096},
		{"reft_replication_duration_seconds", n1(), 1},
		{"reft_peers", n1(), 2},
		{"reft_peers_connected", n1(), 1},
		{"reft_protection_degraded", n1(), 1},
		{"reft_protection_degraded_reason", n1("reason", ReasonPeerLost), 1},
		{"reft_protection_degraded_reason", n1("reason", ReasonPeering), 0},
		{"reft_memory_budget_bytes", n1(), 8 << 30},
		{"reft_memory_used_bytes", n1(), 2 << 30},
		{"reft_memory_held_bytes", n1(), 3 << 20},
		{"reft_snapshots_committed_total", n1(), 14},
		{"reft_msglog_bytes", n1(), 5 << 20},
		{"reft_msglog_appended_bytes_total", n1(), 9 << 20},
		{"reft_agent_info", n1("spec", "arc", "version", "test"), 1},
		{"reft_committed_step", map[string]string{"job_id": "42", "node": "n2", "rank": "0"}, 7},
	}
	for _, tt := range tests {
		got, ok := sample(mfs, tt.name, tt.labels)
		if !ok || got != tt.want {
			t.Errorf("%s%v = %v (found %v), want %v", tt.name, tt.labels, got, ok, tt.want)
		}
	}
	if _, ok := sample(mfs, "reft_committed_step", n1("rank", "2")); ok {
		t.Error("rank 2 committed nothing yet, but has a committed step sample")
	}
	// The histogram's buckets made the trip: 0.012 s is below 16 ms.
	for _, m := range mfs["reft_snapshot_duration_seconds"].GetMetric() {
		for _, b := range m.GetHistogram().GetBucket() {
			if b.GetUpperBound() == 0.016 && b.GetCumulativeCount() != 1 {
				t.Errorf("snapshot le=0.016 count %d, want 1", b.GetCumulativeCount())
			}
		}
		if s := m.GetHistogram().GetSampleSum(); s != 0.512 {
			t.Errorf("snapshot sum %v, want 0.512", s)
		}
	}
}

// An agent's status without the metrics section (an older agent) still
// gives the families it carries, and valid text.
func TestWriteWithoutMetricsSection(t *testing.T) {
	st := status("7", "a")
	st.Metrics, st.Peering, st.Memory, st.Store = nil, nil, nil, nil
	var buf bytes.Buffer
	if err := Write(&buf, st); err != nil {
		t.Fatal(err)
	}
	promtool(t, buf.Bytes())
	mfs := parse(t, buf.Bytes())
	if _, ok := mfs["reft_committed_step"]; !ok {
		t.Error("committed step missing")
	}
	if _, ok := mfs["reft_snapshot_duration_seconds"]; ok {
		t.Error("a status without timings gave a snapshot histogram")
	}
}

func TestDegraded(t *testing.T) {
	on := &proto.Peering{State: proto.PeeringOn, Peers: []proto.PeerStatus{{Node: "b", Connected: true}}}
	local := []proto.RankStatus{{Rank: 0, Protection: &proto.RankProtection{Connected: true, Mode: proto.ProtectLocal}}}
	tests := []struct {
		name string
		st   proto.Status
		want []string
	}{
		{"arc, all well", proto.Status{Spec: "arc", Peering: on}, nil},
		{"arc, peering off", proto.Status{Spec: "arc", Peering: &proto.Peering{State: proto.PeeringOff}}, []string{ReasonPeering}},
		{"arc, no peering section", proto.Status{Spec: "arc"}, []string{ReasonPeering}},
		{"aec:2, a peer lost", proto.Status{Spec: "aec:2", Peering: &proto.Peering{State: proto.PeeringOn, Peers: []proto.PeerStatus{{Node: "b", Met: true}}}}, []string{ReasonPeerLost}},
		{"arc, a spare without an agent", proto.Status{Spec: "arc,spares=1", Peering: &proto.Peering{State: proto.PeeringOn,
			Peers: []proto.PeerStatus{{Node: "b", Connected: true, Met: true}, {Node: "s"}}}}, nil},
		{"arc, a peer published lost before it was met", proto.Status{Spec: "arc", LostNodes: []string{"b"}, Peering: &proto.Peering{State: proto.PeeringOn,
			Peers: []proto.PeerStatus{{Node: "b"}}}}, []string{ReasonPeerLost}},
		{"arc, placement", proto.Status{Spec: "arc", Peering: on, PlacementWarnings: []string{"x"}}, []string{ReasonPlacement}},
		{"aor, a rank local only", proto.Status{Spec: "aor", Peering: on, Ranks: local}, []string{ReasonRankLocal}},
		{"arc, failed saves", proto.Status{Spec: "arc", Peering: on, Store: &proto.StoreCounters{SaveFailures: 2}}, []string{ReasonSaveFailures}},
		{"unparsable spec: nothing asked across nodes", proto.Status{Spec: "?", Ranks: local}, nil},
		{"off", proto.Status{Spec: "off"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Degraded(&tt.st); !slices.Equal(got, tt.want) {
				t.Errorf("Degraded = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestNilRecorder(t *testing.T) {
	var r *Recorder
	r.Snapshot(1)
	r.Encode(1)
	r.Restore("local", 1)
	r.Failure("node", 1)
	r.Replicated(1, 1)
	if r.Status() != nil {
		t.Error("a nil recorder has a metrics section")
	}
}

// TestStatusPairsFailureAndLatency: a snapshot taken while failures are
// recorded (the textfile's tick beside the detector's verdict) never has
// a failure counted without its latency, nor a replica's bytes without
// its duration: a scrape in between said one node failure with no
// detection latency.
func TestStatusPairsFailureAndLatency(t *testing.T) {
	r := NewRecorder()
	const n = 20000
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range n {
			r.Failure("node", 1.5)
			r.Replicated(100, 0.01)
		}
	}()
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		m := r.Status()
		if f, d := m.FailuresDetected["node"], m.DetectionSeconds.Count; f != d {
			t.Fatalf("a snapshot with %d node failures and %d latencies", f, d)
		}
		if b, c := m.ReplicationBytes, m.ReplicationSeconds.Count; b != 100*c {
			t.Fatalf("a snapshot with %d replicated bytes and %d replicas of 100", b, c)
		}
	}
}
