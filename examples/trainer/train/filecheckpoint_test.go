package train

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// stepDirs lists dir's step directories and which hold COMPLETE.
func stepDirs(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		name := e.Name()
		if _, err := os.Stat(filepath.Join(dir, name, completeMark)); err == nil {
			name += "+"
		}
		out = append(out, name)
	}
	return out
}

// TestFileCheckpointCrashResume: a rank dies at step 14 with checkpoints
// every 4 steps; the relaunch resumes from step 12 (the newest complete
// one, an incomplete later step ignored) and ends with the uninterrupted
// run's bits. Only the two newest complete steps are kept; replicated
// buffers are written once per DP group, unique ones by every rank.
func TestFileCheckpointCrashResume(t *testing.T) {
	for _, lay := range []struct {
		dp, pp int
		zero1  bool
		files  []string // in step 12's directory
	}{
		{2, 1, false, []string{"COMPLETE", "stage-0.replicated"}},
		{2, 1, true, []string{"COMPLETE", "rank-0.unique", "rank-1.unique", "stage-0.replicated"}},
		{2, 2, false, []string{"COMPLETE", "stage-0.replicated", "stage-1.replicated"}},
	} {
		t.Run(fmt.Sprintf("dp%d-pp%d-zero1=%v", lay.dp, lay.pp, lay.zero1), func(t *testing.T) {
			c := small()
			c.Optimizer, c.DP, c.PP, c.Zero1, c.LogEvery, c.Steps = AdamW, lay.dp, lay.pp, lay.zero1, 1, 18
			n := lay.dp * lay.pp
			want := runOK(t, c, n, nil)

			dir := t.TempDir()
			c.SaveEvery, c.FailStep, c.FailRank = 4, 14, n-1
			_, errs := RunLocal(c, n, func(r int) Options { return Options{Snap: NewFileCheckpoint(dir, nil)} })
			if !errors.Is(errs[n-1], ErrKilled) {
				t.Fatalf("rank %d: %v, want ErrKilled", n-1, errs[n-1])
			}
			// A save of step 16 that a rank did not finish: no COMPLETE.
			if err := os.MkdirAll(filepath.Join(dir, "step-000000016"), 0o755); err != nil {
				t.Fatal(err)
			}
			if got := stepDirs(t, dir); !slices.Equal(got, []string{"step-000000008+", "step-000000012+", "step-000000016"}) {
				t.Fatalf("checkpoint directory holds %v, want steps 8 and 12 complete (4 pruned) and 16 not", got)
			}
			ents, _ := os.ReadDir(filepath.Join(dir, "step-000000012"))
			var files []string
			for _, e := range ents {
				files = append(files, e.Name())
			}
			if !slices.Equal(files, lay.files) {
				t.Errorf("step 12 holds %v, want %v", files, lay.files)
			}
			var log strings.Builder
			got := runOK(t, c, n, func(r int) Options {
				return Options{Snap: NewFileCheckpoint(dir, &log), Log: &log}
			})
			if got.ResumedFrom != 12 {
				t.Errorf("resumed from %d, want 12", got.ResumedFrom)
			}
			if got.Hash != want.Hash {
				t.Errorf("resumed hash %s, uninterrupted %s", got.Hash, want.Hash)
			}
			if !strings.Contains(log.String(), "checkpoint step 16: ") || got.SaveBlockedMs <= 0 {
				t.Errorf("rank 0 did not log the save of step 16 or its blocked time (%v ms):\n%s", got.SaveBlockedMs, log.String())
			}
		})
	}
}

// TestFileCheckpointErrors: a checkpoint of another layout, and ranks that
// see different checkpoints, fail the restore with the cause.
func TestFileCheckpointErrors(t *testing.T) {
	c := small()
	c.SaveEvery, c.Steps, c.DP = 2, 2, 2
	dir := t.TempDir()
	runOK(t, c, 2, func(int) Options { return Options{Snap: NewFileCheckpoint(dir, nil)} })

	other := c
	other.Zero1 = true // rank files appear, the replicated one shrinks
	_, errs := RunLocal(other, 2, func(int) Options { return Options{Snap: NewFileCheckpoint(dir, nil)} })
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "written with other model or layout flags") {
		t.Errorf("restore under --zero1 of a checkpoint without: %v", errs[0])
	}

	// Rank 1 looks at an empty directory: not one shared by both ranks.
	empty := t.TempDir()
	_, errs = RunLocal(c, 2, func(r int) Options {
		if r == 1 {
			return Options{Snap: NewFileCheckpoint(empty, nil)}
		}
		return Options{Snap: NewFileCheckpoint(dir, nil)}
	})
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "must be one shared by every node") {
		t.Errorf("ranks seeing different checkpoints: %v", errs[0])
	}
}
