package run

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/reft-hpc/reft/launcher/recoverylog"
)

func appendLines(t *testing.T, path string, text string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(text); err != nil {
		t.Fatal(err)
	}
}

func TestWatcher(t *testing.T) {
	dir := t.TempDir()
	n1, n2 := filepath.Join(dir, "n1.record"), filepath.Join(dir, "n2.record")
	// Before the relaunch: the first step's restores, which must not count.
	appendLines(t, n1, strings.Join(restoreLog("n1", 0, "0", 3), "\n")+"\n")
	appendLines(t, filepath.Join(dir, recoverylog.FileName), `{"event":"restore_local","rank":0,"node":"n1"}`+"\n")
	w := NewWatcher(dir, []string{"n1", "n2"})
	if err := w.Mark(); err != nil {
		t.Fatal(err)
	}
	if err := w.Poll(); err != nil || len(w.Restores("")) != 0 {
		t.Fatalf("old lines seen: %v %v", w.Restores(""), err)
	}

	// The relaunch (step 2): n1 completely, n2 with a torn last line.
	// The agents' logs are not read, only their records: a restore of
	// rank 5 logged (not recorded) on n1 is not seen.
	appendLines(t, filepath.Join(dir, "n1.jsonl"), `{"event":"restore_local","rank":5,"node":"n1","generation":5,"time":"2026-05-01T12:00:03Z"}`+"\n")
	appendLines(t, n1, strings.Join(restoreLog("n1", 0, "2", 5), "\n")+"\n")
	n2lines := restoreLog("n2", 1, "2", 5)
	appendLines(t, n2, n2lines[0]+"\n"+n2lines[1][:40])
	// Another step's client on n2 (an unrelated srun of the job).
	appendLines(t, n1, strings.Join(restoreLog("n1", 7, "9", 1), "\n")+"\n")
	if err := w.Poll(); err != nil {
		t.Fatal(err)
	}
	if got := w.Restores("2"); len(got) != 1 || got[0].Generation != 5 || got[0].Step != "2" {
		t.Fatalf("restores of step 2 %+v", got)
	}
	if w.Registered("2") != 2 || w.Registered("") != 3 {
		t.Errorf("registered: step 2 %d, all %d", w.Registered("2"), w.Registered(""))
	}
	appendLines(t, n2, n2lines[1][40:]+"\n")
	if err := w.Poll(); err != nil {
		t.Fatal(err)
	}
	got := w.Restores("2")
	if len(got) != 2 || got[1].Node != "n2" || got[1].Bytes != 100 || got[1].Duration != 250*time.Microsecond ||
		!got[1].Time.Equal(time.Date(2026, 5, 1, 12, 0, 3, 1e8, time.UTC)) {
		t.Fatalf("restores after the rest of the line: %+v", got)
	}
	if miss := w.MissingNodes([]string{"n1", "n2", "n5"}); !slices.Equal(miss, []string{"n5"}) {
		t.Errorf("missing %v", miss)
	}
	// Mark forgets what was read.
	if w.Mark(); len(w.Restores("")) != 0 {
		t.Error("Mark kept old restores")
	}
	// A log directory that does not exist (yet) is no error.
	if err := NewWatcher(filepath.Join(dir, "none"), []string{"n1"}).Poll(); err != nil {
		t.Errorf("missing directory: %v", err)
	}
}

func TestRestoreSummaries(t *testing.T) {
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	rs := map[int]agentRecord{
		0: {Event: recoverylog.RestoreLocal, Node: "n1", Rank: 0, Generation: 5, Bytes: 10, Duration: time.Millisecond, Time: t0},
		1: {Event: recoverylog.RestoreLocal, Node: "n1", Rank: 1, Generation: 5, Bytes: 10, Duration: 3 * time.Millisecond, Time: t0.Add(time.Second)},
		2: {Event: recoverylog.RestorePeer, Node: "n5", Rank: 2, Generation: 5, Bytes: 20, Duration: time.Second, Time: t0},
		3: {Event: recoverylog.RestoreLocal, Node: "n3", Rank: 3, Generation: 5, Bytes: 10, Time: t0},
	}
	got := RestoreSummaries(rs)
	if len(got) != 3 {
		t.Fatalf("%d summaries: %+v", len(got), got)
	}
	a := got[0]
	if a.Node != "n1" || a.Event != recoverylog.RestoreLocal || !slices.Equal(a.Ranks, []int{0, 1}) || a.Bytes != 20 ||
		a.DurationS != 0.003 || !a.Time.Equal(t0.Add(time.Second)) || a.Generation != 5 {
		t.Errorf("n1 summary %+v", a)
	}
	if got[1].Node != "n3" || got[2].Node != "n5" || got[2].Event != recoverylog.RestorePeer {
		t.Errorf("order %+v", got)
	}
	if got[0].Cause != "served by the node's agent" {
		t.Errorf("n1 cause %q", got[0].Cause)
	}

	// A persistent-tier restore carries the agent's reason: why memory
	// could not serve it is what the operator reads in the log.
	w := NewWatcher(t.TempDir(), []string{"n4"})
	w.line("n4", []byte(`{"v":1,"kind":"restored","time":"2026-05-01T12:00:00Z","node":"n4","event":"restore_persistent","rank":1,"generation":10,"bytes":5,"duration_ns":2000000,"reason":"SG (pp=0,tp=0) lost ranks 1 and 2"}`))
	ps := RestoreSummaries(w.Restores(""))
	if len(ps) != 1 || ps[0].Event != recoverylog.RestorePersistent || ps[0].Cause != "memory could not serve it: SG (pp=0,tp=0) lost ranks 1 and 2" {
		t.Errorf("persistent restore summary %+v", ps)
	}
}

// TestWatcherTrustsOnlyTheJobsOwnLogs: the watcher reads the agents'
// logs only from a job directory of the job's uid, only files named
// after the allocation's nodes, not through links, and only lines that
// name the file's node (issue 14, finding 4).
func TestWatcherTrustsOnlyTheJobsOwnLogs(t *testing.T) {
	verdict := func(node, failed string) string {
		return `{"v":1,"kind":"failure","time":"2026-05-01T12:00:00Z","node":"` + node + `","failure":{"failed_node":"` + failed + `","class":"node","cause":"forged"}}` + "\n"
	}
	cases := []struct {
		name  string
		plant func(t *testing.T, dir string) // after Mark
		uid   int                            // the job's uid as the watcher knows it
		want  []string                       // failed nodes read
		err   string                         // Poll's error
	}{
		{"the allocation's agent", func(t *testing.T, d string) { appendLines(t, filepath.Join(d, "n1.record"), verdict("n1", "n2")) },
			os.Getuid(), []string{"n2"}, ""},
		{"a node outside the allocation", func(t *testing.T, d string) { appendLines(t, filepath.Join(d, "n9.record"), verdict("n9", "n2")) },
			os.Getuid(), nil, ""},
		{"not a node's log", func(t *testing.T, d string) { appendLines(t, filepath.Join(d, "evil.record"), verdict("n1", "n2")) },
			os.Getuid(), nil, ""},
		{"a line naming another node", func(t *testing.T, d string) { appendLines(t, filepath.Join(d, "n1.record"), verdict("n3", "n2")) },
			os.Getuid(), nil, ""},
		{"a node's log is a link", func(t *testing.T, d string) {
			other := filepath.Join(t.TempDir(), "forged.jsonl")
			appendLines(t, other, verdict("n1", "n2"))
			if err := os.Symlink(other, filepath.Join(d, "n1.record")); err != nil {
				t.Fatal(err)
			}
		}, os.Getuid(), nil, ""},
		{"the directory is another user's", func(t *testing.T, d string) { appendLines(t, filepath.Join(d, "n1.record"), verdict("n1", "n2")) },
			os.Getuid() + 1, nil, "belongs to uid"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "42")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			w := NewWatcher(dir, []string{"n1", "n2", "n3"})
			w.uid = tc.uid
			if err := w.Mark(); (err != nil) != (tc.err != "") {
				t.Fatalf("Mark: %v", err)
			}
			tc.plant(t, dir)
			err := w.Poll()
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("Poll = %v, want error %q", err, tc.err)
			}
			var got []string
			for _, f := range w.Failures() {
				got = append(got, f.Node)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("failures of %v read, want %v", got, tc.want)
			}
		})
	}
}
