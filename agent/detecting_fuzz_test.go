package agent

import (
	"testing"

	"github.com/reft-hpc/reft/agent/detect"
)

// FuzzParseProcState: a /proc/PID/stat line (another process of the
// user's, or a pid reused) parses to one of the known states or none.
func FuzzParseProcState(f *testing.F) {
	f.Add([]byte("1234 (python3) S 1 1234"))
	f.Add([]byte("1 ((a) T) T"))
	f.Fuzz(func(t *testing.T, b []byte) {
		switch s := parseProcState(b); s {
		case "", detect.ProcRunning, detect.ProcSleeping, detect.ProcDiskSleep, detect.ProcStopped, detect.ProcZombie:
		default:
			t.Fatalf("parseProcState(%q) = %q", b, s)
		}
	})
}
