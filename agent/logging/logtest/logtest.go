// Package logtest captures a component's zerolog JSON output in tests: a
// writer the component's goroutines and the test share, and the lines of
// one event.
package logtest

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/reft-hpc/reft/agent/event"
)

// Buffer is a log sink safe for concurrent writes and reads.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is everything written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Events returns the JSON lines whose "event" is ev, decoded.
func (l *Buffer) Events(ev string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(l.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["event"] == ev {
			out = append(out, m)
		}
	}
	return out
}

// CheckEvents fails t, when its test ends, for every line of a declared
// event (agent/event) in l that lacks a field its declaration names.
// Call it before starting what logs to l: the check then runs after the
// cleanups that stop it. Lines written after the check are not seen.
func (l *Buffer) CheckEvents(t testing.TB) {
	t.Helper()
	t.Cleanup(func() {
		for _, err := range l.EventErrors() {
			t.Error(err)
		}
	})
}

// EventErrors checks every line of a declared event in l (agent/event),
// one error per distinct problem.
func (l *Buffer) EventErrors() []error {
	return CheckLines(l.String())
}

// CheckLines checks every JSON line of a declared event in text against
// its declaration, one error per distinct problem.
func CheckLines(text string) []error {
	var out []error
	seen := map[string]bool{}
	for _, line := range strings.Split(text, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) != nil {
			continue
		}
		if err := event.Check(m); err != nil && !seen[err.Error()] {
			seen[err.Error()] = true
			out = append(out, err)
		}
	}
	return out
}
