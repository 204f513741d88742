package metrics

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/agent/logging/logtest"
	"github.com/reft-hpc/reft/agent/proto"
)

// stickyDir is a fresh directory with node_exporter's textfile
// directory's mode on a node (root's, 1777).
func stickyDir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	if err := os.Chmod(d, os.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	return d
}

func TestTextfileWrite(t *testing.T) {
	d := stickyDir(t)
	tf, err := OpenTextfile(d, "42", "n1")
	if err != nil {
		t.Fatal(err)
	}
	defer tf.Close()
	if want := filepath.Join(d, "reft_42_n1.prom"); tf.Path() != want {
		t.Fatalf("Path = %s, want %s", tf.Path(), want)
	}
	// A link planted at the final name is replaced, never followed.
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, tf.Path()); err != nil {
		t.Fatal(err)
	}
	old := unix.Umask(0o077) // a strict umask must not hide the file from node_exporter
	defer unix.Umask(old)
	for step := int64(1); step <= 2; step++ {
		st := status("42", "n1")
		st.Ranks[0].Newest = step
		if err := tf.Write(st); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(tf.Path())
		if err != nil {
			t.Fatal(err)
		}
		promtool(t, b)
		if v, ok := sample(parse(t, b), "reft_committed_step", map[string]string{"rank": "0"}); !ok || v != float64(step) {
			t.Errorf("committed step %v (found %v), want %d", v, ok, step)
		}
	}
	fi, err := os.Lstat(tf.Path())
	if err != nil {
		t.Fatal(err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 {
		t.Errorf("textfile mode %v, want a regular file 0644", fi.Mode())
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep" {
		t.Errorf("the link's target was written: %q", b)
	}
	ents, _ := os.ReadDir(d)
	if len(ents) != 1 {
		t.Errorf("directory holds %d entries, want the textfile alone (no temp file left)", len(ents))
	}
	if err := tf.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(tf.Path()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("textfile still there after Remove: %v", err)
	}
	if err := tf.Remove(); err != nil {
		t.Errorf("a second Remove: %v", err)
	}
}

// A temp name another user planted (a link) makes the write fail: it is
// created O_EXCL|O_NOFOLLOW. The name is random; the test plants one.
func TestTextfileTempNeverFollowed(t *testing.T) {
	d := stickyDir(t)
	tf, err := OpenTextfile(d, "42", "n1")
	if err != nil {
		t.Fatal(err)
	}
	defer tf.Close()
	victim := filepath.Join(t.TempDir(), "victim")
	os.WriteFile(victim, []byte("keep"), 0o600)
	tmp := "." + tf.name + ".planted"
	os.Symlink(victim, filepath.Join(d, tmp))
	if err := tf.writeAs([]byte("# nothing\n"), tmp); err == nil {
		t.Fatal("writing through a planted temp link succeeded")
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep" {
		t.Errorf("the link's target was written: %q", b)
	}
}

func TestOpenTextfileRefuses(t *testing.T) {
	tests := []struct {
		name string
		dir  func(t *testing.T) string
		want string
	}{
		{"missing", func(t *testing.T) string { return filepath.Join(t.TempDir(), "none") }, "install -d -m 1777"},
		{"a file", func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "f")
			os.WriteFile(p, nil, 0o644)
			return p
		}, "not a directory"},
		{"a link to a directory", func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "l")
			os.Symlink(stickyDir(t), p)
			return p
		}, "not a directory"}, // O_NOFOLLOW|O_DIRECTORY
		{"world-writable, not sticky", func(t *testing.T) string {
			d := t.TempDir()
			os.Chmod(d, 0o777)
			return d
		}, "writable by others without the sticky bit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tf, err := OpenTextfile(tt.dir(t), "42", "n1")
			if err == nil {
				tf.Close()
				t.Fatal("OpenTextfile succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not say %q", err, tt.want)
			}
		})
	}
}

// Run writes at once and every period, and removes the file when its
// context ends.
func TestRunWritesAndRemoves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := stickyDir(t)
		tf, err := OpenTextfile(d, "42", "n1")
		if err != nil {
			t.Fatal(err)
		}
		var calls atomic.Int64
		st := func() proto.Status {
			s := status("42", "n1")
			s.Ranks[0].Newest = calls.Add(1)
			return s
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); Run(ctx, tf, st, Every, zerolog.Nop()) }()
		synctest.Wait()
		step := func() float64 {
			b, err := os.ReadFile(tf.Path())
			if err != nil {
				t.Fatal(err)
			}
			v, _ := sample(parse(t, b), "reft_committed_step", map[string]string{"rank": "0"})
			return v
		}
		if v := step(); v != 1 {
			t.Fatalf("first write: step %v, want 1", v)
		}
		time.Sleep(Every)
		synctest.Wait()
		if v := step(); v != 2 {
			t.Fatalf("after one period: step %v, want 2", v)
		}
		cancel()
		<-done
		if _, err := os.Lstat(tf.Path()); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("textfile left after stop: %v", err)
		}
	})
}

// A directory that goes away under a running agent: the failure is
// logged once, and the agent's loop goes on.
func TestRunLogsFailureOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := filepath.Join(stickyDir(t), "prom")
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		tf, err := OpenTextfile(d, "42", "n1")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(d); err != nil {
			t.Fatal(err)
		}
		var logs logtest.Buffer
		var calls atomic.Int64
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			Run(ctx, tf, func() proto.Status { calls.Add(1); return status("42", "n1") }, Every, zerolog.New(&logs))
		}()
		time.Sleep(3*Every + time.Second)
		synctest.Wait()
		cancel()
		<-done
		if n := calls.Load(); n != 4 {
			t.Errorf("%d writes tried, want 4 (at start and every period)", n)
		}
		if n := strings.Count(logs.String(), "metrics textfile not written"); n != 1 {
			t.Errorf("failure logged %d times, want once:\n%s", n, logs.String())
		}
	})
}

// A kick writes at once, between ticks, and the next tick comes a full
// period after it: a failure verdict reaches the file before the agent
// may be stopped.
func TestRunKickedWritesAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := stickyDir(t)
		tf, err := OpenTextfile(d, "42", "n1")
		if err != nil {
			t.Fatal(err)
		}
		var calls atomic.Int64
		st := func() proto.Status {
			s := status("42", "n1")
			s.Ranks[0].Newest = calls.Add(1)
			return s
		}
		ctx, cancel := context.WithCancel(t.Context())
		kick := make(chan struct{})
		done := make(chan struct{})
		go func() { defer close(done); RunKicked(ctx, tf, st, Every, kick, zerolog.Nop()) }()
		step := func() float64 {
			t.Helper()
			synctest.Wait()
			b, err := os.ReadFile(tf.Path())
			if err != nil {
				t.Fatal(err)
			}
			v, _ := sample(parse(t, b), "reft_committed_step", map[string]string{"rank": "0"})
			return v
		}
		for _, tc := range []struct {
			after time.Duration
			kick  bool
			want  float64
		}{
			{0, false, 1},         // the first write, at once
			{Every / 5, true, 2},  // kicked between ticks
			{Every / 2, false, 2}, // no tick yet
			{Every / 2, false, 3}, // a period after the kick
			{Every - 1, false, 3}, // nothing before the next period
			{1, false, 4},         // the next period
		} {
			time.Sleep(tc.after)
			if tc.kick {
				kick <- struct{}{}
			}
			if v := step(); v != tc.want {
				t.Fatalf("after %v more (kick %v): %v writes, want %v", tc.after, tc.kick, v, tc.want)
			}
		}
		cancel()
		<-done
	})
}
