package peer

import (
	"bytes"
	"strings"
	"testing"
)

// FuzzParseUnmunge: unmunge's output carries a stranger's payload
// verbatim; the split never panics, the payload is exactly what follows
// the first blank line, and metadata keys and values are trimmed single
// lines.
func FuzzParseUnmunge(f *testing.F) {
	f.Add([]byte("STATUS:          Success (0)\nUID:             1001\nGID:             1001\nLENGTH:          5\n\nhello"))
	f.Add([]byte("STATUS: 0\nUID: 0\nLENGTH: 3\n\n\n\nabc\n\nUID: 1"))
	f.Add([]byte("no separator"))
	f.Add([]byte("\n\n"))
	f.Add([]byte("UID: 1:2\r\nLENGTH\n\n"))
	f.Fuzz(func(t *testing.T, out []byte) {
		meta, payload, err := parseUnmunge(out)
		if err != nil {
			if bytes.Contains(out, []byte("\n\n")) {
				t.Fatalf("refused output with a separator: %v", err)
			}
			return
		}
		_, want, _ := bytes.Cut(out, []byte("\n\n"))
		if !bytes.Equal(payload, want) {
			t.Fatalf("payload %q, want %q", payload, want)
		}
		for k, v := range meta {
			if strings.ContainsAny(k+v, "\n") || k != strings.TrimSpace(k) || v != strings.TrimSpace(v) {
				t.Fatalf("metadata %q: %q", k, v)
			}
		}
	})
}
