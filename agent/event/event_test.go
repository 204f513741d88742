package event

import (
	"os"
	"slices"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	cases := []struct {
		name string
		line map[string]any
		want string // "" for nil
	}{
		{"undeclared event", map[string]any{"event": "gc_done"}, ""},
		{"no event", map[string]any{"message": "hello"}, ""},
		{"restore with its fields", map[string]any{"event": RestorePeer, "rank": 1, "generation": 7, "bytes": 10}, ""},
		{"restore without bytes", map[string]any{"event": Decode, "rank": 1, "generation": 7},
			"a decode line (written by agent) lacks its declared field(s) bytes"},
		{"optional fields may be absent", map[string]any{"event": FailureDetected, "failed_node": "n2", "class": "node",
			"latency_s": 1.5, "last_heard": "t", "detected_at": "t", "reporter": "n1", "coordinator": "n1"}, ""},
		{"failure without its class and reporter", map[string]any{"event": FailureDetected, "failed_node": "n2",
			"latency_s": 1.5, "last_heard": "t", "detected_at": "t", "coordinator": "n1"},
			"lacks its declared field(s) class, reporter"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(tc.line)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Check: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Check: %v, want %q", err, tc.want)
			}
		})
	}
}

// TestDeclarations: names are unique, every restore event is declared,
// and no field is both required and optional.
func TestDeclarations(t *testing.T) {
	seen := map[string]bool{}
	for _, d := range Declared {
		if seen[d.Name] {
			t.Errorf("%s declared twice", d.Name)
		}
		seen[d.Name] = true
		if d.By == "" || len(d.Fields) == 0 {
			t.Errorf("%s: no writer or no fields", d.Name)
		}
		for _, f := range d.Fields {
			if slices.Contains(d.Optional, f) {
				t.Errorf("%s: %s both required and optional", d.Name, f)
			}
		}
	}
	for _, r := range Restores {
		if !seen[r] {
			t.Errorf("restore event %s not declared", r)
		}
	}
}

// TestEventsPage: docs/EVENTS.md names every declared event and its fields.
func TestEventsPage(t *testing.T) {
	b, err := os.ReadFile("../../docs/EVENTS.md")
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	for _, d := range Declared {
		i := strings.Index(page, "| `"+d.Name+"` |")
		if i < 0 {
			t.Errorf("docs/EVENTS.md has no row for %s", d.Name)
			continue
		}
		row, _, _ := strings.Cut(page[i:], "\n")
		for _, f := range slices.Concat(d.Fields, d.Optional) {
			if !strings.Contains(row, "`"+f+"`") {
				t.Errorf("docs/EVENTS.md's row for %s does not name field %s", d.Name, f)
			}
		}
	}
}
