package train

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Collective is an optional interface of a Snapshotter whose Save and
// Restore are collective over the job (FileCheckpoint: every rank writes its
// part, then one marks the step complete). The trainer calls Join once,
// before Register, on the rank's training thread.
type Collective interface {
	Join(world Comm, dpIdx, stage int)
}

// FileCheckpoint is the status quo that reft is measured against (make
// bench's goodput benchmark, docs/BENCHMARKS.md): a synchronous checkpoint
// to a directory on a shared filesystem every --save-every steps, in the
// shape of PyTorch DCP's per-rank files. Each DP group's first rank writes
// the group's replicated buffers once (stage-P.replicated), every rank with
// unique buffers (ZeRO-1 shards) its own (rank-R.unique), each fsynced;
// after a barrier rank 0 writes and fsyncs COMPLETE, the step's commit, and
// removes all but the two newest complete steps. Restore loads the newest
// complete step, the same one on every rank (checked). Training blocks for
// the whole save: that is the cost the benchmark charges it.
//
// Save and Restore are collective: every rank calls them in the same order,
// on the thread that owns the communicator.
type FileCheckpoint struct {
	dir       string
	log       io.Writer
	world     Comm
	dpIdx     int
	stage     int
	bufs      []memBuf
	saved     bool
	lastBytes int64
}

// NewFileCheckpoint makes rank's checkpointer over dir, which every rank
// must see (a shared filesystem). log gets rank 0's line per save; nil:
// none.
func NewFileCheckpoint(dir string, log io.Writer) *FileCheckpoint {
	if log == nil {
		log = io.Discard
	}
	return &FileCheckpoint{dir: dir, log: log}
}

// Join implements Collective.
func (f *FileCheckpoint) Join(world Comm, dpIdx, stage int) {
	f.world, f.dpIdx, f.stage = world, dpIdx, stage
	if world.Rank() != 0 {
		f.log = io.Discard
	}
}

// Register implements Snapshotter.
func (f *FileCheckpoint) Register(name string, buf []byte, replicated bool) error {
	bufs, err := register(f.bufs, f.saved, name, buf, replicated)
	f.bufs = bufs
	return err
}

const completeMark = "COMPLETE"

func stepDir(dir string, step int64) string {
	return filepath.Join(dir, fmt.Sprintf("step-%09d", step))
}

func (f *FileCheckpoint) files(step int64) (replicated, unique string) {
	d := stepDir(f.dir, step)
	return filepath.Join(d, fmt.Sprintf("stage-%d.replicated", f.stage)), filepath.Join(d, fmt.Sprintf("rank-%d.unique", f.world.Rank()))
}

// parts returns the buffers that go to the stage's replicated file and to
// this rank's unique file, in registration order.
func (f *FileCheckpoint) parts() (replicated, unique [][]byte) {
	for _, b := range f.bufs {
		if b.replicated {
			replicated = append(replicated, b.buf)
		} else {
			unique = append(unique, b.buf)
		}
	}
	return replicated, unique
}

type doneWaiter struct{}

func (doneWaiter) Wait() error { return nil }

// Save writes step synchronously and returns once it is complete on every
// rank (a failed rank makes the others' barrier fail).
func (f *FileCheckpoint) Save(step int64) (Waiter, error) {
	if f.world == nil {
		return nil, errors.New("file checkpoint: Save before Join")
	}
	if len(f.bufs) == 0 {
		return nil, errors.New("file checkpoint: nothing registered")
	}
	f.saved = true
	t0 := time.Now()
	d := stepDir(f.dir, step)
	if err := os.MkdirAll(d, 0o755); err != nil {
		return nil, fmt.Errorf("checkpoint step %d: %w", step, err)
	}
	rep, uni := f.parts()
	repPath, uniPath := f.files(step)
	var n int64
	if f.dpIdx == 0 && len(rep) > 0 {
		w, err := writeSynced(repPath, rep)
		if err != nil {
			return nil, fmt.Errorf("checkpoint step %d: %w", step, err)
		}
		n += w
	}
	if len(uni) > 0 {
		w, err := writeSynced(uniPath, uni)
		if err != nil {
			return nil, fmt.Errorf("checkpoint step %d: %w", step, err)
		}
		n += w
	}
	total := []int64{n}
	if err := f.world.AllReduceSumI64(total); err != nil {
		return nil, fmt.Errorf("checkpoint step %d: barrier: %w", step, err)
	}
	if f.world.Rank() == 0 {
		if _, err := writeSynced(filepath.Join(d, completeMark), [][]byte{[]byte(strconv.FormatInt(step, 10) + "\n")}); err != nil {
			return nil, fmt.Errorf("checkpoint step %d: commit: %w", step, err)
		}
		if err := syncDir(d); err != nil {
			return nil, fmt.Errorf("checkpoint step %d: commit: %w", step, err)
		}
		if err := syncDir(f.dir); err != nil {
			return nil, fmt.Errorf("checkpoint step %d: commit: %w", step, err)
		}
		f.prune()
	}
	// The commit must be visible before any rank trains on, so that a
	// failure in the next steps restores this one.
	if err := f.world.Barrier(); err != nil {
		return nil, fmt.Errorf("checkpoint step %d: barrier after the commit: %w", step, err)
	}
	f.lastBytes = total[0]
	fmt.Fprintf(f.log, "checkpoint step %d: %d bytes to %s, blocked %.1f ms\n", step, total[0], d, float64(time.Since(t0).Microseconds())/1e3)
	return doneWaiter{}, nil
}

// prune removes every step directory older than the two newest complete
// ones (rank 0, after a commit; failures to remove are not errors: the
// next save tries again).
func (f *FileCheckpoint) prune() {
	steps, complete := f.list()
	var keep []int64
	for _, s := range slices.Backward(steps) {
		if complete[s] && len(keep) < 2 {
			keep = append(keep, s)
		}
	}
	if len(keep) < 2 {
		return
	}
	for _, s := range steps {
		if s < keep[1] {
			os.RemoveAll(stepDir(f.dir, s))
		}
	}
}

// list returns the step directories, ascending, and which are complete.
func (f *FileCheckpoint) list() ([]int64, map[int64]bool) {
	ents, _ := os.ReadDir(f.dir) // a missing directory holds no checkpoint
	var steps []int64
	complete := map[int64]bool{}
	for _, e := range ents {
		s, ok := strings.CutPrefix(e.Name(), "step-")
		if !ok || !e.IsDir() {
			continue
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 1 || e.Name() != filepath.Base(stepDir(f.dir, n)) {
			continue // only the one form Save writes
		}
		steps = append(steps, n)
		if _, err := os.Stat(filepath.Join(f.dir, e.Name(), completeMark)); err == nil {
			complete[n] = true
		}
	}
	slices.Sort(steps)
	return steps, complete
}

// Restore loads the newest complete step. Every rank must find the same
// one; a rank that sees another (a directory not shared by all nodes) fails
// the restore on every rank.
func (f *FileCheckpoint) Restore() (int64, bool, error) {
	if f.world == nil {
		return 0, false, errors.New("file checkpoint: Restore before Join")
	}
	steps, complete := f.list()
	var step int64
	for _, s := range slices.Backward(steps) {
		if complete[s] {
			step = s
			break
		}
	}
	agree := []int64{step, step * step}
	if err := f.world.AllReduceSumI64(agree); err != nil {
		return 0, false, fmt.Errorf("checkpoint agreement: %w", err)
	}
	// All equal iff n*sum(x^2) == sum(x)^2.
	if n := int64(f.world.Size()); agree[0]*agree[0] != n*agree[1] {
		return 0, false, fmt.Errorf("ranks see different newest complete checkpoints in %s (this rank: step %d): the directory must be one shared by every node", f.dir, step)
	}
	if step == 0 {
		return 0, false, nil
	}
	rep, uni := f.parts()
	repPath, uniPath := f.files(step)
	if err := readExact(repPath, rep); err != nil {
		return 0, false, fmt.Errorf("restore step %d: %w", step, err)
	}
	if err := readExact(uniPath, uni); err != nil {
		return 0, false, fmt.Errorf("restore step %d: %w", step, err)
	}
	return step, true, nil
}

// Close implements Snapshotter; saves are synchronous, nothing is pending.
func (f *FileCheckpoint) Close() error { return nil }

func writeSynced(path string, parts [][]byte) (int64, error) {
	fd, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, p := range parts {
		w, err := fd.Write(p)
		n += int64(w)
		if err != nil {
			fd.Close()
			return n, err
		}
	}
	if err := fd.Sync(); err != nil {
		fd.Close()
		return n, fmt.Errorf("fsync %s: %w", path, err)
	}
	return n, fd.Close()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}

// readExact fills parts, in order, from path, which must hold exactly
// their bytes: the files carry no header, the registration order under
// the same flags is the layout (and trainer.state's fingerprint checks
// the flags after the restore).
func readExact(path string, parts [][]byte) error {
	if len(parts) == 0 {
		return nil
	}
	var want int64
	for _, p := range parts {
		want += int64(len(p))
	}
	fd, err := os.Open(path)
	if err != nil {
		return err
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return err
	}
	if st.Size() != want {
		return fmt.Errorf("%s holds %d bytes, this layout needs %d: it was written with other model or layout flags; rerun with those, or point --ckpt-dir elsewhere", path, st.Size(), want)
	}
	for _, p := range parts {
		if _, err := io.ReadFull(fd, p); err != nil {
			return fmt.Errorf("read %s: %w", path, err)
		}
	}
	return nil
}
