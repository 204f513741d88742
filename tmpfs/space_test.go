package tmpfs

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// fillUp takes every free byte of the filesystem holding dir.
func fillUp(t *testing.T, dir string) {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(filepath.Dir(dir), "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if free := int64(st.Bavail) * st.Bsize; free > 0 {
		if err := unix.Fallocate(int(f.Fd()), 0, 0, free); err != nil {
			t.Fatalf("fill the tmpfs: %v", err)
		}
	}
}

func TestSaveFailsCleanlyWhenFull(t *testing.T) {
	big := []BufferSpec{{Name: "params", Size: 5 << 20}}
	tests := []struct {
		name    string
		fsSize  string
		budget  int64 // 0: none
		failing func(t *testing.T, s *Store, k Key) error
		is      error
		reason  string
		inText  string
	}{
		{
			name: "tmpfs full at begin", fsSize: "8m", is: ErrNoSpace, reason: "no_space", inText: "free of 8 MiB",
			failing: func(t *testing.T, s *Store, k Key) error {
				_, err := s.Begin(k, Spec{Step: 2, Buffers: big}) // a second 5 MiB arena does not fit
				return err
			},
		},
		{
			name: "tmpfs full at commit", fsSize: "16m", is: ErrNoSpace, reason: "no_space", inText: "write manifest",
			failing: func(t *testing.T, s *Store, k Key) error {
				o, err := s.Begin(k, Spec{Step: 2, Buffers: big})
				if err != nil {
					t.Fatal(err)
				}
				if err := o.CopyIn(stateFor(2, big)); err != nil {
					t.Fatal(err)
				}
				fillUp(t, s.Dir()) // someone else takes the rest of the tmpfs
				_, err = o.Commit()
				return err
			},
		},
		{
			name: "budget exhausted", fsSize: "64m", budget: 8 << 20, is: ErrOverBudget, reason: "over_budget", inText: "exceeds the memory budget of 8 MiB",
			failing: func(t *testing.T, s *Store, k Key) error {
				_, err := s.Begin(k, Spec{Step: 2, Buffers: big})
				return err
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := mountTmpfs(t, tc.fsSize)
			var logBuf bytes.Buffer
			log := zerolog.New(&logBuf)
			s := openStore(t, root, func(o *Options) {
				o.Log = log
				if tc.budget > 0 {
					o.Alloc = newBudgetAlloc(t, tc.budget, log)
				}
			})
			k := Key{Shard: DefaultShard}
			save(t, s, k, 1, big)

			err := tc.failing(t, s, k)
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.inText) || !strings.Contains(err.Error(), "step 2") {
				t.Fatalf("save = %v; want %v naming step 2 and %q", err, tc.is, tc.inText)
			}
			m := s.Metrics()
			if m.SaveFailures.Load() != 1 || (tc.is == ErrNoSpace) != (m.NoSpace.Load() == 1) || (tc.is == ErrOverBudget) != (m.OverBudget.Load() == 1) {
				t.Fatalf("metrics: failures %d no-space %d over-budget %d", m.SaveFailures.Load(), m.NoSpace.Load(), m.OverBudget.Load())
			}
			if !strings.Contains(logBuf.String(), `"event":"save_failed","reason":"`+tc.reason+`"`) {
				t.Fatalf("no save_failed event with reason %s in the log:\n%s", tc.reason, logBuf.String())
			}
			// Nothing committed is lost, now or after a restart.
			for range 2 {
				got := emptyState(big)
				g, err := s.Restore(k, got)
				if err != nil || g.Step != 1 {
					t.Fatalf("restore after the failed save: step %d, %v", g.Step, err)
				}
				checkState(t, got, 1, big)
				s.Close()
				s = openStore(t, root, nil)
			}
			if gens := s.Generations(k); len(gens) != 1 {
				t.Fatalf("generations %v", steps(gens))
			}
		})
	}
}

func TestTrainingGoesOnAfterAFullStore(t *testing.T) {
	root := mountTmpfs(t, "8m")
	s := openStore(t, root, nil)
	k := Key{Shard: DefaultShard}
	big := []BufferSpec{{Name: "params", Size: 5 << 20}}
	save(t, s, k, 1, big)
	if _, err := s.Begin(k, Spec{Step: 2, Buffers: big}); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Begin = %v", err)
	}
	// The next save of a state that fits succeeds and releases step 1.
	small := []BufferSpec{{Name: "params", Size: 2 << 20}}
	save(t, s, k, 3, small)
	got := emptyState(small)
	if g, err := s.Restore(k, got); err != nil || g.Step != 3 {
		t.Fatalf("restore: %d %v", g.Step, err)
	}
	checkState(t, got, 3, small)
}
