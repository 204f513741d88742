package run

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/reft-hpc/reft/agent"
	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/launcher/recoverylog"
)

func scan(lines ...string) Outcome {
	var o Outcome
	t := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	for i, l := range lines {
		o.Scan(l, t.Add(time.Duration(i)*time.Second))
	}
	return o
}

func TestScanAndCulprits(t *testing.T) {
	// What srun printed on the test cluster when rank 2 killed itself.
	o := scan(append([]string{"step 6 loss 0.31", "--------", "WARNING: Open MPI failed to TCP connect"}, killed2...)...)
	if len(o.Tasks) != 3 || !o.FirstError.Equal(time.Date(2026, 5, 1, 12, 0, 4, 0, time.UTC)) {
		t.Fatalf("outcome %+v", o)
	}
	c := o.Culprits()
	if len(c) != 1 || c[0].Node != "n3" || !slices.Equal(c[0].Tasks, []int{2}) || c[0].Reason != "Killed" || c[0].Teardown {
		t.Errorf("culprits %+v", c)
	}
	if !o.Tasks[1].Teardown || !o.Tasks[2].Teardown {
		t.Errorf("exits after 'Terminating StepId' are teardown: %+v", o.Tasks)
	}

	tests := []struct {
		name  string
		lines []string
		want  []TaskExit
		nodes []string
	}{
		{"task ranges", []string{"srun: error: n1: tasks 0-1,3: Exited with exit code 2"},
			[]TaskExit{{Node: "n1", Tasks: []int{0, 1, 3}, Reason: "Exited with exit code 2"}}, nil},
		{"only terminated", []string{"srun: error: n1: task 0: Terminated", "srun: error: n2: task 1: Terminated"},
			[]TaskExit{{Node: "n1", Tasks: []int{0}, Reason: "Terminated"}, {Node: "n2", Tasks: []int{1}, Reason: "Terminated"}}, nil},
		{"late segfault still counts", []string{"srun: Job step aborted: Waiting up to 32 seconds", "srun: error: n2: task 1: Segmentation fault"},
			[]TaskExit{{Node: "n2", Tasks: []int{1}, Reason: "Segmentation fault", Teardown: true}}, nil},
		{"node failure", []string{"srun: error: Node failure on n3", "srun: error: Node failure on n3"}, nil, []string{"n3"}},
		{"task output is not srun's", []string{"error: n1: task 0: Killed", "srun: error: n1: task x: Killed"}, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := scan(tt.lines...)
			got := o.Culprits()
			if len(got) != len(tt.want) {
				t.Fatalf("culprits %+v, want %+v", got, tt.want)
			}
			for i := range got {
				if got[i].Node != tt.want[i].Node || !slices.Equal(got[i].Tasks, tt.want[i].Tasks) ||
					got[i].Reason != tt.want[i].Reason || got[i].Teardown != tt.want[i].Teardown {
					t.Errorf("culprit %d: %+v, want %+v", i, got[i], tt.want[i])
				}
			}
			if !slices.Equal(o.NodeFailures, tt.nodes) {
				t.Errorf("node failures %v, want %v", o.NodeFailures, tt.nodes)
			}
		})
	}
}

func TestNodeLost(t *testing.T) {
	for state, lost := range map[string]bool{
		"IDLE": false, "ALLOCATED": false, "MIXED": false, "MIXED+DRAIN": false, "COMPLETING": false,
		"DOWN": true, "DOWN+NOT_RESPONDING": true, "IDLE+NOT_RESPONDING": true, "ALLOCATED*": true,
		"FAIL": true, "MIXED+FAIL": true, "POWERED_DOWN": true, "": true,
	} {
		if got := NodeLost(state) != ""; got != lost {
			t.Errorf("NodeLost(%q) = %q, want lost=%v", state, NodeLost(state), lost)
		}
	}
}

func TestClassify(t *testing.T) {
	plan, _ := NewPlan([]string{"n1", "n2", "n3", "n4"}, 0, 1)
	up := map[string]string{"n1": "MIXED", "n2": "MIXED", "n3": "MIXED", "n4": "MIXED"}
	with := func(m map[string]string, kv ...string) map[string]string {
		out := map[string]string{}
		for k, v := range m {
			out[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			if kv[i+1] == "-" {
				delete(out, kv[i])
			} else {
				out[kv[i]] = kv[i+1]
			}
		}
		return out
	}
	agents := committedReports(plan.Slots, 6)
	noAgent := func(nodes ...string) map[string]AgentReport {
		out := committedReports(plan.Slots, 6)
		for _, n := range nodes {
			out[n] = AgentReport{Node: n, Error: "no agent answers"}
		}
		return out
	}
	missing := func(nodes ...string) map[string]AgentReport {
		out := committedReports(plan.Slots, 6)
		for _, n := range nodes {
			delete(out, n)
		}
		return out
	}
	killed := scan(killed2...)
	tests := []struct {
		name  string
		o     Outcome
		h     Health
		kind  string
		nodes []string
		ranks []int
		cause string
	}{
		{"rank", killed, Health{NodeStates: up, Agents: agents}, recoverylog.KindRank, []string{"n3"}, []int{2}, "task 2 on n3: Killed"},
		{"two ranks", scan("srun: error: n1: task 0: Exited with exit code 3", "srun: error: n4: task 3: Exited with exit code 3"),
			Health{NodeStates: up, Agents: agents}, recoverylog.KindRank, []string{"n1", "n4"}, []int{0, 3}, "task 0 on n1: Exited with exit code 3; task 3 on n4"},
		{"agent beats rank", killed, Health{NodeStates: up, Agents: noAgent("n2")}, recoverylog.KindAgent, []string{"n2"}, nil, "n2: no agent answers"},
		{"node down beats agent", killed, Health{NodeStates: with(up, "n3", "DOWN*"), Agents: noAgent("n2")}, recoverylog.KindNode, []string{"n3"}, nil, "n3: not responding (State=DOWN*)"},
		{"node left the allocation", killed, Health{NodeStates: with(up, "n4", "-"), Agents: agents}, recoverylog.KindNode, []string{"n4"}, nil, "n4: no longer in the job's allocation"},
		{"srun node failure", scan("srun: error: Node failure on n2"), Health{NodeStates: up, Agents: agents}, recoverylog.KindNode, []string{"n2"}, nil, "n2: srun reported a node failure"},
		{"probe could not reach a node", killed, Health{NodeStates: up, Agents: missing("n1")}, recoverylog.KindNode, []string{"n1"}, nil, "n1: did not answer the probe step"},
		{"probe failed as a whole: no verdict on nodes", killed, Health{NodeStates: up, ProbeErr: os.ErrDeadlineExceeded}, recoverylog.KindRank, []string{"n3"}, []int{2}, "Killed"},
		{"no Slurm answer: srun and agents decide", killed, Health{Agents: agents}, recoverylog.KindRank, []string{"n3"}, []int{2}, "Killed"},
		{"nothing named", Outcome{Exit: 1}, Health{NodeStates: up, Agents: agents}, recoverylog.KindStep, nil, nil, "srun exited with status 1 and named no failed task"},
		{"srun killed", Outcome{Exit: -1}, Health{NodeStates: up, Agents: agents}, recoverylog.KindStep, nil, nil, "srun was killed by a signal"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := Classify(tt.o, plan, tt.h)
			if f.Kind != tt.kind || !slices.Equal(f.Nodes, tt.nodes) || !slices.Equal(f.Ranks, tt.ranks) || !strings.Contains(f.Cause, tt.cause) {
				t.Errorf("got %+v, want kind %s nodes %v ranks %v cause ~%q", f, tt.kind, tt.nodes, tt.ranks, tt.cause)
			}
		})
	}
}

func TestCommitted(t *testing.T) {
	h := Health{Agents: map[string]AgentReport{
		"n1": {OK: true, Status: &proto.Status{Ranks: []proto.RankStatus{{Rank: 0, Newest: 6, Bytes: 10}, {Rank: 1, Newest: 5, Bytes: 10}}}},
		"n2": {OK: true, Status: &proto.Status{Ranks: []proto.RankStatus{{Rank: 2, Newest: 6, Bytes: 7}}}},
		"n3": {Error: "down"},
	}}
	if n, b, known := Committed(h); n != 6 || b != 17 || !known {
		t.Errorf("Committed = %d, %d, %v; want 6, 17, true", n, b, known)
	}
	if n, b, known := Committed(Health{}); n != -1 || b != 0 || known {
		t.Errorf("no agent: %d, %d, %v", n, b, known)
	}
	silent := Health{Agents: map[string]AgentReport{"n1": {Error: "down"}}}
	if _, _, known := Committed(silent); known {
		t.Error("known without an answer")
	}
	none := Health{Agents: map[string]AgentReport{"n1": {OK: true, Status: &proto.Status{Ranks: []proto.RankStatus{{Rank: 0, Newest: -1}}}}}}
	if n, _, known := Committed(none); n != -1 || !known {
		t.Errorf("a rank without generations: %d %v", n, known)
	}
	for _, tc := range []struct {
		f    Failure
		want string
	}{
		{Failure{Kind: recoverylog.KindNode, Nodes: []string{"n9"}}, "n3: down"},
		{Failure{Kind: recoverylog.KindNode, Nodes: []string{"n3"}}, ""}, // the node's loss says it
		{Failure{Kind: recoverylog.KindAgent, Nodes: []string{"n3"}}, ""},
		{Failure{Kind: recoverylog.KindRank, Nodes: []string{"n1"}}, "n3: down"},
	} {
		if got := SilentAgents(h, tc.f); got != tc.want {
			t.Errorf("SilentAgents(%+v) = %q, want %q", tc.f, got, tc.want)
		}
	}
}

func TestPlan(t *testing.T) {
	if _, err := NewPlan([]string{"n1", "n2"}, 2, 1); err == nil || !strings.Contains(err.Error(), "spares=2 leaves no node") {
		t.Errorf("all spares: %v", err)
	}
	if _, err := NewPlan(nil, 0, 1); err == nil {
		t.Error("no nodes accepted")
	}
	if _, err := NewPlan([]string{"n1"}, 0, 0); err == nil {
		t.Error("0 tasks per node accepted")
	}
	p, err := NewPlan([]string{"n1", "n2", "n3", "n4", "n5", "n6"}, 2, 2)
	if err != nil {
		t.Fatal(err)
	}
	if p.Ranks() != 8 || p.NodeOf(3) != "n2" || p.NodeOf(8) != "" || p.NodeOf(-1) != "" || !slices.Equal(p.RanksOn("n3"), []int{4, 5}) ||
		!slices.Equal(p.Spares(), []string{"n5", "n6"}) {
		t.Fatalf("plan %+v", p)
	}
	if got := p.Hostfile(); got != "n1\nn1\nn2\nn2\nn3\nn3\nn4\nn4\n" {
		t.Errorf("hostfile %q", got)
	}
	if sp, ok := p.Replace("n2"); !ok || sp != "n5" {
		t.Fatalf("Replace(n2) = %s, %v", sp, ok)
	}
	if !slices.Equal(p.Slots, []string{"n1", "n5", "n3", "n4"}) || !slices.Equal(p.RanksOn("n5"), []int{2, 3}) ||
		p.Hostfile() != "n1\nn1\nn5\nn5\nn3\nn3\nn4\nn4\n" {
		t.Errorf("after replacing n2: %+v", p)
	}
	// A lost spare is excluded; it replaces nothing.
	if sp, ok := p.Replace("n6"); !ok || sp != "" || len(p.Spares()) != 0 || !slices.Equal(p.Excluded, []string{"n2", "n6"}) {
		t.Errorf("lost spare: %q %v %+v", sp, ok, p)
	}
	before := slices.Clone(p.Slots)
	if _, ok := p.Replace("n1"); ok || !slices.Equal(p.Slots, before) {
		t.Errorf("no spare left: ok=%v slots %v", ok, p.Slots)
	}
	if got := strings.Join(p.SrunArgs(), " "); got != "--nodes=4 --ntasks=8 --distribution=arbitrary" {
		t.Errorf("srun args %s", got)
	}
}

func TestParseNodeStates(t *testing.T) {
	out := "NodeName=n1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=1 State=MIXED ThreadsPerCore=1\n" +
		"NodeName=n2 Arch=x86_64 State=DOWN+NOT_RESPONDING ThreadsPerCore=1 Reason=Not responding [slurm@2026-05-01T12:00:00]\n" +
		"Node n9 not found\n"
	got := ParseNodeStates(out)
	if len(got) != 2 || got["n1"] != "MIXED" || got["n2"] != "DOWN+NOT_RESPONDING" {
		t.Errorf("states %v", got)
	}
}

func TestParseReports(t *testing.T) {
	ok, _ := json.Marshal(AgentReport{Node: "n1", Job: "42", OK: true, Status: &proto.Status{Node: "n1"}})
	down, _ := json.Marshal(AgentReport{Node: "n2", Job: "42", Error: "no agent"})
	other, _ := json.Marshal(AgentReport{Node: "n9", OK: true})
	out := string(ok) + "\nsrun: warning: something\n" + string(down) + "\n{broken\n" + string(other) + "\n"
	got := ParseReports([]byte(out), []string{"n1", "n2", "n3"})
	if len(got) != 2 || !got["n1"].OK || got["n1"].Status.Node != "n1" || got["n2"].OK || got["n2"].Error != "no agent" {
		t.Errorf("reports %+v", got)
	}
}

// TestParseReportsInterleaved: reports longer than srun forwards whole
// come in pieces, and the nodes' pieces interleave (as srun merges four
// tasks' output); each node's report is put together again. A report
// missing a piece is dropped, not misread.
func TestParseReportsInterleaved(t *testing.T) {
	long := strings.Repeat("peer n5: no agent of job 42 on 127.0.0.1: 47483 refused; ", 40)
	lines := map[string][]string{}
	for _, n := range []string{"n1", "n3", "n4"} {
		r := AgentReport{Node: n, Job: "42", OK: true, Status: &proto.Status{Node: n, PlacementWarnings: []string{long},
			Ranks: []proto.RankStatus{{Rank: 1, Newest: 17, Bytes: 4096}}}}
		if n == "n4" {
			r = AgentReport{Node: n, Job: "42", Error: long}
		}
		b, _ := json.Marshal(r)
		var w strings.Builder
		if err := writeReport(&w, n, b); err != nil {
			t.Fatal(err)
		}
		lines[n] = strings.SplitAfter(strings.TrimSuffix(w.String(), "\n"), "\n")
		for _, l := range lines[n] {
			if len(l) > 1000 {
				t.Fatalf("a report line of %d bytes: srun would cut it", len(l))
			}
		}
		if len(lines[n]) < 3 {
			t.Fatalf("%s's report in %d piece(s): the test wants several", n, len(lines[n]))
		}
	}
	var out strings.Builder
	for i := 0; ; i++ {
		more := false
		for _, n := range []string{"n3", "n1", "n4"} {
			if i < len(lines[n]) {
				out.WriteString(strings.TrimSuffix(lines[n][i], "\n") + "\n")
				more = true
			}
		}
		if i == 1 {
			out.WriteString("srun: error: n2: task 1: Exited with exit code 1\n")
		}
		if !more {
			break
		}
	}
	got := ParseReports([]byte(out.String()), []string{"n1", "n3", "n4"})
	if len(got) != 3 || got["n1"].Status.Ranks[0].Newest != 17 || got["n3"].Status.PlacementWarnings[0] != long || got["n4"].Error != long {
		t.Errorf("reports %+v", got)
	}
	// n3's second piece lost: n3 is dropped, the others stay.
	cut := strings.Replace(out.String(), lines["n3"][1], "", 1)
	if got := ParseReports([]byte(cut), []string{"n1", "n3", "n4"}); len(got) != 2 || got["n3"].Node != "" {
		t.Errorf("with a piece missing: %+v", got)
	}
}

func TestSocketPathMatchesAgent(t *testing.T) {
	if got, want := socketPath("/run/reft", "42"), agent.SocketPath("/run/reft", "42"); got != want {
		t.Errorf("socketPath %s, agent.SocketPath %s", got, want)
	}
}

// fakeAgent answers status requests on a Unix socket.
func fakeAgent(t *testing.T, sock string) {
	fakeStatusAgent(t, sock, func() proto.Status {
		return proto.Status{Job: "42", Node: "n1",
			Ranks: []proto.RankStatus{{Rank: 0, Newest: 6, Generations: []int64{6, 5}, Bytes: 100}}}
	})
}

// fakeStatusAgent answers every status request on a Unix socket with
// reply(), called once per request, from the request's goroutine.
func fakeStatusAgent(t *testing.T, sock string, reply func() proto.Status) {
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				f, err := proto.Decode(c)
				if err != nil || f.Type != proto.TStatus {
					return
				}
				proto.WriteMsg(c, proto.TStatusReply, f.ID, reply())
			}()
		}
	}()
}

func TestStatusLocal(t *testing.T) {
	dir := t.TempDir()
	runDir := filepath.Join(dir, "run")
	os.MkdirAll(filepath.Join(runDir, "42"), 0o700)
	fakeAgent(t, socketPath(runDir, "42"))
	conf := filepath.Join(dir, "reft.toml")
	os.WriteFile(conf, []byte("[agent]\nrun_dir = \""+runDir+"\"\n"), 0o644)
	t.Setenv("SLURMD_NODENAME", "n1")

	var out, errb strings.Builder
	if code := StatusLocal([]string{"--config", conf, "--job", "42"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	r, ok := ParseReports([]byte(out.String()), []string{"n1"})["n1"]
	if !ok || !r.OK || r.Node != "n1" || r.Job != "42" || r.Status == nil || r.Status.Ranks[0].Newest != 6 {
		t.Fatalf("report %q: %+v", out.String(), r)
	}

	// No agent: still exit 0, the report says why.
	out.Reset()
	if code := StatusLocal([]string{"--config", conf, "--job", "43"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if r = ParseReports([]byte(out.String()), []string{"n1"})["n1"]; r.OK || !strings.Contains(r.Error, "no agent answers on "+socketPath(runDir, "43")) {
		t.Fatalf("report %q", out.String())
	}

	t.Setenv("SLURM_JOB_ID", "")
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--config", conf}, 2, "no job"},
		{[]string{"--job", "42", "x"}, 2, "unexpected argument"},
		{[]string{"--config", filepath.Join(dir, "bad"), "--job", "1"}, 0, ""}, // a missing default-style path: defaults
	} {
		errb.Reset()
		out.Reset()
		code := StatusLocal(tc.args, &out, &errb)
		if code != tc.code || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d, %q", tc.args, code, errb.String(), tc.code, tc.want)
		}
	}
}

func TestQueryAgentTimesOut(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s")
	l, err := net.Listen("unix", sock) // accepts, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := QueryAgent(ctx, sock); err == nil {
		t.Fatal("a silent agent answered")
	}
}
