package train

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// FuzzFileCheckpointRestore: a checkpoint directory holds whatever the job
// (or anyone who can write it) left there. Restore of one rank with one
// 16-byte replicated buffer, from a directory with one entry named name
// holding COMPLETE and stage-0.replicated = data, either fails or restores
// exactly: only from a directory named as Save names it (step-%09d, step
// >= 1), only when the file holds exactly the buffer's bytes, and then the
// buffer holds them.
func FuzzFileCheckpointRestore(f *testing.F) {
	f.Add("step-000000007", bytes.Repeat([]byte{7}, 16))
	f.Add("step-000000007", []byte("short"))
	f.Add("step-7", bytes.Repeat([]byte{1}, 16))
	f.Add("step-+00000007", bytes.Repeat([]byte{1}, 16))
	f.Add("step-000000000", bytes.Repeat([]byte{1}, 16))
	f.Add("step--00000001", bytes.Repeat([]byte{1}, 16))
	f.Fuzz(func(t *testing.T, name string, data []byte) {
		dir := t.TempDir()
		if name == "" || name == "." || name == ".." || filepath.Base(name) != name {
			return
		}
		d := filepath.Join(dir, name)
		if err := os.Mkdir(d, 0o755); err != nil {
			return // not a name this filesystem takes
		}
		for file, b := range map[string][]byte{completeMark: []byte("x\n"), "stage-0.replicated": data} {
			if err := os.WriteFile(filepath.Join(d, file), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		c := NewFileCheckpoint(dir, nil)
		c.Join(NewLocalWorld(1).Comm(0), 0, 0)
		buf := make([]byte, 16)
		if err := c.Register("b", buf, true); err != nil {
			t.Fatal(err)
		}
		step, ok, err := c.Restore()
		n, perr := strconv.ParseInt(name[min(len(name), len("step-")):], 10, 64)
		canonical := perr == nil && n >= 1 && name == filepath.Base(stepDir(dir, n))
		switch {
		case !canonical && (ok || err != nil):
			t.Fatalf("directory %q is not one Save writes, yet Restore = %d, %v, %v", name, step, ok, err)
		case canonical && len(data) != len(buf) && err == nil:
			t.Fatalf("restored step %d from a %d-byte file into a %d-byte buffer", step, len(data), len(buf))
		case canonical && len(data) == len(buf) && (err != nil || !ok || step != n || !bytes.Equal(buf, data)):
			t.Fatalf("%q with a whole file: Restore = %d, %v, %v; buffer %x, file %x", name, step, ok, err, buf, data)
		}
	})
}
