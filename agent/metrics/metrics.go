// Package metrics is reft's Prometheus export (docs/METRICS.md): the
// families every agent writes for node_exporter's textfile collector
// (Textfile) and `reft status --prom` prints, all built from agent status
// replies (proto.Status) by one Collector, so both say the same thing.
// Timings the status reply would otherwise lack are kept by a Recorder in
// the agent and carried in the reply's metrics section.
package metrics

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/spank/spec"
)

// Label values a family is always written with (zero until something
// happens), so that rate() and increase() see the first event.
var (
	// FailureClasses are agent/detect's classes.
	FailureClasses = []string{"node", "agent", "hang"}
	// RestoreSources are where a restore took its bytes from.
	RestoreSources = []string{"local", "peer", "decode", "persistent"}
)

// Histogram buckets, in seconds.
var (
	snapshotBuckets    = prometheus.ExponentialBuckets(0.001, 2, 16)  // 1 ms .. 33 s
	encodeBuckets      = prometheus.ExponentialBuckets(0.0005, 2, 16) // 0.5 ms .. 16 s
	restoreBuckets     = prometheus.ExponentialBuckets(0.01, 2, 14)   // 10 ms .. 82 s
	detectionBuckets   = prometheus.ExponentialBuckets(0.25, 2, 10)   // 0.25 s .. 128 s
	replicationBuckets = prometheus.ExponentialBuckets(0.001, 2, 16)
)

// Recorder keeps what the agent times and counts as it happens. Its
// methods are safe for concurrent use (prometheus' metrics are atomic);
// Status snapshots them for the status reply. A record that moves two
// metrics (Failure: the counter and the latency; Replicated) does so
// under mu, as Status reads, so that no snapshot (a textfile, a carry)
// has one without the other. A nil Recorder records nothing (a Server
// some tests build without Listen).
type Recorder struct {
	mu          sync.Mutex // Failure, Replicated and Status
	snapshot    prometheus.Histogram
	encode      prometheus.Histogram
	restore     *prometheus.HistogramVec
	detection   prometheus.Histogram
	failures    *prometheus.CounterVec
	replBytes   prometheus.Counter
	replSeconds prometheus.Histogram
	carried     *proto.Metrics // the job's earlier agents' counts on this node (Carry)
}

// NewRecorder returns a Recorder with nothing observed.
func NewRecorder() *Recorder {
	h := func(b []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h", Buckets: b})
	}
	r := &Recorder{
		snapshot: h(snapshotBuckets), encode: h(encodeBuckets), detection: h(detectionBuckets),
		restore:     prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "h", Buckets: restoreBuckets}, []string{"source"}),
		failures:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c"}, []string{"class"}),
		replBytes:   prometheus.NewCounter(prometheus.CounterOpts{Name: "c"}),
		replSeconds: h(replicationBuckets),
	}
	for _, c := range FailureClasses {
		r.failures.WithLabelValues(c)
	}
	for _, s := range RestoreSources {
		r.restore.WithLabelValues(s)
	}
	return r
}

// Snapshot records a committed save: seconds from its save request.
func (r *Recorder) Snapshot(seconds float64) {
	if r != nil {
		r.snapshot.Observe(seconds)
	}
}

// Encode records a commit's redundancy encode.
func (r *Recorder) Encode(seconds float64) {
	if r != nil {
		r.encode.Observe(seconds)
	}
}

// Restore records a served restore from source (one of RestoreSources).
func (r *Recorder) Restore(source string, seconds float64) {
	if r == nil {
		return
	}
	r.restore.WithLabelValues(source).Observe(seconds)
}

// Failure records a failure the detector published, of class, detected
// latency seconds after the node's last sign of life (< 0: unknown, not
// observed).
func (r *Recorder) Failure(class string, latency float64) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures.WithLabelValues(class).Inc()
	if latency >= 0 {
		r.detection.Observe(latency)
	}
}

// Replicated records a background replica committed here.
func (r *Recorder) Replicated(bytes int64, seconds float64) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.replBytes.Add(float64(max(bytes, 0)))
	r.replSeconds.Observe(seconds)
}

// Status is the status reply's metrics section: what was recorded so far,
// plus what Carry brought from the job's earlier agents on the node.
func (r *Recorder) Status() *proto.Metrics {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	m := &proto.Metrics{
		SnapshotSeconds: histOf(r.snapshot), EncodeSeconds: histOf(r.encode), DetectionSeconds: histOf(r.detection),
		ReplicationSeconds: histOf(r.replSeconds), ReplicationBytes: uint64(read(r.replBytes).GetCounter().GetValue()),
		RestoreSeconds: map[string]*proto.Histogram{}, FailuresDetected: map[string]uint64{},
	}
	for _, s := range RestoreSources {
		m.RestoreSeconds[s] = histOf(r.restore.WithLabelValues(s))
	}
	for _, c := range FailureClasses {
		m.FailuresDetected[c] = uint64(read(r.failures.WithLabelValues(c)).GetCounter().GetValue())
	}
	return addMetrics(m, r.carried)
}

func read(m prometheus.Metric) *dto.Metric {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		// Write of the library's own histograms and counters cannot fail.
		panic(fmt.Sprintf("metrics: reading a %T: %v", m, err))
	}
	return &d
}

func histOf(o prometheus.Observer) *proto.Histogram {
	d := read(o.(prometheus.Metric)).GetHistogram()
	h := &proto.Histogram{Count: d.GetSampleCount(), Sum: d.GetSampleSum()}
	for _, b := range d.GetBucket() {
		h.Buckets = append(h.Buckets, proto.Bucket{LE: b.GetUpperBound(), Count: b.GetCumulativeCount()})
	}
	return h
}

// family is one exported metric family.
type family struct {
	name, help string
	kind       string // counter, gauge, histogram
	labels     []string
	desc       *prometheus.Desc
}

func fam(name, kind, help string, labels ...string) *family {
	f := &family{name: name, help: help, kind: kind, labels: labels}
	f.desc = prometheus.NewDesc(name, help, append([]string{"job_id", "node"}, labels...), nil)
	return f
}

var (
	fInfo         = fam("reft_agent_info", "gauge", "The job's agent on the node: its SPEC and version (always 1).", "spec", "version")
	fUptime       = fam("reft_agent_uptime_seconds", "gauge", "Seconds since the agent started.")
	fSnapDur      = fam("reft_snapshot_duration_seconds", "histogram", "A snapshot's save request to its commit (the client's copy, checksums, redundancy encode).")
	fSnapBytes    = fam("reft_snapshot_bytes", "gauge", "Payload bytes of the rank's newest committed snapshot on this node.", "rank")
	fCommitted    = fam("reft_committed_step", "gauge", "The rank's newest committed snapshot step on this node.", "rank")
	fCommits      = fam("reft_snapshots_committed_total", "counter", "Snapshot generations committed on this node.")
	fSaveFail     = fam("reft_snapshot_failures_total", "counter", "Snapshot saves that failed on this node (tmpfs full, memory budget, other).")
	fDegraded     = fam("reft_protection_degraded", "gauge", "1 when the node's snapshots are less protected than the job's SPEC asks (reft_protection_degraded_reason says why), else 0.")
	fDegradedWhy  = fam("reft_protection_degraded_reason", "gauge", "1 for each reason the node's protection is degraded against the SPEC.", "reason")
	fEncode       = fam("reft_redundancy_encode_seconds", "histogram", "A commit's redundancy encode (ARC copy, AEC parity).")
	fReplBytes    = fam("reft_replication_bytes_total", "counter", "Payload bytes of background replicas of other nodes' ranks committed on this node.")
	fReplDur      = fam("reft_replication_duration_seconds", "histogram", "A background replica's copy, request to commit on this node.")
	fSchedChunks  = fam("reft_replication_scheduled_chunks_total", "counter", "Background replication chunks the idle-span schedule (background_schedule = \"idle\") admitted on this node, by how: into a predicted idle span (idle_span), before a timeline was learned (unplanned), or larger than any idle span (oversize).", "how")
	fSchedSkipped = fam("reft_replication_idle_spans_skipped_total", "counter", "Idle spans that ended with a background chunk waiting and none admitted (too short for it).")
	fSchedOverrun = fam("reft_replication_phases_overrun_total", "counter", "Communication phases that began before the admitted background chunks were done, at the estimated bandwidth.")
	fPeers        = fam("reft_peers", "gauge", "The job's other nodes this agent knows.")
	fPeersConn    = fam("reft_peers_connected", "gauge", "The job's other agents this agent is connected to.")
	fLost         = fam("reft_lost_nodes", "gauge", "The job's nodes the failure detector published lost.")
	fFailures     = fam("reft_failures_detected_total", "counter", "Failures the agents' detector published that this agent learned of, by class (node, agent, hang).", "class")
	fDetectLat    = fam("reft_failure_detection_latency_seconds", "histogram", "A detected failure's last sign of life to its confirmation.")
	fRestoreDur   = fam("reft_restore_duration_seconds", "histogram", "A restore served on this node, request to reply, by where its bytes came from.", "source")
	fMemBudget    = fam("reft_memory_budget_bytes", "gauge", "The snapshot store's memory budget.")
	fMemUsed      = fam("reft_memory_used_bytes", "gauge", "Arena bytes reserved against the memory budget.")
	fMemHeld      = fam("reft_memory_held_bytes", "gauge", "Payload bytes of every committed generation the store holds.")
	fMemPinned    = fam("reft_memory_pinned_bytes", "gauge", "Arena bytes locked in memory.")
	fChecksumFail = fam("reft_checksum_failures_total", "counter", "Corrupt snapshot chunks found (CRC-32C).")
	fMsgLogBytes  = fam("reft_msglog_bytes", "gauge", "Payload bytes of the messages the ranks' message logs hold on this node.")
	fMsgLogAppend = fam("reft_msglog_appended_bytes_total", "counter", "Payload bytes appended to the ranks' message logs on this node.")
)

var all = []*family{fInfo, fUptime, fSnapDur, fSnapBytes, fCommitted, fCommits, fSaveFail, fDegraded, fDegradedWhy,
	fEncode, fReplBytes, fReplDur, fSchedChunks, fSchedSkipped, fSchedOverrun, fPeers, fPeersConn, fLost, fFailures, fDetectLat, fRestoreDur,
	fMemBudget, fMemUsed, fMemHeld, fMemPinned, fChecksumFail, fMsgLogBytes, fMsgLogAppend}

// Families lists the exported family names and their types (counter,
// gauge, histogram), for tests and the dashboard's check.
func Families() map[string]string {
	m := map[string]string{}
	for _, f := range all {
		m[f.name] = f.kind
	}
	return m
}

// Degraded reasons.
const (
	ReasonPeering      = "peering"       // peering off or still starting
	ReasonPeerLost     = "peer_lost"     // a peer's agent not connected
	ReasonPlacement    = "placement"     // members of one sharding group share this node
	ReasonRankLocal    = "rank_local"    // a rank's state is on this node only
	ReasonSaveFailures = "save_failures" // saves failed since the agent started
)

var reasons = []string{ReasonPeering, ReasonPeerLost, ReasonPlacement, ReasonRankLocal, ReasonSaveFailures}

// Degraded lists why st's protection falls short of its SPEC: with a SPEC
// that protects across nodes (arc, aec, aor) peering must be on, every
// peer this agent has met still connected and none published lost, no
// sharding group placed twice on the node and no rank local only; with any
// SPEC, saves must not fail. A peer never met is a node without an agent,
// a spare that runs no step, whose protection nothing depends on (a peer
// whose agent never came up is the detector's to publish lost).
func Degraded(st *proto.Status) []string {
	var why []string
	if sp, err := spec.Parse(st.Spec); err == nil && (sp.ARC || sp.AEC || sp.AOR) {
		why = degradedAcross(st)
	}
	if st.Store != nil && st.Store.SaveFailures > 0 {
		why = append(why, ReasonSaveFailures)
	}
	return why
}

// degradedAcross is why a SPEC that protects across nodes does not now.
func degradedAcross(st *proto.Status) []string {
	var why []string
	if p := st.Peering; p == nil || p.State != proto.PeeringOn {
		why = append(why, ReasonPeering)
	} else if slices.ContainsFunc(p.Peers, func(ps proto.PeerStatus) bool {
		return !ps.Connected && (ps.Met || slices.Contains(st.LostNodes, ps.Node))
	}) {
		why = append(why, ReasonPeerLost)
	}
	if len(st.PlacementWarnings) > 0 {
		why = append(why, ReasonPlacement)
	}
	if slices.ContainsFunc(st.Ranks, func(r proto.RankStatus) bool {
		return r.Protection != nil && r.Protection.Connected && r.Protection.Mode == proto.ProtectLocal
	}) {
		why = append(why, ReasonRankLocal)
	}
	return why
}

// Collector exports the families of a set of status replies (one per
// node). It only reads them: build one per scrape, or give it statuses
// nobody changes while Gather runs.
type Collector struct {
	Statuses []proto.Status
}

// Describe sends every family's description.
func (c Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, f := range all {
		ch <- f.desc
	}
}

// Collect sends the families' samples, every status's with its job_id and
// node.
func (c Collector) Collect(ch chan<- prometheus.Metric) {
	for i := range c.Statuses {
		collect(ch, &c.Statuses[i])
	}
}

func collect(ch chan<- prometheus.Metric, st *proto.Status) {
	g := func(f *family, v float64, lv ...string) {
		ch <- prometheus.MustNewConstMetric(f.desc, prometheus.GaugeValue, v, append([]string{st.Job, st.Node}, lv...)...)
	}
	c := func(f *family, v float64, lv ...string) {
		ch <- prometheus.MustNewConstMetric(f.desc, prometheus.CounterValue, v, append([]string{st.Job, st.Node}, lv...)...)
	}
	h := func(f *family, hs *proto.Histogram, lv ...string) {
		if hs == nil {
			hs = &proto.Histogram{}
		}
		b := make(map[float64]uint64, len(hs.Buckets))
		for _, x := range hs.Buckets {
			b[x.LE] = x.Count
		}
		ch <- prometheus.MustNewConstHistogram(f.desc, hs.Count, hs.Sum, b, append([]string{st.Job, st.Node}, lv...)...)
	}
	g(fInfo, 1, st.Spec, st.AgentVersion)
	g(fUptime, st.UptimeSeconds)
	for _, r := range st.Ranks {
		rank := fmt.Sprint(r.Rank)
		if r.Newest >= 0 {
			g(fCommitted, float64(r.Newest), rank)
			g(fSnapBytes, float64(r.Bytes), rank)
		}
	}
	if s := st.Store; s != nil {
		c(fCommits, float64(s.Commits))
		c(fSaveFail, float64(s.SaveFailures))
		c(fChecksumFail, float64(s.ChecksumFailures))
	}
	why := Degraded(st)
	g(fDegraded, float64(min(len(why), 1)))
	for _, r := range reasons {
		v := 0.0
		if slices.Contains(why, r) {
			v = 1
		}
		g(fDegradedWhy, v, r)
	}
	var peers []proto.PeerStatus // none without peering
	if st.Peering != nil {
		peers = st.Peering.Peers
	}
	g(fPeers, float64(len(peers)))
	g(fPeersConn, float64(len(slices.DeleteFunc(slices.Clone(peers), func(p proto.PeerStatus) bool { return !p.Connected }))))
	g(fLost, float64(len(st.LostNodes)))
	if m := st.Memory; m != nil {
		g(fMemBudget, float64(m.Budget))
		g(fMemUsed, float64(m.InUse))
		g(fMemHeld, float64(m.Held))
		g(fMemPinned, float64(m.PinnedBytes))
	} else if st.MemoryBudget > 0 {
		g(fMemBudget, float64(st.MemoryBudget))
	}
	l := msgLogOf(st)
	g(fMsgLogBytes, float64(l.Bytes))
	c(fMsgLogAppend, float64(l.AppendedBytes))
	m := st.Metrics
	if m == nil {
		return // an agent without the metrics section (older): no timings
	}
	h(fSnapDur, m.SnapshotSeconds)
	h(fEncode, m.EncodeSeconds)
	h(fReplDur, m.ReplicationSeconds)
	c(fReplBytes, float64(m.ReplicationBytes))
	rs := m.ReplicationSchedule
	if rs == nil {
		rs = &proto.ReplicationSchedule{} // another schedule: zero, so rate() sees the first chunk of a later job
	}
	c(fSchedChunks, float64(rs.Chunks), "idle_span")
	c(fSchedChunks, float64(rs.Unplanned), "unplanned")
	c(fSchedChunks, float64(rs.Oversize), "oversize")
	c(fSchedSkipped, float64(rs.SpansSkipped))
	c(fSchedOverrun, float64(rs.PhasesOverrun))
	h(fDetectLat, m.DetectionSeconds)
	for _, cl := range sortedKeys(m.FailuresDetected) {
		c(fFailures, float64(m.FailuresDetected[cl]), cl)
	}
	for _, src := range sortedKeys(m.RestoreSeconds) {
		h(fRestoreDur, m.RestoreSeconds[src], src)
	}
}

// msgLogOf is st's message log section, zero when it has none (no
// store: nothing logged).
func msgLogOf(st *proto.Status) proto.MsgLogStatus {
	if st.MsgLog == nil {
		return proto.MsgLogStatus{}
	}
	return *st.MsgLog
}

func sortedKeys[V any](m map[string]V) []string {
	k := make([]string, 0, len(m))
	for s := range m {
		k = append(k, s)
	}
	sort.Strings(k)
	return k
}

// Gather is the families of sts, sorted, as the registry returns them.
func Gather(sts ...proto.Status) ([]*dto.MetricFamily, error) {
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(Collector{Statuses: sts}); err != nil {
		return nil, fmt.Errorf("metrics: registering the collector: %w", err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		return nil, fmt.Errorf("metrics: gathering: %w", err)
	}
	return mfs, nil
}

// Write writes the families of sts in Prometheus' text format.
func Write(w io.Writer, sts ...proto.Status) error {
	mfs, err := Gather(sts...)
	if err != nil {
		return err
	}
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(w, mf); err != nil {
			return fmt.Errorf("metrics: writing %s: %w", mf.GetName(), err)
		}
	}
	return nil
}
