package proto

import (
	"encoding/json"
	"testing"
	"unicode"
	"unicode/utf8"
)

// FuzzCommNotice: a comm notice's payload, as the agent reads it (JSON,
// then CheckCommOp), never panics, and an accepted op is short, valid
// UTF-8 and free of anything that could forge a log line.
func FuzzCommNotice(f *testing.F) {
	for _, s := range []string{`{"active":true}`, `{"active":true,"op":"gradient all-reduce"}`, `{"active":false,"op":""}`,
		`{"active":true,"op":"a\nb"}`, `{"active":true,"op":"\u2028"}`, `{"op":"\ud800"}`, `{"active":1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		var cm Comm
		if err := json.Unmarshal(payload, &cm); err != nil {
			return
		}
		if err := CheckCommOp(cm.Op); err != nil {
			return
		}
		if len(cm.Op) > MaxCommOp || !utf8.ValidString(cm.Op) {
			t.Fatalf("accepted op %q: %d bytes, valid UTF-8 %v", cm.Op, len(cm.Op), utf8.ValidString(cm.Op))
		}
		for _, r := range cm.Op {
			if unicode.IsControl(r) || r == '\u2028' || r == '\u2029' {
				t.Fatalf("accepted op %q with %U", cm.Op, r)
			}
		}
	})
}
