package persist

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// The crash test runs the writer in a child process, the test binary
// itself re-executed, and SIGKILLs it at a named point of the write: a real
// kill, with no deferred cleanup.

func TestMain(m *testing.M) {
	if os.Getenv("REFT_PERSIST_HELPER") == "write" {
		os.Exit(helperWrite())
	}
	os.Exit(m.Run())
}

// helperWrite commits REFT_STEP of rank 0 to a local store under
// REFT_SHM and persists it to REFT_DIR, killing itself at REFT_CRASH_AT.
func helperWrite() int {
	step, _ := strconv.ParseInt(os.Getenv("REFT_STEP"), 10, 64)
	crashAt := os.Getenv("REFT_CRASH_AT")
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	st, err := openLocal(os.Getenv("REFT_SHM"))
	if err != nil {
		return fail(err)
	}
	disk, err := OpenStore(os.Getenv("REFT_DIR"), testJob, "n1", os.Getuid(), Epoch{})
	if err != nil {
		return fail(err)
	}
	disk.hook = func(p string) {
		if p == crashAt {
			unix.Kill(unix.Getpid(), unix.SIGKILL)
			select {}
		}
	}
	g, err := newGen(st, 0, step)
	if err != nil {
		return fail(err)
	}
	r, err := st.Open(g)
	if err != nil {
		return fail(err)
	}
	if _, err := disk.Write(context.Background(), r, -1); err != nil {
		return fail(err)
	}
	return 0
}

func runHelper(t *testing.T, shm, dir string, step int64, crashAt string) (killed bool) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "REFT_PERSIST_HELPER=write", "REFT_SHM="+shm, "REFT_DIR="+dir,
		"REFT_STEP="+strconv.FormatInt(step, 10), "REFT_CRASH_AT="+crashAt)
	out, err := cmd.CombinedOutput()
	if err == nil {
		return false
	}
	if st, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && st.Signaled() && st.Signal() == syscall.SIGKILL {
		return true
	}
	t.Fatalf("helper: %v\n%s", err, out)
	return false
}

func TestCrashMidWrite(t *testing.T) {
	tests := []struct {
		crashAt   string
		committed bool // step 2 is a committed generation after the kill
	}{
		{"write:half", false},   // data file half written
		{"write:synced", false}, // every file written and fsynced, not renamed
		{"write:renamed", true}, // renamed into place, older ones not yet pruned
	}
	for _, tc := range tests {
		t.Run(tc.crashAt, func(t *testing.T) {
			dir := t.TempDir()
			if runHelper(t, filepath.Join(t.TempDir(), "shm"), dir, 1, "") {
				t.Fatal("the first write was killed")
			}
			if !runHelper(t, filepath.Join(t.TempDir(), "shm"), dir, 2, tc.crashAt) {
				t.Fatalf("the helper finished before %s", tc.crashAt)
			}
			disk := openDisk(t, dir)
			gens, err := disk.List(0)
			if err != nil {
				t.Fatal(err)
			}
			want := []int64{1}
			if tc.committed {
				want = []int64{2, 1}
			}
			if !slices.Equal(steps(gens), want) {
				t.Fatalf("after a kill at %s: committed %v, want %v", tc.crashAt, steps(gens), want)
			}
			// No g<step> directory without COMMITTED, whatever the point.
			rdir := filepath.Dir(genDir(dir, 0, 0))
			ents, _ := os.ReadDir(rdir)
			var leftovers []string
			for _, e := range ents {
				if _, ok := parseGenName(e.Name()); ok {
					if _, err := os.Stat(filepath.Join(rdir, e.Name(), markerFile)); err != nil {
						t.Fatalf("%s has no commit marker after a kill at %s", e.Name(), tc.crashAt)
					}
				} else {
					leftovers = append(leftovers, e.Name())
				}
			}
			if tc.committed != (len(leftovers) == 0) {
				t.Fatalf("after a kill at %s the rank directory has %v besides its generations", tc.crashAt, leftovers)
			}
			for _, g := range gens {
				got, err := loadState(disk, g)
				if err != nil {
					t.Fatal(err)
				}
				checkState(t, got, 0, g.Step)
			}
			// The next writer cleans up and keeps two.
			persistGen(t, localStore(t, filepath.Join(t.TempDir(), "shm")), disk, 0, 3, -1)
			ents, _ = os.ReadDir(rdir)
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			wantNames := []string{"g1", "g3"}
			if tc.committed {
				wantNames = []string{"g2", "g3"}
			}
			if !slices.Equal(names, wantNames) {
				t.Fatalf("after the next write the rank directory holds %v, want %v", names, wantNames)
			}
		})
	}
}
