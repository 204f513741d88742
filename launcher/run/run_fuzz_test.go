package run

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reft-hpc/reft/agent/proto"
)

// FuzzParseReports: the probe step's output (srun merges every node's
// lines, and a task's output can be anything) never panics ParseReports,
// which returns only wanted nodes' reports, each under its own name; and
// a report written by writeReport after any garbage still reads back
// whole.
func FuzzParseReports(f *testing.F) {
	var b bytes.Buffer
	rep := AgentReport{Node: "n1", Job: "42", OK: true, Status: &proto.Status{}}
	js, err := json.Marshal(rep)
	if err != nil {
		f.Fatal(err)
	}
	if err := writeReport(&b, "n1", js); err != nil {
		f.Fatal(err)
	}
	f.Add(b.Bytes())
	f.Add([]byte(`{"node":"n2","ok":false,"error":"x"}` + "\nreft-report n1 2/2 x\nreft-report n1 1/2 {\"node\":\nreft-report n1 1/0 y\n"))
	f.Add([]byte("reft-report n3 1/65536 {\nreft-report n3 2/65536 }\nreft-report n3 3/-1 \r\n"))
	f.Add([]byte("reft-report n1 1/2 {\"node\":\"n1\",\nreft-report n2 1/1 {\"node\":\"n2\"}\nreft-report n1 2/2 \"ok\":true}\n"))
	want := []string{"n1", "n2", "n3", "?"}
	f.Fuzz(func(t *testing.T, out []byte) {
		for node, r := range ParseReports(out, want) {
			if r.Node != node || !strings.Contains(strings.Join(want, " "), node) {
				t.Fatalf("report of %q filed as %q", r.Node, node)
			}
		}
		// Append a real report of a big status (several pieces) after the
		// garbage: a new report (piece 1) starts over, whatever came before.
		rep := AgentReport{Node: "n3", Job: "42", OK: true, Error: strings.Repeat("e", 1500)}
		js, err := json.Marshal(rep)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		b.Write(out)
		b.WriteByte('\n')
		if err := writeReport(&b, "n3", js); err != nil {
			t.Fatal(err)
		}
		if got, ok := ParseReports(b.Bytes(), want)["n3"]; ok && len(out) < 1<<20 && (got.Node != rep.Node || got.Error != rep.Error || !got.OK) {
			t.Fatalf("the appended report read back as %+v", got)
		} else if !ok && len(out) < 1<<20 {
			t.Fatalf("the appended report was lost after %q", out)
		}
	})
}

// FuzzScan: srun's stderr carries the tasks' stderr too, so any line may
// reach Outcome.Scan: it never panics, and a task exit it records names a
// node and at most maxTasks tasks.
func FuzzScan(f *testing.F) {
	for _, s := range []string{"srun: error: n1: task 2: Killed", "srun: error: n1: tasks 0-3,7: Exited with exit code 1",
		"srun: error: Node failure on n2", "srun: Job step aborted: Waiting up to 32 seconds", "srun: error: n1: tasks 0-1048575,0-1048575: x",
		"srun: error: n1: tasks 5-3: x", "srun: error: n1: tasks 99999999999999999999: x", "srun: error: n1: task -1: x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		var o Outcome
		for _, line := range strings.Split(in, "\n") {
			o.Scan(line, time.Unix(1, 0))
		}
		n := 0
		for _, te := range o.Tasks {
			n += len(te.Tasks)
			if te.Node == "" || len(te.Tasks) == 0 {
				t.Fatalf("task exit %+v", te)
			}
		}
		if n > maxTasks*(strings.Count(in, "\n")+1) {
			t.Fatalf("%d tasks from %d bytes", n, len(in))
		}
		_ = o.Culprits()
	})
}

// FuzzWatcher: the agents' run records live in the shared log directory:
// whatever a .record file there holds, the watcher reads it without
// panicking, and what it reports names a node. (agent/runrecord's
// FuzzDecode holds the decoder to its rules.)
func FuzzWatcher(f *testing.F) {
	f.Add([]byte(`{"v":1,"kind":"failure","time":"2026-01-01T00:00:00Z","node":"n1","failure":{"failed_node":"n2","class":"node","ranks":[1],"latency_ns":1500000000}}`+"\n"+
		`{"v":1,"kind":"registered","node":"n1","pid":7,"step":"42.0","rank":3}`+"\n"+
		`{"v":1,"kind":"restored","node":"n1","pid":7,"step":"42.0","event":"restore_local","rank":3,"generation":5,"bytes":100,"duration_ns":9223372036854775807}`+"\n{partial"), []byte("}\n"))
	f.Add([]byte(`{"v":1,"kind":"restored","node":"n1","event":"restore_peer","rank":-1,"generation":-9223372036854775808,"duration_ns":-1}`+"\n"+
		`{"v":2,"kind":"failure","node":"n1"}`+"\n"+`{"v":1,"kind":"later","node":"n1"}`+"\n"), []byte(nil))
	f.Fuzz(func(t *testing.T, first, more []byte) {
		dir := t.TempDir()
		path := filepath.Join(dir, "n1.record")
		w := NewWatcher(dir, []string{"n1", "n2"})
		for _, b := range [][]byte{first, more} {
			fh, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := fh.Write(b); err != nil {
				t.Fatal(err)
			}
			fh.Close()
			if err := w.Poll(); err != nil {
				t.Fatalf("Poll: %v", err)
			}
		}
		for _, fl := range w.Failures() {
			if fl.Node == "" {
				t.Fatalf("failure without a node: %+v", fl)
			}
		}
		_ = w.Registered("42.0")
		for _, r := range w.Restores("") {
			if r.Node != "n1" || r.Rank < 0 || r.Generation < 0 || r.Bytes < 0 || r.Duration < 0 {
				t.Fatalf("restore taken against the record's rules: %+v", r)
			}
		}
		_ = RestoreSummaries(w.Restores(""))
		_ = w.MissingNodes([]string{"n1", "n2"})
	})
}

// FuzzParseNodeStates: `scontrol -o show node` (features, comments and
// reasons are admins' and users' text) parses to whitespace-free node
// names and states.
func FuzzParseNodeStates(f *testing.F) {
	f.Add("NodeName=n1 Arch=x86_64 State=IDLE Reason=none\nNodeName=n2 State=DOWN+NOT_RESPONDING Reason=x State=y\n")
	f.Add("NodeName= State=\nState=IDLE NodeName=n3\n NodeName=n4 State=MIXED")
	f.Fuzz(func(t *testing.T, out string) {
		for n, st := range ParseNodeStates(out) {
			if n == "" || st == "" || strings.ContainsAny(n+st, " \t\n\r") {
				t.Fatalf("node %q state %q", n, st)
			}
		}
	})
}

// FuzzProcState: any /proc stat text gives a state or an error, never a
// panic.
func FuzzProcState(f *testing.F) {
	f.Add([]byte("1234 (reft-agent) S 1 1234 1234 0 -1"))
	f.Add([]byte("1 (a) b) Z"))
	f.Add([]byte(")"))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := procState(b)
		if err == nil && st == 0 && !bytes.Contains(b, []byte(") \x00")) {
			t.Errorf("procState(%q): no state and no error", b)
		}
	})
}
