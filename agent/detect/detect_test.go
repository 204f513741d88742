package detect

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/logging/logtest"
	"github.com/reft-hpc/reft/agent/peer"
	"github.com/reft-hpc/reft/agent/runrecord"
)

// Timers of the test agents: reft.toml's defaults. The tests run in a
// synctest bubble over an in-memory network, so time is fake and they
// cost no wall-clock time.
const (
	tInterval = 250 * time.Millisecond
	tTimeout  = time.Second
	tConfirm  = 500 * time.Millisecond
	tWindow   = DefaultWindow
)

// syncBuf is an agent's log.
type syncBuf = logtest.Buffer

// testAgent is one in-process agent: its handlers on the in-memory
// network, and a detector.
type testAgent struct {
	name string
	det  *Detector
	log  *syncBuf
	rec  recordBuf // the run record the detector writes

	mu       sync.Mutex
	got      []Failure // OnFailure calls
	progress []Progress
	dead     bool
}

// recordBuf is a run record in memory, safe for the detector's
// goroutines.
type recordBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (r *recordBuf) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.b.Write(p)
}

// records decodes every line written so far.
func (r *recordBuf) records(t testing.TB) []runrecord.Record {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []runrecord.Record
	for _, l := range bytes.Split(bytes.TrimSuffix(r.b.Bytes(), []byte{'\n'}), []byte{'\n'}) {
		if len(l) == 0 {
			continue
		}
		rec, err := runrecord.Decode(l)
		if err != nil {
			t.Fatalf("run record line %s: %v", l, err)
		}
		out = append(out, rec)
	}
	return out
}

func (a *testAgent) failures() []Failure {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.got)
}

// testJob is a job's agents, with the network and the nodes' slurmd under
// the test's control.
type testJob struct {
	t      testing.TB
	names  []string
	agents map[string]*testAgent

	mu        sync.Mutex
	handlers  map[string]handlerSet    // the agents that run
	slurmd    map[string]Reach         // what a connection to the node's slurmd gets
	blocked   map[[2]string]bool       // links that drop everything (agents and slurmd), one way each
	stalled   map[string]bool          // agents frozen (a long GC pause, a swapping node): silent, their slurmd's kernel still accepts
	slowProbe bool                     // probes go unanswered (late past the confirmation); beats pass
	hang      map[string]time.Duration // detect.hang per node (0: off)
}

// transport is one agent's view of the in-memory network: a call runs
// the other agent's handler on the JSON of the request, as the peer
// protocol would. A blocked link is silence until the deadline; a node
// whose agent does not run refuses the connection.
type transport struct {
	j    *testJob
	self string
}

func (tr transport) Call(ctx context.Context, node string, t peer.Type, req, resp any) error {
	tr.j.mu.Lock()
	hs, cut := tr.j.handlers[node], tr.j.blocked[[2]string{tr.self, node}] || tr.j.stalled[node] || tr.j.stalled[tr.self]
	cut = cut || (t == peer.TProbe && tr.j.slowProbe)
	tr.j.mu.Unlock()
	if cut {
		<-ctx.Done()
		return fmt.Errorf("link %s-%s: %w", tr.self, node, ctx.Err())
	}
	if hs == nil {
		return fmt.Errorf("dial %s: %w", node, syscall.ECONNREFUSED)
	}
	p, err := json.Marshal(req)
	if err != nil {
		return err
	}
	out, err := hs[t](ctx, tr.self, p)
	if err != nil {
		var pe *peer.Error
		if errors.As(err, &pe) {
			return pe
		}
		return &peer.Error{Code: peer.CodeInternal, Message: err.Error()}
	}
	tr.j.mu.Lock()
	cut = tr.j.blocked[[2]string{node, tr.self}]
	tr.j.mu.Unlock()
	if cut { // the reply is lost
		<-ctx.Done()
		return fmt.Errorf("link %s-%s: %w", node, tr.self, ctx.Err())
	}
	b, err := json.Marshal(out)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, resp)
}

// nodeUp is the NodeCheck of from's agent: silence on a blocked link or a
// silent slurmd, else what the test set.
func (j *testJob) nodeUp(from string) NodeCheck {
	return func(ctx context.Context, n Node) (Reach, error) {
		j.mu.Lock()
		r, cut := j.slurmd[n.Name], j.blocked[[2]string{from, n.Name}]
		j.mu.Unlock()
		if cut || r == Silent {
			<-ctx.Done()
			return Silent, nil
		}
		return r, nil
	}
}

// block cuts (or with on false heals) node off from the others, both ways.
func (j *testJob) block(node string, on bool, others ...string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if len(others) == 0 {
		for _, n := range j.allNodes() {
			if n != node {
				others = append(others, n)
			}
		}
	}
	for _, o := range others {
		j.blocked[[2]string{node, o}], j.blocked[[2]string{o, node}] = on, on
	}
}

func (j *testJob) allNodes() []string {
	var out []string
	for n := range j.slurmd {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func newJob(t testing.TB, n int, hang map[string]time.Duration) *testJob {
	return newJobTimed(t, n, hang, tInterval, tTimeout, tConfirm)
}

// newJobTimed starts n agents with the given detector timers.
func newJobTimed(t testing.TB, n int, hang map[string]time.Duration, interval, timeout, confirm time.Duration) *testJob {
	return newJobWithout(t, n, nil, hang, interval, timeout, confirm)
}

// newJobWithout is newJobTimed with the nodes in without in the job but
// running no agent (reft run's spares): their agent refuses connections.
func newJobWithout(t testing.TB, n int, without []string, hang map[string]time.Duration, interval, timeout, confirm time.Duration) *testJob {
	t.Helper()
	return newJobFactor(t, n, without, hang, 0, interval, timeout, confirm)
}

// newJobFactor is newJobWithout with detect.hang_factor.
func newJobFactor(t testing.TB, n int, without []string, hang map[string]time.Duration, factor float64, interval, timeout, confirm time.Duration) *testJob {
	t.Helper()
	j := &testJob{t: t, agents: map[string]*testAgent{}, handlers: map[string]handlerSet{}, slurmd: map[string]Reach{},
		blocked: map[[2]string]bool{}, stalled: map[string]bool{}, hang: hang}
	var nodes []Node
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("n%d", i+1)
		nodes = append(nodes, Node{Name: name, Index: i})
		j.slurmd[name] = Answered
		if !slices.Contains(without, name) {
			j.names = append(j.names, name)
		}
	}
	for _, name := range j.names {
		a := &testAgent{name: name, log: &syncBuf{}}
		a.log.CheckEvents(t)
		log := zerolog.New(a.log).With().Timestamp().Str("node", name).Logger()
		cfg := Config{Self: name, Nodes: nodes, Transport: transport{j, name}, NodeUp: j.nodeUp(name),
			Interval: interval, Timeout: timeout, Confirm: confirm, Hang: hang[name], HangFactor: factor,
			Progress: func() []Progress {
				a.mu.Lock()
				defer a.mu.Unlock()
				return slices.Clone(a.progress)
			},
			OnFailure: func(f Failure) {
				a.mu.Lock()
				a.got = append(a.got, f)
				a.mu.Unlock()
			},
			Record: runrecord.NewWriter(&a.rec, name, nil), Log: log}
		var err error
		if a.det, err = New(cfg); err != nil {
			t.Fatal(err)
		}
		hs := handlerSet{}
		if err := a.det.Register(hs); err != nil {
			t.Fatal(err)
		}
		j.handlers[name] = hs
		j.agents[name] = a
	}
	for _, a := range j.agents {
		a.det.Start(context.Background())
	}
	t.Cleanup(func() {
		for _, a := range j.agents {
			j.kill(a.name, "agent")
		}
	})
	j.waitHeard()
	return j
}

// waitHeard waits until every agent has heard from every other agent (its
// watched peers and, by discovery beats, the rest), so that a failure
// after it is one of a node that was up and every agent counts.
func (j *testJob) waitHeard() {
	j.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for _, a := range j.agents {
		for {
			a.det.mu.Lock()
			ok := len(a.det.watching) > 0 || len(j.agents) < 2
			for _, o := range j.names {
				ok = ok && (o == a.name || !a.det.heard[o].IsZero())
			}
			a.det.mu.Unlock()
			if ok {
				break
			}
			if time.Now().After(deadline) {
				j.t.Fatalf("%s has not heard from every other agent (watching %v)", a.name, a.det.Watching())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// kill ends node's agent: "agent" (its node stays up), "node" (its slurmd
// goes too), "staggered" (a node whose processes die one by one: its
// slurmd still answers when the agent's connections reset, and refuses two
// beat intervals later), "silent" (the node vanishes
// without closing a connection: every link to it drops, its slurmd is
// silent), or "leave" (the agent stops cleanly and says so).
func (j *testJob) kill(name, how string) {
	a := j.agents[name]
	a.mu.Lock()
	dead := a.dead
	a.dead = true
	a.mu.Unlock()
	if dead {
		return
	}
	j.mu.Lock()
	switch how {
	case "node":
		j.slurmd[name] = Refused
	case "silent":
		j.slurmd[name] = Silent
	}
	j.mu.Unlock()
	if how == "silent" {
		j.block(name, true)
	}
	if how == "leave" {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		a.det.Leave(ctx)
		cancel()
	}
	a.det.Close()
	if how != "silent" {
		j.mu.Lock()
		delete(j.handlers, name)
		j.mu.Unlock()
	}
	if how == "staggered" {
		time.AfterFunc(2*tInterval, func() {
			j.mu.Lock()
			j.slurmd[name] = Refused
			j.mu.Unlock()
		})
	}
}

// survivors lists the agents not killed.
func (j *testJob) survivors() []*testAgent {
	var out []*testAgent
	for _, n := range j.names {
		a := j.agents[n]
		a.mu.Lock()
		if !a.dead {
			out = append(out, a)
		}
		a.mu.Unlock()
	}
	return out
}

// published waits until every survivor has learnt want failures, then
// watches a while longer for duplicates, and returns every survivor's
// OnFailure calls and the failure_detected events of every agent's log.
func (j *testJob) published(want int) (map[string][]Failure, []map[string]any) {
	j.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		done := true
		for _, a := range j.survivors() {
			done = done && len(a.failures()) >= want
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			got := map[string][]Failure{}
			for _, a := range j.survivors() {
				got[a.name] = a.failures()
			}
			j.t.Fatalf("survivors learnt %v, want %d failure(s) each", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(3 * tTimeout) // late duplicates would show by now
	got := map[string][]Failure{}
	for _, a := range j.survivors() {
		got[a.name] = a.failures()
	}
	var events []map[string]any
	for _, n := range j.names {
		events = append(events, j.agents[n].log.Events(EventFailure)...)
	}
	return got, events
}

// TestDetectFailures kills agents and nodes in turn; after each kill every
// survivor learns exactly that failure once, classified, from one
// coordinator (the lowest-index survivor), which logs one failure_detected.
func TestDetectFailures(t *testing.T) {
	type kill struct {
		node, how              string
		class, coordinator     string
		reporters, confirmedBy []string // any of
	}
	for _, tc := range []struct {
		name  string
		nodes int
		kills []kill
	}{
		{"node", 4, []kill{{node: "n3", how: "node", class: ClassNode, coordinator: "n1"}}},
		{"agent", 4, []kill{{node: "n2", how: "agent", class: ClassAgent, coordinator: "n1"}}},
		{"node dying in stages", 4, []kill{{node: "n2", how: "staggered", class: ClassNode, coordinator: "n1"}}},
		{"silent node", 4, []kill{{node: "n4", how: "silent", class: ClassNode, coordinator: "n1"}}},
		{"coordinator", 4, []kill{{node: "n1", how: "node", class: ClassNode, coordinator: "n2"}}},
		{"coordinator after a failure", 5, []kill{
			{node: "n3", how: "node", class: ClassNode, coordinator: "n1"},
			{node: "n1", how: "agent", class: ClassAgent, coordinator: "n2"},
		}},
		{"silent coordinator", 4, []kill{{node: "n1", how: "silent", class: ClassNode, coordinator: "n2"}}},
		{"two nodes", 2, []kill{{node: "n2", how: "node", class: ClassNode, coordinator: "n1"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				j := newJob(t, tc.nodes, nil)
				for i, k := range tc.kills {
					killed := time.Now()
					j.kill(k.node, k.how)
					got, events := j.published(i + 1)
					for name, fs := range got {
						if len(fs) != i+1 {
							t.Fatalf("after killing %s, %s learnt %d failures, want %d: %+v", k.node, name, len(fs), i+1, fs)
						}
						f := fs[i]
						if f.Node != k.node || f.Class != k.class || f.Coordinator != k.coordinator || !f.Published || f.Cause == "" {
							t.Errorf("%s learnt %+v; want the %s failure of %s published by %s", name, f, k.class, k.node, k.coordinator)
						}
						if f.LastHeard.IsZero() || f.DetectedAt.Before(f.LastHeard) {
							t.Errorf("%s: failure %+v: last heard %s, detected %s", name, f, f.LastHeard, f.DetectedAt)
						}
					}
					if len(events) != i+1 {
						t.Fatalf("%d failure_detected events in the agents' logs after %d kill(s), want one per kill: %v", len(events), i+1, events)
					}
					e := events[i]
					if e["failed_node"] != k.node || e["class"] != k.class || e["coordinator"] != k.coordinator || e["node"] != k.coordinator {
						t.Errorf("failure_detected event %v; want %s failure of %s logged by %s", e, k.class, k.node, k.coordinator)
					}
					// reft run's channel: the coordinator alone records
					// each verdict, once, as it logs it.
					var recs []runrecord.Record
					for _, n := range j.names {
						recs = append(recs, j.agents[n].rec.records(t)...)
					}
					if len(recs) != i+1 {
						t.Fatalf("%d failure records in the agents' run records after %d kill(s), want one per kill: %+v", len(recs), i+1, recs)
					}
					if r := recs[i]; r.Kind != runrecord.KindFailure || r.Node != k.coordinator || r.Failure.FailedNode != k.node ||
						r.Failure.Class != k.class || r.Failure.Coordinator != k.coordinator || !r.Failure.Quorum || r.Failure.LastHeard.IsZero() {
						t.Errorf("run record %+v (%+v); want the %s failure of %s recorded by %s with its quorum", r, r.Failure, k.class, k.node, k.coordinator)
					}
					t.Logf("%s (%s) killed: published by %s %.0f ms after the kill, latency since last heard %.0f ms (interval %s, timeout %s, confirm %s)",
						k.node, k.how, k.coordinator, got[k.coordinator][i].DetectedAt.Sub(killed).Seconds()*1000,
						e["latency_s"].(float64)*1000, tInterval, tTimeout, tConfirm)
					if e["quorum"] != true {
						t.Errorf("failure_detected event %v carries no quorum", e)
					}
				}
			})
		})
	}
}

// TestDetectNeighboursLostTogether: seven nodes, n4 a spare without an
// agent. n3's only watcher with an agent is n2; n2 and n3 die together.
// The other agents make a quorum; n1 publishes n2's failure, its ring then
// closes over n3, which it never beat before but saw up through the mesh
// (Seen), and publishes n3's too. Without Seen, n3 would pass for a node
// not up yet and never be called lost.
func TestDetectNeighboursLostTogether(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		j := newJobWithout(t, 7, []string{"n4"}, nil, tInterval, tTimeout, tConfirm)
		now := time.Now()
		for _, a := range j.agents { // the mesh connected every agent to every other
			for _, o := range j.names {
				if o != a.name {
					a.det.Seen(o, now)
				}
			}
		}
		if w := j.agents["n1"].det.Watching(); slices.Contains(w, "n3") {
			t.Fatalf("n1 watches %v: the test needs n3 out of its ring at first", w)
		}
		j.kill("n2", "node")
		j.kill("n3", "node")
		got, events := j.published(2)
		var nodes []string
		for _, f := range got["n1"] {
			nodes = append(nodes, f.Node)
			if f.Class != ClassNode || f.Coordinator != "n1" || !f.Quorum {
				t.Errorf("n1 learnt %+v: want a node failure with a quorum it published", f)
			}
		}
		slices.Sort(nodes)
		if !slices.Equal(nodes, []string{"n2", "n3"}) || len(events) != 2 {
			t.Errorf("n1 learnt failures of %v (%d failure_detected events), want n2 and n3 once each", nodes, len(events))
		}
	})
}

// TestDetectFlakyLink: the link between n1 and n2 drops everything; both
// suspect each other, the other agents still reach them, and no failure is
// published.
func TestDetectFlakyLink(t *testing.T) { synctest.Test(t, testDetectFlakyLink) }

func testDetectFlakyLink(t *testing.T) {
	j := newJob(t, 4, nil)
	j.block("n1", true, "n2")
	var cleared []map[string]any
	for deadline := time.Now().Add(5 * time.Second); len(cleared) < 2 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		cleared = append(j.agents["n1"].log.Events("peer_suspect_cleared"), j.agents["n2"].log.Events("peer_suspect_cleared")...)
	}
	if len(cleared) < 2 {
		t.Fatalf("n1 and n2 did not both suspect and clear each other: %v", cleared)
	}
	time.Sleep(4 * tTimeout)
	for _, a := range j.survivors() {
		if fs := a.failures(); len(fs) > 0 {
			t.Errorf("%s learnt failures %+v over a flaky link", a.name, fs)
		}
		if ev := a.log.Events(EventFailure); len(ev) > 0 {
			t.Errorf("%s logged %v", a.name, ev)
		}
	}
	if r, ok := cleared[0]["reached_by"].([]any); !ok || len(r) == 0 {
		t.Errorf("peer_suspect_cleared %v does not name the agents that reached the suspect", cleared[0])
	}
}

// TestDetectAgentRestart: n2's agent refuses connections for a moment and
// then answers again, as when every agent of a job restarts after a shrink
// (the old one keeps its listener for its goodbye, the new one listens
// some milliseconds later). Its slurmd answers throughout. No agent may
// publish a failure: a refusal alone is not a verdict (seen on the test
// cluster before the watch waited: a spare's new agent condemned n1's).
func TestDetectAgentRestart(t *testing.T) { synctest.Test(t, testDetectAgentRestart) }

func testDetectAgentRestart(t *testing.T) {
	j := newJob(t, 4, nil)
	j.mu.Lock()
	hs := j.handlers["n2"]
	delete(j.handlers, "n2")
	j.mu.Unlock()
	time.Sleep(tTimeout + tInterval) // past the silence that raises a suspicion
	j.mu.Lock()
	j.handlers["n2"] = hs
	j.mu.Unlock()
	time.Sleep(4 * tTimeout)
	suspected := 0
	for _, a := range j.survivors() {
		suspected += len(a.log.Events("peer_suspected"))
		if fs := a.failures(); len(fs) > 0 {
			t.Errorf("%s learnt failures %+v of an agent that restarted", a.name, fs)
		}
		if ev := a.log.Events(EventFailure); len(ev) > 0 {
			t.Errorf("%s logged %v", a.name, ev)
		}
	}
	if suspected == 0 {
		t.Fatalf("nobody suspected n2 while it refused: the test did not test the watch")
	}
}

// TestDetectLeave: agents that stop cleanly (the job ends on their nodes)
// say goodbye; nobody reports them, and the others go on watching each
// other: a later kill is still published, by the new lowest agent.
func TestDetectLeave(t *testing.T) { synctest.Test(t, testDetectLeave) }

func testDetectLeave(t *testing.T) {
	j := newJob(t, 4, nil)
	j.kill("n1", "leave")
	j.kill("n3", "leave")
	time.Sleep(4 * tTimeout)
	for _, a := range j.survivors() {
		if fs := a.failures(); len(fs) > 0 {
			t.Fatalf("%s learnt failures %+v after clean stops", a.name, fs)
		}
		if c := a.det.Coordinator(); c != "n2" {
			t.Errorf("%s takes %s for the coordinator, want n2", a.name, c)
		}
	}
	j.kill("n4", "node")
	got, events := j.published(1)
	if f := got["n2"]; len(f) != 1 || f[0].Node != "n4" || f[0].Coordinator != "n2" || len(events) != 1 {
		t.Errorf("after clean stops and a kill: n2 learnt %+v, events %v", f, events)
	}
}

// TestDetectHang: a rank of n2 stops reporting progress; after detect.hang
// n2 reports it and the coordinator publishes one hang failure; a rank
// whose progress goes on is never reported.
func TestDetectHang(t *testing.T) { synctest.Test(t, testDetectHang) }

func testDetectHang(t *testing.T) {
	hang := 2 * tTimeout
	j := newJob(t, 3, map[string]time.Duration{"n1": hang, "n2": hang, "n3": hang})
	stop := make(chan struct{})
	defer close(stop)
	go func() { // rank 0 on n1 progresses every step; rank 5 on n2 stops at step 41
		a := j.agents["n1"]
		for step := int64(0); ; step++ {
			a.mu.Lock()
			a.progress = []Progress{{Rank: 0, Step: step, At: time.Now()}}
			a.mu.Unlock()
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	a := j.agents["n2"]
	a.mu.Lock()
	a.progress = []Progress{{Rank: 5, Step: 41, At: time.Now()}}
	a.mu.Unlock()
	got, events := j.published(1)
	for name, fs := range got {
		if len(fs) != 1 || fs[0].Class != ClassHang || fs[0].Node != "n2" || !slices.Equal(fs[0].Ranks, []int{5}) || fs[0].Coordinator != "n1" {
			t.Errorf("%s learnt %+v; want one hang of rank 5 on n2 published by n1", name, fs)
		}
	}
	if len(events) != 1 || events[0]["class"] != ClassHang || !strings.Contains(events[0]["message"].(string), "rank 5 at step 41") {
		t.Errorf("failure_detected events %v; want one hang naming rank 5 at step 41", events)
	}
	if h := a.log.Events("rank_hung"); len(h) != 1 {
		t.Errorf("n2 logged %d rank_hung events, want 1: %v", len(h), h)
	}
}

func TestRing(t *testing.T) {
	for _, tc := range []struct {
		self string
		live []string
		want []string
	}{
		{"b", []string{"a", "b", "c", "d"}, []string{"c", "a"}},
		{"a", []string{"a", "b", "c", "d"}, []string{"b", "d"}},
		{"d", []string{"a", "b", "c", "d"}, []string{"a", "c"}},
		{"a", []string{"a", "b"}, []string{"b"}},
		{"a", []string{"a"}, nil},
		{"x", []string{"a", "b"}, nil},
	} {
		if got := Ring(tc.self, tc.live); !slices.Equal(got, tc.want) {
			t.Errorf("Ring(%s, %v) = %v, want %v", tc.self, tc.live, got, tc.want)
		}
	}
}

func TestSlurmdAsked(t *testing.T) {
	for _, tc := range []struct {
		self, node string
		live       []string
		want       []string
	}{
		// The suspect's other ring neighbour first, then outwards.
		{"b", "c", []string{"a", "b", "c", "d", "e", "f"}, []string{"d", "e", "a"}},
		{"a", "b", []string{"a", "b"}, nil},
		{"a", "b", []string{"a", "b", "c"}, []string{"c"}},
	} {
		if got := slurmdAsked(tc.self, tc.node, tc.live); !slices.Equal(got, tc.want) {
			t.Errorf("slurmdAsked(%s, %s, %v) = %v, want %v", tc.self, tc.node, tc.live, got, tc.want)
		}
	}
}

func TestSlurmdUp(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()
	for _, tc := range []struct {
		addr   string
		want   Reach
		hasErr bool
	}{
		{ln.Addr().String(), Answered, false},
		{closedAddr, Refused, false},
		{"", Silent, true},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		got, err := SlurmdUp(ctx, Node{Name: "n1", Slurmd: tc.addr})
		cancel()
		if got != tc.want || (err != nil) != tc.hasErr {
			t.Errorf("SlurmdUp(%q) = %v, %v; want %v, error %v", tc.addr, got, err, tc.want, tc.hasErr)
		}
	}
}

func TestNewChecks(t *testing.T) {
	tr := transport{}
	nodes := []Node{{Name: "n1", Index: 0}}
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Self: "n1", Nodes: nodes, Interval: time.Second, Timeout: time.Second, Confirm: time.Second, Transport: tr}, "interval"},
		{Config{Self: "n1", Nodes: nodes, Interval: time.Second, Timeout: 2 * time.Second, Transport: tr}, "confirm"},
		{Config{Self: "n9", Nodes: nodes, Interval: time.Second, Timeout: 2 * time.Second, Confirm: time.Second, Transport: tr}, "not among"},
		{Config{Self: "n1", Nodes: []Node{{Name: "n1", Index: 3}}, Interval: time.Second, Timeout: 2 * time.Second, Confirm: time.Second, Transport: tr}, "index 3"},
		{Config{Self: "n1", Nodes: nodes, Interval: time.Second, Timeout: 2 * time.Second, Confirm: time.Second}, "transport"},
		{Config{Self: "n1", Nodes: nodes, Interval: time.Second, Timeout: 2 * time.Second, Confirm: time.Second, Window: -time.Second, Transport: tr}, "window"},
	} {
		if _, err := New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v): %v, want an error about %s", tc.cfg, err, tc.want)
		}
	}
}

func TestQuorum(t *testing.T) {
	pop4 := []string{"n1", "n2", "n3", "n4"}
	for _, tc := range []struct {
		with, pop []string
		want      bool
	}{
		{[]string{"n1", "n2", "n4"}, pop4, true},                  // a majority
		{[]string{"n1", "n2"}, pop4, true},                        // half, with the lowest index
		{[]string{"n3", "n4"}, pop4, false},                       // the other half
		{[]string{"n2"}, pop4, false},                             // a minority
		{[]string{"n1"}, []string{"n1", "n2"}, true},              // two agents: the first condemns the second
		{[]string{"n2"}, []string{"n1", "n2"}, false},             // never the other way round
		{[]string{"n1", "n9"}, []string{"n1", "n2", "n3"}, false}, // n9 is no voter
		{nil, nil, false},
	} {
		if got := Quorum(tc.with, tc.pop); got != tc.want {
			t.Errorf("Quorum(%v, %v) = %v, want %v", tc.with, tc.pop, got, tc.want)
		}
	}
}

// TestDetectNetworkFaults injects flaps, stalls and partitions, and checks
// that only a quorum condemns: the nodes published lost (by every agent
// that is not fenced) are exactly those expected, and the agents cut off
// from a quorum fence themselves, say so once, and publish nothing.
func TestDetectNetworkFaults(t *testing.T) {
	for _, tc := range []struct {
		name   string
		nodes  int
		fault  func(j *testJob)
		lost   []string // published node failures
		fenced []string // agents fenced at the end
	}{
		{name: "3 s flap of n2", nodes: 4, fault: func(j *testJob) {
			j.block("n2", true)
			time.AfterFunc(3*time.Second, func() { j.block("n2", false) })
		}},
		{name: "3 s stall of n3", nodes: 4, fault: func(j *testJob) {
			j.mu.Lock()
			j.stalled["n3"] = true
			j.mu.Unlock()
			time.AfterFunc(3*time.Second, func() {
				j.mu.Lock()
				delete(j.stalled, "n3")
				j.mu.Unlock()
			})
		}},
		{name: "n2 cut off from the other agents", nodes: 4, fault: func(j *testJob) { j.block("n2", true) },
			lost: []string{"n2"}, fenced: []string{"n2"}},
		{name: "two of five cut off", nodes: 5, fault: func(j *testJob) {
			j.block("n4", true, "n1", "n2", "n3")
			j.block("n5", true, "n1", "n2", "n3")
		}, lost: []string{"n4", "n5"}, fenced: []string{"n4", "n5"}},
		{name: "even split", nodes: 4, fault: func(j *testJob) {
			j.block("n1", true, "n3", "n4")
			j.block("n2", true, "n3", "n4")
		}, lost: []string{"n3", "n4"}, fenced: []string{"n3", "n4"}},
		{name: "two nodes cut apart", nodes: 2, fault: func(j *testJob) { j.block("n2", true) },
			lost: []string{"n2"}, fenced: []string{"n2"}},
		// Seen on the test cluster's own network: probe answers came late
		// (held behind a slow dial on the other side) while the agents
		// beat each other fine. Not knowing is no verdict, and no fence.
		{name: "probes slower than the confirmation", nodes: 4, fault: func(j *testJob) {
			j.mu.Lock()
			j.slowProbe = true
			j.mu.Unlock()
			j.kill("n2", "silent")
		}},
		{name: "lone survivor", nodes: 3, fault: func(j *testJob) {
			j.kill("n2", "silent")
			j.kill("n3", "silent")
		}, fenced: []string{"n1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				j := newJob(t, tc.nodes, nil)
				tc.fault(j)
				time.Sleep(20 * time.Second)
				var events []string
				for _, a := range j.survivors() {
					for _, e := range a.log.Events(EventFailure) {
						events = append(events, e["failed_node"].(string))
					}
					var got []string
					for _, f := range a.failures() {
						if f.Class != ClassNode || !f.Quorum {
							t.Errorf("%s learnt %+v: want node failures with a quorum only", a.name, f)
						}
						got = append(got, f.Node)
					}
					slices.Sort(got)
					fenced := slices.Contains(tc.fenced, a.name)
					if a.det.Fenced() != fenced {
						t.Errorf("%s fenced: %v, want %v", a.name, a.det.Fenced(), fenced)
					}
					if n := len(a.log.Events("detect_fenced")); fenced && n != 1 || !fenced && n != 0 {
						t.Errorf("%s (fenced at the end: %v) logged detect_fenced %d times", a.name, fenced, n)
					}
					if !fenced && !slices.Equal(got, tc.lost) {
						t.Errorf("%s learnt the loss of %v, want %v", a.name, got, tc.lost)
					}
					if fenced && len(a.log.Events(EventFailure)) > 0 {
						t.Errorf("fenced %s published %v", a.name, a.log.Events(EventFailure))
					}
				}
				slices.Sort(events)
				if !slices.Equal(events, tc.lost) {
					t.Errorf("failure_detected events name %v, want %v once each", events, tc.lost)
				}
			})
		})
	}
}

// TestDetectRejoin: n2, cut off and fenced, is published lost by the
// others; once the network heals it reaches a quorum again, says so, and
// takes part in detection again: a later loss of n4 is published.
func TestDetectRejoin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		j := newJob(t, 4, nil)
		j.block("n2", true)
		time.Sleep(20 * time.Second)
		n2 := j.agents["n2"]
		if !n2.det.Fenced() {
			t.Fatalf("n2 cut off for 20 s is not fenced")
		}
		j.block("n2", false)
		time.Sleep(5 * time.Second)
		if n2.det.Fenced() || len(n2.log.Events("detect_unfenced")) != 1 {
			t.Fatalf("n2 healed: fenced %v, detect_unfenced %v", n2.det.Fenced(), n2.log.Events("detect_unfenced"))
		}
		j.kill("n4", "node")
		time.Sleep(10 * time.Second)
		var got []string
		for _, f := range j.agents["n1"].failures() {
			got = append(got, f.Node)
		}
		if !slices.Equal(got, []string{"n2", "n4"}) {
			t.Errorf("n1 learnt the loss of %v, want n2 (cut off) then n4", got)
		}
		if fs := n2.failures(); len(fs) != 1 || fs[0].Node != "n4" {
			t.Errorf("n2 back in the job learnt %+v, want the loss of n4", fs)
		}
	})
}
