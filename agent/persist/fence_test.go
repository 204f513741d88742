package persist

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/reft-hpc/reft/tmpfs"
)

// writer is one node's persistent writer: its node-local store and its
// handle on the shared directory, for one epoch.
type writer struct {
	local *tmpfs.Store
	disk  *Store
}

func newWriter(t *testing.T, dir, node string, e Epoch) writer {
	t.Helper()
	disk, err := OpenStore(dir, testJob, node, os.Getuid(), e)
	if err != nil {
		t.Fatal(err)
	}
	return writer{local: localStore(t, t.TempDir()), disk: disk}
}

// write commits rank's step locally (with flip, one byte changed: another
// timeline's bytes) and writes it to the shared directory.
func (w writer) write(t *testing.T, rank int, step, abandonedAbove int64, flip bool) (Written, error) {
	t.Helper()
	o, err := w.local.Begin(tmpfs.Key{Rank: rank, Shard: tmpfs.DefaultShard}, tmpfs.Spec{Step: step, Layout: "dp=4", Buffers: testBuffers})
	if err != nil {
		t.Fatal(err)
	}
	st := stateFor(rank, step)
	if flip {
		st["params"][0] ^= 0xff
	}
	if err := o.CopyIn(st); err != nil {
		t.Fatal(err)
	}
	g, err := o.Commit()
	if err != nil {
		t.Fatal(err)
	}
	r, err := w.local.Open(g)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	return w.disk.Write(t.Context(), r, abandonedAbove)
}

func (w writer) mustWrite(t *testing.T, rank int, step, abandonedAbove int64) {
	t.Helper()
	if _, err := w.write(t, rank, step, abandonedAbove, false); err != nil {
		t.Fatal(err)
	}
}

// TestStaleWriterFenced: two writers of rank 1, n2 for the job's first
// launch (Slurm step 0: since declared lost, partitioned, or with a write
// queued) and n5 for reft run's relaunch that replaced it (step 2). Whatever
// the stale n2 writes, and whenever, n5's newer checkpoints stay, bytes
// intact: the stale write is refused with a FencedError naming both
// epochs, and nothing of n5's is removed or replaced. The newer epoch, in
// turn, does prune what the older one left above its restored step.
func TestStaleWriterFenced(t *testing.T) {
	const rank = 1
	stale, newer := Epoch{Restart: 0, Step: 0}, Epoch{Restart: 0, Step: 2}
	for _, tc := range []struct {
		name string
		// run does the writes; it returns the stale writer's error.
		run       func(t *testing.T, old, cur writer) error
		wantSteps []int64 // the rank's committed steps after
		wantBy    []Epoch // and whose they are
	}{
		{"an older step: prune would remove the newer steps", func(t *testing.T, old, cur writer) error {
			cur.mustWrite(t, rank, 110, -1)
			cur.mustWrite(t, rank, 120, -1)
			_, err := old.write(t, rank, 100, -1, false)
			return err
		}, []int64{120, 110}, []Epoch{newer, newer}},
		{"the same step, other bytes: replace would move the newer one aside", func(t *testing.T, old, cur writer) error {
			cur.mustWrite(t, rank, 110, -1)
			_, err := old.write(t, rank, 110, -1, true)
			return err
		}, []int64{110}, []Epoch{newer}},
		{"a step the newer run abandoned", func(t *testing.T, old, cur writer) error {
			cur.mustWrite(t, rank, 90, 90)
			_, err := old.write(t, rank, 100, -1, false)
			return err
		}, []int64{90}, []Epoch{newer}},
		{"the newer run commits while the stale copy is being filled", func(t *testing.T, old, cur writer) error {
			old.disk.hook = func(point string) {
				if point == "write:synced" {
					cur.mustWrite(t, rank, 110, -1)
				}
			}
			_, err := old.write(t, rank, 105, -1, false)
			return err
		}, []int64{110}, []Epoch{newer}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			old, cur := newWriter(t, dir, "n2", stale), newWriter(t, dir, "n5", newer)
			err := tc.run(t, old, cur)
			var fe *FencedError
			if !errors.As(err, &fe) {
				t.Errorf("the stale write returned %v, want a FencedError", err)
			} else if fe.Mine != stale || fe.Newest != newer || fe.By != "n5" || !strings.Contains(err.Error(), "stale") {
				t.Errorf("FencedError %+v (%v): want epochs %v and %v, by n5, and the cause", fe, err, stale, newer)
			}
			gens, err := cur.disk.List(rank)
			if err != nil {
				t.Fatal(err)
			}
			if got := steps(gens); !slices.Equal(got, tc.wantSteps) {
				t.Fatalf("steps after the stale write %v, want %v", got, tc.wantSteps)
			}
			for i, g := range gens {
				if g.Epoch != tc.wantBy[i] || g.Node != "n5" {
					t.Errorf("step %d written by %s for %v, want n5 for %v", g.Step, g.Node, g.Epoch, tc.wantBy[i])
				}
				got, err := loadState(cur.disk, g)
				if err != nil {
					t.Fatalf("load step %d: %v", g.Step, err)
				}
				checkState(t, got, rank, g.Step)
			}
			ents, _ := os.ReadDir(filepath.Join(dir, testJob, "r1"))
			for _, e := range ents {
				if strings.HasPrefix(e.Name(), ".") {
					t.Errorf("the stale write left %s", e.Name())
				}
			}
		})
	}
}

// TestNewerEpochPrunesOlder: the fence is one way. The relaunch restored
// step 100 of the first run's 100 and 110; its first write (step 100,
// the same bytes) keeps 100 and removes 110, the abandoned timeline.
func TestNewerEpochPrunesOlder(t *testing.T) {
	dir := t.TempDir()
	old, cur := newWriter(t, dir, "n2", Epoch{}), newWriter(t, dir, "n5", Epoch{Step: 2})
	old.mustWrite(t, 1, 100, -1)
	old.mustWrite(t, 1, 110, -1)
	w, err := cur.write(t, 1, 100, 100, false)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(w.Removed, []int64{110}) {
		t.Errorf("removed %v, want [110]", w.Removed)
	}
}

// TestOtherNodesTempKept: a writer removes its own node's leftover
// temporary directories and other nodes' expired ones, never another
// node's fresh one (a write in progress, perhaps a newer epoch's).
func TestOtherNodesTempKept(t *testing.T) {
	dir := t.TempDir()
	w := newWriter(t, dir, "n1", Epoch{})
	w.mustWrite(t, 1, 10, -1)
	rdir := filepath.Join(dir, testJob, "r1")
	mk := func(name string, age time.Duration) string {
		p := filepath.Join(rdir, name)
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		at := time.Now().Add(-age)
		if err := os.Chtimes(p, at, at); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name string
		age  time.Duration
		kept bool
	}{
		{".tmp-g20-n5-77", time.Minute, true},
		{".trash-g20-n5-77", time.Minute, true},
		{".tmp-g20-n5-78", 2 * staleAfter, false},
		{".tmp-g20-n1-99", time.Minute, false},
	} {
		p := mk(tc.name, tc.age)
		defer func() {
			if _, err := os.Stat(p); (err == nil) != tc.kept {
				t.Errorf("%s (age %v): kept %v, want %v", tc.name, tc.age, err == nil, tc.kept)
			}
		}()
	}
	w.mustWrite(t, 1, 20, -1)
}
