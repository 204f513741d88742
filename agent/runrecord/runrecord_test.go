package runrecord

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestRoundTrip(t *testing.T) {
	at := time.Date(2026, 5, 1, 12, 0, 0, 5, time.UTC)
	cases := []struct {
		name string
		rec  Record
	}{
		{"registered", Record{Kind: KindRegistered, Rank: 3, PID: 77, Step: "2"}},
		{"registered without a step", Record{Kind: KindRegistered, Rank: 0}},
		{"restored", Record{Kind: KindRestored, Rank: 1, PID: 9, Step: "4", Event: "restore_persistent", Generation: 10,
			Bytes: 5 << 30, Duration: 1500 * time.Millisecond, Reason: "SG (pp=0,tp=0) lost ranks 1 and 2"}},
		{"restored step 0", Record{Kind: KindRestored, Rank: 2, Event: "decode"}},
		{"failure", Record{Kind: KindFailure, Failure: &Failure{FailedNode: "n3", Class: "hang", Ranks: []int{4, 5},
			Cause: "no progress", Coordinator: "n1", Reporter: "n3", ConfirmedBy: []string{"n2"}, Latency: time.Minute,
			LastHeard: at.Add(-time.Minute), DetectedAt: at}}},
		{"node failure with a quorum", Record{Kind: KindFailure, Failure: &Failure{FailedNode: "n2", Class: "node",
			Quorum: true, Votes: 3, Agents: 4, DetectedAt: at}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			w := NewWriter(&buf, "n1", func() time.Time { return at })
			if err := w.Write(tc.rec); err != nil {
				t.Fatal(err)
			}
			line := buf.Bytes()
			if bytes.Count(line, []byte{'\n'}) != 1 || line[len(line)-1] != '\n' {
				t.Fatalf("not one line: %q", line)
			}
			got, err := Decode(bytes.TrimSuffix(line, []byte{'\n'}))
			if err != nil {
				t.Fatalf("Decode(%s): %v", line, err)
			}
			want := tc.rec
			want.V, want.Node, want.Time = Version, "n1", at
			if g, w := mustEncode(t, got), mustEncode(t, want); !bytes.Equal(g, w) {
				t.Fatalf("round trip\n got %s\nwant %s", g, w)
			}
		})
	}
}

func mustEncode(t *testing.T, r Record) []byte {
	t.Helper()
	b, err := Encode(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDecodeRefuses: each rule's breach is refused with an error that
// names it; a kind from a newer agent is ErrUnknownKind.
func TestDecodeRefuses(t *testing.T) {
	cases := []struct {
		name, line, err string
	}{
		{"not JSON", `{"v":1,`, "not JSON"},
		{"two values", `{"v":1,"kind":"registered","node":"n1"} {}`, "more than one"},
		{"no version", `{"kind":"registered","node":"n1"}`, "version 0"},
		{"a newer version", `{"v":2,"kind":"registered","node":"n1"}`, "same reft release"},
		{"no node", `{"v":1,"kind":"registered"}`, "not a node name"},
		{"a path for a node", `{"v":1,"kind":"registered","node":"../n1"}`, "not a node name"},
		{"negative rank", `{"v":1,"kind":"registered","node":"n1","rank":-1}`, "negative"},
		{"a registration with a failure", `{"v":1,"kind":"registered","node":"n1","failure":{"failed_node":"n2","class":"node"}}`, "carries a failure"},
		{"restored by no known event", `{"v":1,"kind":"restored","node":"n1","event":"rank_registered"}`, "none of restore_local"},
		{"negative generation", `{"v":1,"kind":"restored","node":"n1","event":"restore_local","generation":-1}`, "negative"},
		{"negative duration", `{"v":1,"kind":"restored","node":"n1","event":"restore_local","duration_ns":-5}`, "negative"},
		{"failure without one", `{"v":1,"kind":"failure","node":"n1"}`, "failed_node"},
		{"failure of no class", `{"v":1,"kind":"failure","node":"n1","failure":{"failed_node":"n2","class":"meteor"}}`, "class of node"},
		{"failure with a negative rank", `{"v":1,"kind":"failure","node":"n1","failure":{"failed_node":"n2","class":"hang","ranks":[-2]}}`, "negative"},
		{"unknown kind", `{"v":1,"kind":"gpu_lost","node":"n1"}`, "unknown record kind"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode([]byte(tc.line))
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("Decode(%s) = %v, want an error containing %q", tc.line, err, tc.err)
			}
			if errors.Is(err, ErrUnknownKind) != (tc.name == "unknown kind") {
				t.Fatalf("Decode(%s): ErrUnknownKind is %v", tc.line, errors.Is(err, ErrUnknownKind))
			}
		})
	}
	// The writer refuses what a reader would.
	if err := NewWriter(&bytes.Buffer{}, "n1", nil).Restored(Record{Event: "restore_local", Rank: -1}); err == nil {
		t.Error("the writer took a negative rank")
	}
}

// TestWriterLines: concurrent writers' lines never mix, and a nil writer
// records nothing.
func TestWriterLines(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf, "n1", nil)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for range 50 {
				if err := w.Registered(i, 100+i, "0"); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 400 {
		t.Fatalf("%d lines, want 400", len(lines))
	}
	for _, l := range lines {
		if _, err := Decode([]byte(l)); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
	}
	var nilW *Writer
	if err := nilW.Failed(Failure{FailedNode: "n2", Class: "node"}, time.Now()); err != nil {
		t.Errorf("nil writer: %v", err)
	}
}

// FuzzDecode: the records live in the shared log directory: whatever a
// line holds, Decode does not panic, and what it accepts keeps the
// rules (and encodes back to a line it accepts again).
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"v":1,"kind":"registered","node":"n1","rank":3,"pid":7,"step":"2","time":"2026-05-01T12:00:02Z"}`))
	f.Add([]byte(`{"v":1,"kind":"restored","node":"n1","event":"decode","rank":3,"generation":5,"bytes":100,"duration_ns":250000,"reason":"x"}`))
	f.Add([]byte(`{"v":1,"kind":"failure","node":"n1","failure":{"failed_node":"n2","class":"node","ranks":[1],"latency_ns":1,"quorum":true,"votes":3,"agents":4}}`))
	f.Add([]byte(`{"v":1,"kind":"x","node":"n1"}`))
	f.Add([]byte(`{"v":1,"kind":"restored","node":"n1","event":"restore_local","generation":-9223372036854775808}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		r, err := Decode(line)
		if err != nil {
			return
		}
		if r.V != Version || r.Node == "" || r.Rank < 0 || r.Generation < 0 || r.Bytes < 0 || r.Duration < 0 {
			t.Fatalf("accepted against the rules: %+v", r)
		}
		if r.Kind == KindFailure && (r.Failure == nil || r.Failure.FailedNode == "") {
			t.Fatalf("a failure without a failed node accepted: %s", line)
		}
		b, err := Encode(r)
		if err != nil {
			t.Fatalf("an accepted record does not encode: %v", err)
		}
		if _, err := Decode(bytes.TrimSuffix(b, []byte{'\n'})); err != nil {
			t.Fatalf("re-encoded %s is refused: %v", b, err)
		}
	})
}
