package metrics

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/agent/runpath"
)

func openDir(t *testing.T, dir string) *os.File {
	t.Helper()
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// TestCarryAcrossAgents: a job's second agent on a node reports the first
// one's counts plus its own, and leaves the sum for a third.
func TestCarryAcrossAgents(t *testing.T) {
	dir := openDir(t, t.TempDir())
	first := NewRecorder()
	first.Failure("node", 0.6)
	first.Snapshot(0.01)
	first.Restore("peer", 0.2)
	first.Replicated(1000, 0.05)
	if err := first.SaveCarry(dir, "7", "n1"); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir.Name(), CarryName)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the carry file: %v %v, want mode 0600", fi, err)
	}

	prev, err := ReadCarry(dir, "7", "n1")
	if err != nil || prev == nil {
		t.Fatalf("ReadCarry: %v %v", prev, err)
	}
	second := NewRecorder()
	if err := second.Carry(prev); err != nil {
		t.Fatal(err)
	}
	second.Failure("node", 1.5)
	second.Snapshot(0.02)
	m := second.Status()
	if m.FailuresDetected["node"] != 2 || m.FailuresDetected["agent"] != 0 {
		t.Errorf("failures %v, want node 2 (one of each agent)", m.FailuresDetected)
	}
	if m.DetectionSeconds.Count != 2 || m.DetectionSeconds.Sum != 2.1 {
		t.Errorf("detection %+v, want count 2 sum 2.1", m.DetectionSeconds)
	}
	if m.SnapshotSeconds.Count != 2 || m.RestoreSeconds["peer"].Count != 1 || m.ReplicationBytes != 1000 {
		t.Errorf("snapshot count %d, restore peer %d, replication bytes %d: want 2, 1, 1000",
			m.SnapshotSeconds.Count, m.RestoreSeconds["peer"].Count, m.ReplicationBytes)
	}
	last := m.DetectionSeconds.Buckets[len(m.DetectionSeconds.Buckets)-1]
	if last.Count != 2 {
		t.Errorf("the detection histogram's last bucket %+v, want both observations", last)
	}
	// Asking twice does not add the carry twice.
	if again := second.Status(); again.FailuresDetected["node"] != 2 {
		t.Errorf("a second Status: failures %v", again.FailuresDetected)
	}

	if err := second.SaveCarry(dir, "7", "n1"); err != nil {
		t.Fatal(err)
	}
	prev, err = ReadCarry(dir, "7", "n1")
	if err != nil {
		t.Fatal(err)
	}
	third := NewRecorder()
	if err := third.Carry(prev); err != nil {
		t.Fatal(err)
	}
	if got := third.Status().FailuresDetected["node"]; got != 2 {
		t.Errorf("the third agent starts at %d node failures, want 2", got)
	}
	if ents, _ := os.ReadDir(dir.Name()); len(ents) != 1 {
		t.Errorf("the directory holds %v, want only %s (no temp files left)", ents, CarryName)
	}
}

// TestSaveCarryStaleTemp: a temp file a killed agent left, or a link in its
// place, is removed (the link itself, never its target) and the save goes
// on; only CarryName is left.
func TestSaveCarryStaleTemp(t *testing.T) {
	for _, stale := range []string{"file", "symlink"} {
		t.Run(stale, func(t *testing.T) {
			dir := t.TempDir()
			target := filepath.Join(t.TempDir(), "target")
			if err := os.WriteFile(target, []byte("not ours"), 0o600); err != nil {
				t.Fatal(err)
			}
			tmp := filepath.Join(dir, runpath.CarryTempName)
			var err error
			if stale == "file" {
				err = os.WriteFile(tmp, []byte("half a save"), 0o600)
			} else {
				err = os.Symlink(target, tmp)
			}
			if err != nil {
				t.Fatal(err)
			}
			r := NewRecorder()
			r.Failure("node", 1)
			if err := r.SaveCarry(openDir(t, dir), "7", "n1"); err != nil {
				t.Fatalf("SaveCarry over a stale %s: %v", stale, err)
			}
			if b, _ := os.ReadFile(target); string(b) != "not ours" {
				t.Errorf("the link's target was written: %q", b)
			}
			ents, _ := os.ReadDir(dir)
			if len(ents) != 1 || ents[0].Name() != CarryName {
				t.Errorf("the directory holds %v, want only %s", ents, CarryName)
			}
			if m, err := ReadCarry(openDir(t, dir), "7", "n1"); err != nil || m.FailuresDetected["node"] != 1 {
				t.Errorf("read back %+v %v", m, err)
			}
		})
	}
}

// TestReadCarryNone: the job's first agent on a node finds nothing.
func TestReadCarryNone(t *testing.T) {
	m, err := ReadCarry(openDir(t, t.TempDir()), "7", "n1")
	if m != nil || err != nil {
		t.Fatalf("ReadCarry of an empty directory: %v %v, want nil, nil", m, err)
	}
}

// TestReadCarryRefuses: a link, a FIFO, or a directory in the file's
// place is refused, never followed or blocked on.
func TestReadCarryRefuses(t *testing.T) {
	cases := []struct {
		name string
		make func(path string) error
		want string
	}{
		{"symlink", func(p string) error {
			other := filepath.Join(t.TempDir(), "other")
			if err := os.WriteFile(other, validCarry(t), 0o600); err != nil {
				return err
			}
			return os.Symlink(other, p)
		}, "too many levels"},
		{"fifo", func(p string) error { return unix.Mkfifo(p, 0o600) }, "not a regular file"},
		{"directory", func(p string) error { return os.Mkdir(p, 0o700) }, "not a regular file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := c.make(filepath.Join(dir, CarryName)); err != nil {
				t.Fatal(err)
			}
			m, err := ReadCarry(openDir(t, dir), "7", "n1")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("ReadCarry: %v %v, want an error saying %q", m, err, c.want)
			}
		})
	}
}

func validCarry(t *testing.T) []byte {
	r := NewRecorder()
	r.Failure("hang", 3)
	b, err := json.Marshal(carryFile{Version: carryVersion, Job: "7", Node: "n1", Metrics: r.Status()})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestParseCarryRefuses: what a Recorder could not have written is refused
// with its reason.
func TestParseCarryRefuses(t *testing.T) {
	edit := func(f func(c *carryFile)) []byte {
		var c carryFile
		if err := json.Unmarshal(validCarry(t), &c); err != nil {
			t.Fatal(err)
		}
		f(&c)
		b, _ := json.Marshal(c)
		return b
	}
	cases := []struct {
		name string
		b    []byte
		want string
	}{
		{"not JSON", []byte("node 1"), "not a carry file"},
		{"unknown field", []byte(`{"version":1,"job":"7","node":"n1","metrics":{},"extra":1}`), "unknown field"},
		{"trailing data", append(validCarry(t), []byte(`{}`)...), "data after"},
		{"version", edit(func(c *carryFile) { c.Version = 2 }), "format version 2"},
		{"job", edit(func(c *carryFile) { c.Job = "8" }), `not job "7"`},
		{"node", edit(func(c *carryFile) { c.Node = "n2" }), `node "n2"`},
		{"no metrics", edit(func(c *carryFile) { c.Metrics = nil }), "no metrics"},
		{"class", edit(func(c *carryFile) { c.Metrics.FailuresDetected["gpu"] = 1 }), `unknown class "gpu"`},
		{"source", edit(func(c *carryFile) { c.Metrics.RestoreSeconds["s3"] = &proto.Histogram{} }), `unknown source "s3"`},
		{"schedule", edit(func(c *carryFile) { c.Metrics.ReplicationSchedule = &proto.ReplicationSchedule{} }), "replication schedule"},
		{"buckets", edit(func(c *carryFile) { c.Metrics.DetectionSeconds.Buckets = c.Metrics.DetectionSeconds.Buckets[1:] }), "9 buckets"},
		{"bound", edit(func(c *carryFile) { c.Metrics.SnapshotSeconds.Buckets[0].LE = 7 }), "bound 7"},
		{"not cumulative", edit(func(c *carryFile) { c.Metrics.DetectionSeconds.Buckets[9].Count = 0 }), "bucket 9's count 0"},
		{"over the count", edit(func(c *carryFile) { c.Metrics.DetectionSeconds.Count = 0 }), "the count 0"},
		{"sum", edit(func(c *carryFile) { c.Metrics.EncodeSeconds.Sum = -1 }), "sum -1"},
		{"too large", make([]byte, carryMax+1), "larger than"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := ParseCarry(c.b, "7", "n1")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("ParseCarry: %v %v, want an error saying %q", m, err, c.want)
			}
		})
	}
	if _, err := ParseCarry(validCarry(t), "7", "n1"); err != nil {
		t.Fatalf("the valid carry: %v", err)
	}
}
