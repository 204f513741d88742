package logging

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestOpenWritesJSONLinesWithFields(t *testing.T) {
	dir := t.TempDir()
	var console bytes.Buffer // not a terminal: nothing must be printed there
	l, c, err := Open(Options{Dir: dir, Level: "debug", Console: &console},
		Fields{Job: "42", Step: "extern", Node: "n3", Restart: 2})
	if err != nil {
		t.Fatal(err)
	}
	l.Info().Str("event", "started").Msg("agent up")
	l.Debug().Msg("detail")
	l.Trace().Msg("below level")
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "42", "n3.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	ls := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(ls) != 2 {
		t.Fatalf("want 2 lines (trace filtered), got %d:\n%s", len(ls), data)
	}
	for _, line := range ls {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line is not JSON: %q: %v", line, err)
		}
		for k, want := range map[string]any{"job": "42", "step": "extern", "node": "n3", "restart": 2.0} {
			if m[k] != want {
				t.Errorf("line %q: %s = %v, want %v", line, k, m[k], want)
			}
		}
		if m["time"] == nil || m["level"] == nil || m["message"] == nil {
			t.Errorf("line %q lacks time, level or message", line)
		}
	}
	if console.Len() != 0 {
		t.Errorf("a non-terminal console got output: %q", console.String())
	}
}

func TestOpenErrors(t *testing.T) {
	tests := []struct {
		name string
		o    Options
		want string
	}{
		{"bad level", Options{Dir: t.TempDir(), Level: "loud"}, "valid levels"},
		{"empty level", Options{Dir: t.TempDir(), Level: ""}, "valid levels"},
		{"unwritable dir", Options{Dir: "/proc/reft-no", Level: "info"}, "log.dir"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := Open(tt.o, Fields{Job: "1", Node: "n1"})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestConsoleWriterIsHumanReadable(t *testing.T) {
	var b bytes.Buffer
	l := With(newConsoleLogger(&b), Fields{Job: "7", Step: "0", Node: "n1"})
	l.Info().Msg("hello there")
	out := b.String()
	if strings.HasPrefix(out, "{") || !strings.Contains(out, "hello there") || !strings.Contains(out, "n1") {
		t.Fatalf("console line %q is not human readable", out)
	}
}

func TestPathStaysInDir(t *testing.T) {
	if got := Path("/l", "../x", "a/b"); got != "/l/.._x/a_b.jsonl" {
		t.Fatalf("Path = %q", got)
	}
}
