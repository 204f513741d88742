package metrics

import (
	"encoding/json"
	"testing"

	"github.com/reft-hpc/reft/agent/proto"
)

// FuzzParseCarry: ParseCarry never panics, and what it accepts a Recorder
// can carry and report.
func FuzzParseCarry(f *testing.F) {
	r := NewRecorder()
	r.Failure("node", 0.4)
	r.Restore("local", 0.1)
	for _, m := range []*proto.Metrics{r.Status(), NewRecorder().Status(), {}} {
		b, _ := json.Marshal(carryFile{Version: carryVersion, Job: "7", Node: "n1", Metrics: m})
		f.Add(b)
	}
	f.Add([]byte(`{"version":1,"job":"7","node":"n1","metrics":{"detection_seconds":{"count":1,"sum":1}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseCarry(b, "7", "n1")
		if err != nil {
			return
		}
		rec := NewRecorder()
		if err := rec.Carry(m); err != nil {
			t.Fatalf("ParseCarry accepted what Carry refuses: %v", err)
		}
		rec.Failure("agent", 1)
		rec.Status()
	})
}
