package recoverylog

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

func i64(v int64) *int64 { return &v }
func iptr(v int) *int    { return &v }

func TestWriteFieldsAndRoundTrip(t *testing.T) {
	var b bytes.Buffer
	w := NewWriter(&b)
	e := Event{Time: t0, Level: "warn", Job: "42", Step: "42.0", Restart: 1, Relaunch: 2, Node: "n3",
		Event: FailureDetected, Spec: "arc", Generation: 6, Bytes: 1024, DurationS: 1.0955223570000001,
		Cause: "task 2 on n3: Killed", Kind: KindRank, Nodes: []string{"n3"}, Ranks: []int{2}, ExitCode: iptr(143)}
	if err := w.Write(e); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(Event{Time: t0, Job: "42", Event: Resumed, Generation: -1, LostSteps: i64(0)}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2:\n%s", len(lines), b.String())
	}
	// The always-present fields come first, in this order.
	want := `{"level":"warn","job":"42","step":"42.0","restart":1,"relaunch":2,"node":"n3","event":"failure_detected","spec":"arc","generation":6,"bytes":1024,"duration_s":1.095522,"cause":"task 2 on n3: Killed","kind":"rank","nodes":["n3"],"ranks":[2],"exit_code":143,"time":"2026-05-01T12:00:00Z"}`
	if lines[0] != want {
		t.Errorf("line\n%s\nwant\n%s", lines[0], want)
	}
	// Unset optional fields stay out; a zero LostSteps that is set stays in.
	for _, absent := range []string{`"kind"`, `"nodes"`, `"ranks"`, `"replacement"`, `"exit_code"`} {
		if strings.Contains(lines[1], absent) {
			t.Errorf("%s in %s", absent, lines[1])
		}
	}
	for _, present := range []string{`"step":""`, `"node":""`, `"generation":-1`, `"bytes":0`, `"duration_s":0`, `"cause":""`, `"lost_steps":0`} {
		if !strings.Contains(lines[1], present) {
			t.Errorf("%s missing in %s", present, lines[1])
		}
	}
	got, bad, err := Read(&b)
	if err != nil || len(bad) != 0 || len(got) != 2 {
		t.Fatalf("Read: %v, %v, %d events", err, bad, len(got))
	}
	e.DurationS = 1.095522
	g := got[0]
	if g.Event != e.Event || g.Kind != e.Kind || g.Generation != 6 || g.DurationS != e.DurationS || *g.ExitCode != 143 ||
		!g.Time.Equal(t0) || g.Ranks[0] != 2 || g.Level != "warn" {
		t.Errorf("read back %+v, wrote %+v", g, e)
	}
	if got[1].LostSteps == nil || *got[1].LostSteps != 0 {
		t.Errorf("lost_steps read back as %v", got[1].LostSteps)
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestWriteErrorIsReturned(t *testing.T) {
	err := NewWriter(failWriter{}).Write(Event{Event: Completed})
	if err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("error %v, want the write error", err)
	}
}

func TestReadSkipsAndReportsBadLines(t *testing.T) {
	in := `{"event":"step_launched","job":"1","time":"2026-05-01T12:00:00Z"}
not json
{"job":"1"}

{"event":"completed","job":"1","time":"2026-05-01T12:00:01Z"}
{"event":"resu`
	ev, bad, err := Read(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(ev) != 2 || ev[0].Event != StepLaunched || ev[1].Event != Completed {
		t.Errorf("events %+v", ev)
	}
	if len(bad) != 3 || !strings.HasPrefix(bad[0].Error(), "line 2:") || !strings.Contains(bad[1].Error(), "line 3: no event field") ||
		!strings.HasPrefix(bad[2].Error(), "line 6:") {
		t.Errorf("bad lines %v", bad)
	}
}

func TestOpenAndReadFile(t *testing.T) {
	dir := t.TempDir()
	if ev, bad, err := ReadFile(Path(dir, "7")); ev != nil || bad != nil || err != nil {
		t.Fatalf("missing file: %v %v %v, want nothing", ev, bad, err)
	}
	w, err := Open(dir, "7")
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(Event{Time: t0, Job: "7", Event: Completed}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if Path(dir, "7") != filepath.Join(dir, "7", "recovery.jsonl") {
		t.Errorf("path %s", Path(dir, "7"))
	}
	ev, _, err := ReadFile(Path(dir, "7"))
	if err != nil || len(ev) != 1 {
		t.Fatalf("%v %v", ev, err)
	}
	if Path(dir, "../x") != filepath.Join(dir, ".._x", "recovery.jsonl") {
		t.Errorf("a job id with a slash escapes: %s", Path(dir, "../x"))
	}
	// A log directory that cannot be created names log.dir.
	blocker := filepath.Join(dir, "file")
	os.WriteFile(blocker, nil, 0o600)
	if _, err := Open(blocker, "7"); err == nil || !strings.Contains(err.Error(), "log.dir") {
		t.Errorf("Open under a file: %v", err)
	}
}

func TestSummarize(t *testing.T) {
	fail := func(kind string, nodes []string, ranks []int, cause string) Event {
		return Event{Event: FailureDetected, Kind: kind, Nodes: nodes, Ranks: ranks, Cause: cause}
	}
	rank2 := fail(KindRank, []string{"n3"}, []int{2}, "task 2 on n3: Killed")
	resumed := Event{Event: Resumed, Generation: 812, DurationS: 6.44, LostSteps: i64(0)}
	tests := []struct {
		name   string
		events []Event
		want   string
	}{
		{"no failure", []Event{{Event: StepLaunched}, {Event: Completed}}, ""},
		{"rank, resumed", []Event{{Event: StepLaunched}, rank2, {Event: StepRelaunched}, resumed, {Event: Completed}},
			"reft: 1 failure (rank 2 on n3), resumed from step 812 in 6.4 s, lost 0 steps"},
		{"relaunching", []Event{rank2}, "reft: 1 failure (rank 2 on n3), relaunching"},
		{"relaunched", []Event{rank2, {Event: StepRelaunched}}, "reft: 1 failure (rank 2 on n3), relaunched"},
		{"lost one step", []Event{rank2, {Event: Resumed, Generation: 5, DurationS: 1.43, LostSteps: i64(1)}},
			"reft: 1 failure (rank 2 on n3), resumed from step 5 in 1.4 s, lost 1 step"},
		{"lost unknown", []Event{rank2, {Event: Resumed, Generation: 5, DurationS: 2}},
			"reft: 1 failure (rank 2 on n3), resumed from step 5 in 2.0 s, lost steps unknown"},
		{"started over", []Event{rank2, {Event: Resumed, Generation: -1, DurationS: 3}},
			"reft: 1 failure (rank 2 on n3), started over (nothing to restore) in 3.0 s"},
		{"two, last a node replaced", []Event{rank2, resumed, fail(KindNode, []string{"n2"}, nil, "n2: not responding"),
			{Event: NodeExcluded, Node: "n2", Replacement: "n5"}, {Event: StepRelaunched}, resumed},
			"reft: 2 failures (last: node n2 lost, replaced by n5), resumed from step 812 in 6.4 s, lost 0 steps"},
		{"two nodes replaced", []Event{fail(KindNode, []string{"n2", "n3"}, nil, ""), {Event: NodeExcluded, Node: "n2", Replacement: "n4"},
			{Event: NodeExcluded, Node: "n3", Replacement: "n5"}, {Event: StepRelaunched}},
			"reft: 1 failure (nodes n2,n3 lost, replaced by n4,n5), relaunched"},
		{"requeued", []Event{fail(KindNode, []string{"n2"}, nil, ""), {Event: JobRequeued}},
			"reft: 1 failure (node n2 lost), no spare left, job requeued"},
		{"requeued, running again", []Event{fail(KindNode, []string{"n2"}, nil, ""), {Event: JobRequeued}, {Event: StepLaunched, Restart: 1}},
			"reft: 1 failure (node n2 lost), requeued, running again"},
		{"requeued, resumed", []Event{fail(KindNode, []string{"n2"}, nil, ""), {Event: JobRequeued}, {Event: StepLaunched, Restart: 1},
			{Event: Resumed, Restart: 1, Generation: 40, DurationS: 31.25, LostSteps: i64(1)}, {Event: Completed, Restart: 1}},
			"reft: 1 failure (node n2 lost), requeued, resumed from step 40 in 31.2 s, lost 1 step"},
		{"agent, gave up", []Event{fail(KindAgent, []string{"n1"}, nil, ""), {Event: GaveUp, Cause: "relaunch limit reached"}},
			"reft: 1 failure (agent on n1), gave up: relaunch limit reached"},
		{"stopped", []Event{rank2, {Event: Stopped, Cause: "received interrupt"}},
			"reft: 1 failure (rank 2 on n3), stopped: received interrupt"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Summarize(tt.events); got != tt.want {
				t.Errorf("\ngot  %q\nwant %q", got, tt.want)
			}
		})
	}
	long := Summarize([]Event{rank2, {Event: GaveUp, Cause: strings.Repeat("x", 500)}})
	if len(long) != MaxSummary || !strings.HasSuffix(long, "...") {
		t.Errorf("a long summary is %d bytes: %q", len(long), long)
	}
}

func TestDescribe(t *testing.T) {
	tests := []struct {
		e    Event
		want string
	}{
		{Event{Kind: KindRank, Nodes: []string{"n3"}, Ranks: []int{2}}, "rank 2 on n3"},
		{Event{Kind: KindRank, Nodes: []string{"n1", "n3"}, Ranks: []int{0, 2}}, "ranks 0,2 on n1,n3"},
		{Event{Kind: KindRank, Node: "n1"}, "a rank on n1"},
		{Event{Kind: KindAgent, Nodes: []string{"n2"}}, "agent on n2"},
		{Event{Kind: KindNode, Nodes: []string{"n2"}}, "node n2 lost"},
		{Event{Kind: KindNode, Nodes: []string{"n2", "n4"}}, "nodes n2,n4 lost"},
		{Event{Kind: KindStep, Cause: "srun exited with status 1"}, "step: srun exited with status 1"},
		{Event{Kind: KindStep}, "step failed"},
		{Event{Kind: KindHang, Nodes: []string{"n2"}, Ranks: []int{1, 5}}, "hang of rank(s) 1,5 on n2"},
		{Event{Kind: KindHang, Node: "n2"}, "hang on n2"},
	}
	for _, tt := range tests {
		if got := Describe(tt.e); got != tt.want {
			t.Errorf("Describe(%+v) = %q, want %q", tt.e, got, tt.want)
		}
	}
}

func TestFormat(t *testing.T) {
	tests := []struct {
		e    Event
		want string
	}{
		{Event{Event: StepLaunched, Step: "9.0", Nodes: []string{"n1", "n2"}, Spec: "arc"},
			"launched the step on n1,n2 (--reft=arc) [step 9.0]"},
		{Event{Event: FailureDetected, Kind: KindRank, Nodes: []string{"n2"}, Ranks: []int{1}, Cause: "task 1 on n2: Killed", Generation: 6},
			"failure: rank 1 on n2: task 1 on n2: Killed; newest committed snapshot: step 6"},
		{Event{Event: FailureDetected, Kind: KindAgent, Nodes: []string{"n2"}, Cause: "agent not answering", Generation: -1},
			"failure: agent on n2: agent not answering; newest committed snapshot: none"},
		{Event{Event: NodeExcluded, Node: "n2", Replacement: "n5"}, "excluded n2 for the rest of the allocation; spare n5 takes its ranks"},
		{Event{Event: StepRelaunched, Relaunch: 1, Nodes: []string{"n1", "n5"}, DurationS: 0.74, Cause: "rank failure: same nodes"},
			"relaunch 1 on n1,n5, 0.7 s after the failure (rank failure: same nodes)"},
		{Event{Event: RestoreLocal, Node: "n1", Ranks: []int{0, 1}, Generation: 5, Bytes: 780312 * 2, DurationS: 0.000203},
			"n1: ranks 0,1 restored step 5 from its tmpfs (1.5 MiB, 0.2 ms)"},
		{Event{Event: RestorePersistent, Node: "n5", Ranks: []int{3}, Generation: 500, Bytes: 100, DurationS: 2.5},
			"n5: rank 3 restored step 500 from the persistent directory (100 B, 2.5 s)"},
		{Event{Event: RestorePersistent, Node: "n5", Ranks: []int{3}, Generation: 500, Bytes: 100, DurationS: 2.5, Cause: "memory could not serve it: SG (pp=0,tp=0) lost ranks 2 and 3"},
			"n5: rank 3 restored step 500 from the persistent directory (100 B, 2.5 s): memory could not serve it: SG (pp=0,tp=0) lost ranks 2 and 3"},
		{Event{Event: Resumed, Generation: 5, DurationS: 1.43, LostSteps: i64(1)}, "resumed from step 5, 1.4 s after the failure, lost 1 step"},
		{Event{Event: Resumed, Generation: -1, DurationS: 2}, "started over, nothing to restore, 2.0 s after the failure"},
		{Event{Event: JobRequeued, Cause: "no spare"}, "requeued the job: no spare"},
		{Event{Event: GaveUp, Cause: "no progress"}, "gave up: no progress"},
		{Event{Event: Stopped, Cause: "received terminated"}, "stopped: received terminated"},
		{Event{Event: Completed, Relaunch: 2}, "the step completed after 2 relaunch(es)"},
		{Event{Event: Completed}, "the step completed"},
		{Event{Event: "peer_lost", Cause: "n3"}, "peer_lost: n3"},
	}
	for _, tt := range tests {
		if got := Format(tt.e); got != tt.want {
			t.Errorf("Format(%s)\ngot  %q\nwant %q", tt.e.Event, got, tt.want)
		}
	}
}

// sacctOut is `sacct -j 174 -D -P -n -o <SacctFields>` from the test
// cluster, with a Comment that holds the delimiter.
const sacctOut = `174|rjob.sh|COMPLETED|0:0|2026-11-21T21:58:28|2026-11-21T21:58:32|00:00:04|4|n[1-4]|reft: 1 failure (rank 2 on n3) | resumed
174.batch|batch|COMPLETED|0:0|2026-11-21T21:58:28|2026-11-21T21:58:32|00:00:04|1|n1|
174.extern|extern|COMPLETED|0:0|2026-11-21T21:58:28|2026-11-21T21:58:32|00:00:04|4|n[1-4]|
174.0|reft-train|CANCELLED|0:15|2026-11-21T21:58:29|2026-11-21T21:58:30|00:00:01|4|n[1-4]|
174.1|reft-probe|COMPLETED|0:0|2026-11-21T21:58:30|2026-11-21T21:58:30|00:00:00|4|n[1-4]|
174.2|reft-train|RUNNING|0:0|2026-11-21T21:58:30|Unknown|00:00:02|4|n[1-4]|
`

func TestParseSacct(t *testing.T) {
	loc := time.FixedZone("X", 3600)
	recs, err := ParseSacct(sacctOut, loc)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 6 {
		t.Fatalf("%d records", len(recs))
	}
	j := recs[0]
	if !j.IsJob() || j.Comment != "reft: 1 failure (rank 2 on n3) | resumed" || j.NNodes != 4 || j.NodeList != "n[1-4]" ||
		!j.Start.Equal(time.Date(2026, 11, 21, 21, 58, 28, 0, loc)) {
		t.Errorf("job record %+v", j)
	}
	if recs[3].StepID() != "0" || recs[3].IsJob() || recs[3].ExitCode != "0:15" || recs[3].State != "CANCELLED" {
		t.Errorf("step record %+v", recs[3])
	}
	if !recs[5].End.IsZero() {
		t.Errorf("Unknown end parsed as %v", recs[5].End)
	}
	for _, bad := range []struct{ in, want string }{
		{"1|a|b\n", "sacct line 1 has 3 fields, want 10"},
		{"1|a|COMPLETED|0:0|yesterday|None|0|1|n1|\n", `Start: "yesterday" is not a sacct time`},
		{"1|a|COMPLETED|0:0|None|None|0|x|n1|\n", `NNodes "x" is not a number`},
	} {
		if _, err := ParseSacct(bad.in, loc); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("ParseSacct(%q): %v, want %q", bad.in, err, bad.want)
		}
	}
}

func TestParseScontrolJob(t *testing.T) {
	line := "JobId=174 JobName=rjob.sh UserId=reft-alice(1001) JobState=RUNNING Reason=None Requeue=1 Restarts=2 " +
		"NodeList=n[1-4] BatchHost=n1 Comment=reft: 1 failure (rank 2 on n3), relaunched  StdErr=/x/r.out StdIn=/dev/null"
	j, err := ParseScontrolJob(line)
	if err != nil {
		t.Fatal(err)
	}
	want := JobInfo{State: "RUNNING", Restarts: 2, NodeList: "n[1-4]", Comment: "reft: 1 failure (rank 2 on n3), relaunched"}
	if j != want {
		t.Errorf("got %+v, want %+v", j, want)
	}
	j, err = ParseScontrolJob("JobId=1 JobState=PENDING Restarts=0 NodeList=(null)")
	if err != nil || j.NodeList != "" || j.Comment != "" {
		t.Errorf("pending job: %+v %v", j, err)
	}
	if _, err := ParseScontrolJob("slurm_load_jobs error"); err == nil {
		t.Error("garbage parsed")
	}
	if _, err := ParseScontrolJob("JobState=RUNNING Restarts=many"); err == nil || !strings.Contains(err.Error(), "Restarts") {
		t.Errorf("bad Restarts: %v", err)
	}
}

func TestTimeline(t *testing.T) {
	recs, err := ParseSacct(sacctOut, time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	at := func(s string) time.Time { tt, _ := time.Parse(time.RFC3339Nano, s); return tt }
	events := []Event{
		{Time: at("2026-11-21T21:58:29.072Z"), Event: StepLaunched, Step: "174.0", Nodes: []string{"n1"}},
		{Time: at("2026-11-21T21:58:30.168Z"), Event: FailureDetected, Step: "174.0", Kind: KindRank, Ranks: []int{2}, Nodes: []string{"n3"}},
		{Time: at("2026-11-21T21:58:30Z"), Event: StepRelaunched, Step: "174.2", Relaunch: 1},
	}
	tl := Timeline(recs, events)
	var got []string
	for _, e := range tl {
		got = append(got, e.Source+" "+e.Event+" "+e.Step)
	}
	want := []string{
		"slurm job_start ", "slurm step_start 174.batch", "slurm step_start 174.0", "reft step_launched 174.0",
		"slurm step_start 174.2", "reft step_relaunched 174.2", "slurm step_end 174.0", "reft failure_detected 174.0",
		"slurm step_end 174.batch", "slurm job_end ",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("timeline\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, e := range tl {
		if strings.Contains(e.Step, "extern") || (e.Sacct != nil && e.Sacct.Name == ProbeStepName) {
			t.Errorf("hidden step in the timeline: %+v", e)
		}
		if (e.Source == "slurm") != (e.Sacct != nil) || (e.Source == "reft") != (e.Recovery != nil) || e.Text == "" {
			t.Errorf("entry %+v", e)
		}
	}
	if tl[0].Text != "job 174 (rjob.sh) started on n[1-4] (4 nodes)" || tl[1].Text != "step 174.batch (batch) started on n1 (1 node)" {
		t.Errorf("texts %q, %q", tl[0].Text, tl[1].Text)
	}
}

// fakeTools writes sacct and scontrol stand-ins into a directory.
func fakeTools(t *testing.T, sacct, scontrol string) (string, string) {
	dir := t.TempDir()
	write := func(name, script string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"+script), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return write("sacct", sacct), write("scontrol", scontrol)
}

func TestCommand(t *testing.T) {
	logDir := t.TempDir()
	w, err := Open(logDir, "174")
	if err != nil {
		t.Fatal(err)
	}
	w.Write(Event{Time: time.Date(2026, 11, 21, 21, 58, 30, 168e6, time.Local), Job: "174", Step: "174.0", Event: FailureDetected,
		Kind: KindRank, Nodes: []string{"n3"}, Ranks: []int{2}, Cause: "task 2 on n3: Killed", Generation: 6})
	lost := int64(1)
	w.Write(Event{Time: time.Date(2026, 11, 21, 21, 58, 31, 568e6, time.Local), Job: "174", Step: "174.2", Event: Resumed, Relaunch: 1,
		Generation: 5, DurationS: 1.4, LostSteps: &lost, Cause: "all 4 ranks restored step 5",
		Phases: &Phases{StopS: 0.1, ProbeS: 0.3, ReplaceS: 0, BackoffS: 0.5, LaunchS: 0.4, RestoreS: 0.1}})
	w.Close()
	sacct, scontrol := fakeTools(t, "cat <<'EOF'\n"+sacctOut+"EOF\n",
		`echo "JobId=174 JobState=COMPLETED Restarts=0 NodeList=n[1-4] Comment=reft: 1 failure (rank 2 on n3), resumed from step 5 in 1.4 s, lost 1 step StdErr=/x"`)

	var out, errb bytes.Buffer
	code := Command([]string{"--log-dir", logDir, "--sacct", sacct, "--scontrol", scontrol, "174"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	text := out.String()
	for _, want := range []string{
		"job 174: COMPLETED, requeued 0 time(s)\n",
		"comment: reft: 1 failure (rank 2 on n3), resumed from step 5 in 1.4 s, lost 1 step\n",
		"reft   failure_detected    failure: rank 2 on n3: task 2 on n3: Killed; newest committed snapshot: step 6 [step 174.0]",
		"slurm  step_end            step 174.0 ended CANCELLED, exit 0:15, after 00:00:01",
		"reft   resumed             resumed from step 5, 1.4 s after the failure, lost 1 step (stop 0.1 s, probe 0.3 s, replace 0.0 s, backoff 0.5 s, launch 0.4 s, restore 0.1 s) [step 174.2]",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}

	out.Reset()
	if code := Command([]string{"--json", "--log-dir", logDir, "--sacct", sacct, "--scontrol", scontrol, "174"}, &out, &errb); code != 0 {
		t.Fatalf("--json exit %d", code)
	}
	var rep Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("--json output: %v\n%s", err, out.String())
	}
	if rep.Job != "174" || rep.State != "COMPLETED" || rep.Restarts == nil || *rep.Restarts != 0 || len(rep.Timeline) != 9 {
		t.Errorf("report %+v", rep)
	}
	var reft []string
	for _, e := range rep.Timeline {
		if e.Source != "reft" {
			continue
		}
		reft = append(reft, e.Event)
		switch {
		case e.Recovery == nil:
			t.Errorf("reft entry %+v", e)
		case e.Event == FailureDetected && e.Recovery.Kind != KindRank:
			t.Errorf("failure entry %+v", e.Recovery)
		case e.Event == Resumed && (e.Recovery.Phases == nil || *e.Recovery.Phases != Phases{StopS: 0.1, ProbeS: 0.3, BackoffS: 0.5, LaunchS: 0.4, RestoreS: 0.1}):
			t.Errorf("resumed entry's phases %+v", e.Recovery.Phases)
		}
	}
	if !slices.Equal(reft, []string{FailureDetected, Resumed}) {
		t.Errorf("reft entries %v, want the failure and the resume", reft)
	}

	// slurmctld has forgotten the job: state from sacct, restarts unknown.
	sacct2, gone := fakeTools(t, "cat <<'EOF'\n"+sacctOut+"EOF\n", "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1")
	out.Reset()
	if code := Command([]string{"--log-dir", logDir, "--sacct", sacct2, "--scontrol", gone, "174"}, &out, &errb); code != 0 {
		t.Fatalf("forgotten job: exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "job 174: COMPLETED, requeued unknown") {
		t.Errorf("forgotten job:\n%s", out.String())
	}
}

func TestCommandErrors(t *testing.T) {
	empty, scontrol := fakeTools(t, "true", "exit 1")
	broken, _ := fakeTools(t, "echo 'sacct: error: Problem talking to the database' >&2; exit 1", "true")
	dir := t.TempDir()
	badConf := filepath.Join(dir, "bad.toml")
	os.WriteFile(badConf, []byte("[log]\ndri = \"/x\"\n"), 0o644)
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no job", []string{}, 2, "want one numeric job id"},
		{"two jobs", []string{"1", "2"}, 2, "want one numeric job id"},
		{"not a job id", []string{"abc"}, 2, "want one numeric job id"},
		{"unknown flag", []string{"--bogus", "1"}, 2, "flag provided but not defined"},
		{"bad config", []string{"--config", badConf, "1"}, 1, `unknown key "log.dri"`},
		{"unknown job", []string{"--log-dir", dir, "--sacct", empty, "--scontrol", scontrol, "99"}, 1, "job 99: sacct has no record of it"},
		{"sacct fails", []string{"--log-dir", dir, "--sacct", broken, "99"}, 1, "Problem talking to the database"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := Command(tt.args, &out, &errb)
			if code != tt.code || !strings.Contains(errb.String(), tt.want) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, errb.String(), tt.code, tt.want)
			}
		})
	}
}

// TestTimelineResize: Slurm 24.11's sacct splits a job that lost a node
// under --no-kill into a RESIZING record and the next one (same start, the
// nodes left); the timeline shows one start and a resize, not two starts and
// an end.
func TestTimelineResize(t *testing.T) {
	const job1 = `127|demo.sbatch|RESIZING|0:0|2026-11-27T02:18:39|2026-11-27T02:18:51|00:00:12|5|n[1-5]|
127.batch|batch|RESIZING|0:0|2026-11-27T02:18:39|2026-11-27T02:18:51|00:00:12|1|n1|
127.0|reft-train|RESIZING|0:0|2026-11-27T02:18:39|2026-11-27T02:18:51|00:00:12|4|n[1-4]|
`
	const rest = `127|demo.sbatch|COMPLETED|0:0|2026-11-27T02:18:39|2026-11-27T02:19:05|00:00:26|4|n[1,3-5]|reft: 1 failure
127.2|reft-train|COMPLETED|0:0|2026-11-27T02:18:56|2026-11-27T02:19:05|00:00:09|4|n[1,3-5]|
`
	cases := []struct {
		name, sacct string
		want        []string // event: text
	}{
		{
			name:  "one resize",
			sacct: job1 + rest,
			want: []string{
				"job_start: job 127 (demo.sbatch) started on n[1-5] (5 nodes)",
				"step_start: step 127.batch (batch) started on n1 (1 node)",
				"step_start: step 127.0 (reft-train) started on n[1-4] (4 nodes)",
				"step_end: step 127.batch: its record ends with the job's resize, after 00:00:12",
				"step_end: step 127.0: its record ends with the job's resize, after 00:00:12",
				"job_resized: job 127 resized after 00:00:12: it goes on on n[1,3-5] (4 nodes)",
				"step_start: step 127.2 (reft-train) started on n[1,3-5] (4 nodes)",
				"step_end: step 127.2 ended COMPLETED, exit 0:0, after 00:00:09",
				"job_end: job 127 ended COMPLETED, exit 0:0, after 00:00:26",
			},
		},
		{
			name: "two resizes",
			sacct: job1 + `127|demo.sbatch|RESIZING|0:0|2026-11-27T02:18:39|2026-11-27T02:19:00|00:00:21|4|n[1,3-5]|
127|demo.sbatch|COMPLETED|0:0|2026-11-27T02:18:39|2026-11-27T02:19:05|00:00:26|3|n[1,4-5]|
`,
			want: []string{
				"job_start: job 127 (demo.sbatch) started on n[1-5] (5 nodes)",
				"step_start: step 127.batch (batch) started on n1 (1 node)",
				"step_start: step 127.0 (reft-train) started on n[1-4] (4 nodes)",
				"step_end: step 127.batch: its record ends with the job's resize, after 00:00:12",
				"step_end: step 127.0: its record ends with the job's resize, after 00:00:12",
				"job_resized: job 127 resized after 00:00:12: it goes on on n[1,3-5] (4 nodes)",
				"job_resized: job 127 resized after 00:00:21: it goes on on n[1,4-5] (3 nodes)",
				"job_end: job 127 ended COMPLETED, exit 0:0, after 00:00:26",
			},
		},
		{
			name:  "resize not yet in accounting",
			sacct: job1,
			want: []string{
				"job_start: job 127 (demo.sbatch) started on n[1-5] (5 nodes)",
				"step_start: step 127.batch (batch) started on n1 (1 node)",
				"step_start: step 127.0 (reft-train) started on n[1-4] (4 nodes)",
				"step_end: step 127.batch: its record ends with the job's resize, after 00:00:12",
				"step_end: step 127.0: its record ends with the job's resize, after 00:00:12",
				"job_resized: job 127 resized after 00:00:12: its allocation on n[1-5] (5 nodes) ends",
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			recs, err := ParseSacct(c.sacct, time.UTC)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range Timeline(recs, nil) {
				got = append(got, e.Event+": "+e.Text)
			}
			if strings.Join(got, "\n") != strings.Join(c.want, "\n") {
				t.Errorf("timeline\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(c.want, "\n"))
			}
		})
	}
}
