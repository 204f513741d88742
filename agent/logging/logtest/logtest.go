// Package logtest captures a component's zerolog JSON output in tests: a
// writer the component's goroutines and the test share, and the lines of
// one event.
package logtest

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
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
