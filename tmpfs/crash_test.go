package tmpfs

import (
	"bufio"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/hostmem"
)

// The crash tests run the writer (agent or rank) in a child process, the
// test binary itself re-executed, and SIGKILL it: a real kill, with no
// deferred cleanup and no chance to finish a write.

func TestMain(m *testing.M) {
	if mode := os.Getenv("REFT_TEST_HELPER"); mode != "" {
		os.Exit(helperMain(mode))
	}
	os.Exit(m.Run())
}

func killSelf() {
	unix.Kill(unix.Getpid(), unix.SIGKILL)
	select {}
}

func helperMain(mode string) int {
	env := func(k string) string { return os.Getenv("REFT_TEST_" + k) }
	atoi := func(k string) int64 { n, _ := strconv.ParseInt(env(k), 10, 64); return n }
	switch mode {
	case "agent":
		// An agent saving steps of rank 0 until done or killed.
		crashAt, crashStep := env("CRASH_AT"), atoi("CRASH_STEP")
		var step int64
		s, err := Open(Options{Root: env("ROOT"), JobID: "4242", ChunkSize: testChunk, Keep: int(atoi("KEEP")),
			Log: zerolog.New(os.Stderr), hook: func(p string) {
				if p == crashAt && step == crashStep {
					killSelf()
				}
			}})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		k := Key{Shard: DefaultShard}
		if g, ok := s.Latest(k); ok {
			step = g.Step
		}
		for n := atoi("STEPS"); n == 0 || step < n; {
			step++
			o, err := s.Begin(k, Spec{Step: step, Buffers: testBuffers})
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			if crashAt == "write:half" && step == crashStep {
				p, _ := o.Buffer("params")
				pattern(p[:len(p)/2], step, "params")
				killSelf()
			}
			if err := o.CopyIn(stateFor(step, testBuffers)); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			if _, err := o.Commit(); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			fmt.Printf("committed %d\n", step)
		}
		return 0
	case "rank":
		// A rank copying into the arena the agent gave it, over and over,
		// until killed in mid-write.
		a, err := hostmem.MapShared(env("ARENA"), hostmem.MapOptions{})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		src := make([]byte, a.Size())
		pattern(src, atoi("STEP"), "params")
		mem := a.Bytes()
		said := false
		for {
			for off := 0; off < len(mem); off += 4096 {
				copy(mem[off:], src[off:off+4096])
				if !said && off >= len(mem)/2 {
					fmt.Println("half")
					said = true
				}
			}
		}
	}
	fmt.Fprintf(os.Stderr, "unknown helper mode %q\n", mode)
	return 2
}

// child runs a helper; lines gets its stdout lines.
type child struct {
	cmd   *exec.Cmd
	lines chan string
	errb  *strings.Builder
}

func startHelper(t *testing.T, mode string, env map[string]string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "REFT_TEST_HELPER="+mode)
	for k, v := range env {
		cmd.Env = append(cmd.Env, "REFT_TEST_"+k+"="+v)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, lines: make(chan string, 1024), errb: new(strings.Builder)}
	cmd.Stderr = c.errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return c
}

// next is the child's next line; it fails the test if none comes soon.
func (c *child) next(t *testing.T) string {
	t.Helper()
	select {
	case l, ok := <-c.lines:
		if !ok {
			t.Fatalf("helper exited early: %s", c.errb)
		}
		return l
	case <-time.After(time.Minute):
		t.Fatalf("helper said nothing for a minute: %s", c.errb)
	}
	return ""
}

// wait reaps the child and returns the last "committed N" it printed; the
// child must have died of SIGKILL.
func (c *child) waitKilled(t *testing.T) int64 {
	t.Helper()
	var last int64
	for l := range c.lines {
		if n, ok := strings.CutPrefix(l, "committed "); ok {
			last, _ = strconv.ParseInt(n, 10, 64)
		}
	}
	err := c.cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !ee.Sys().(syscall.WaitStatus).Signaled() || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("helper did not die of SIGKILL: %v\n%s", err, c.errb)
	}
	return last
}

func TestRankKilledMidWrite(t *testing.T) {
	root := filepath.Join(t.TempDir(), "reft")
	s := openStore(t, root, nil)
	k := Key{Shard: DefaultShard}
	save(t, s, k, 1, testBuffers)
	o, err := s.Begin(k, Spec{Step: 2, Buffers: testBuffers})
	if err != nil {
		t.Fatal(err)
	}
	c := startHelper(t, "rank", map[string]string{"ARENA": o.ArenaPath(), "STEP": "2"})
	if l := c.next(t); l != "half" {
		t.Fatalf("rank said %q\n%s", l, c.errb)
	}
	c.cmd.Process.Signal(syscall.SIGKILL)
	c.waitKilled(t)

	// The agent sees the rank's socket close and discards the generation.
	o.Abort()
	got := emptyState(testBuffers)
	g, err := s.Restore(k, got)
	if err != nil || g.Step != 1 {
		t.Fatalf("restore after the rank died: step %d, %v", g.Step, err)
	}
	checkState(t, got, 1, testBuffers)
	if gens := s.Generations(k); len(gens) != 1 {
		t.Fatalf("generations %v", steps(gens))
	}
	// And a restarted agent sees the same from disk.
	s.Close()
	s2 := openStore(t, root, nil)
	if gens := steps(s2.Generations(k)); !slices.Equal(gens, []int64{1}) {
		t.Fatalf("after re-index: %v", gens)
	}
}

func TestAgentKilledAtEachPoint(t *testing.T) {
	tests := []struct {
		point string
		want  int64 // newest completed step after the kill during step 3
	}{
		{"begin:dir", 2},
		{"begin:arena", 2},
		{"write:half", 2},
		{"write:done", 2},
		{"commit:bytes", 2},
		{"commit:manifest", 2}, // manifest in place, marker missing: not completed
		{"commit:marker", 3},   // committed; step 2 not yet released
		{"release:unmarked", 3},
		{"commit:released", 3},
	}
	for _, tc := range tests {
		t.Run(tc.point, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "reft")
			c := startHelper(t, "agent", map[string]string{"ROOT": root, "CRASH_AT": tc.point, "CRASH_STEP": "3", "STEPS": "5"})
			last := c.waitKilled(t)
			if last != 2 {
				t.Fatalf("agent committed up to %d before the kill, want 2", last)
			}
			s := openStore(t, root, nil)
			k := Key{Shard: DefaultShard}
			got := emptyState(testBuffers)
			g, err := s.Restore(k, got)
			if err != nil || g.Step != tc.want {
				t.Fatalf("new agent restores step %d (%v), want %d", g.Step, err, tc.want)
			}
			checkState(t, got, tc.want, testBuffers)
			// Re-indexing left exactly the retained generation and its arena.
			ents, _ := os.ReadDir(filepath.Join(s.Dir(), k.rel()))
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			if len(names) != 2 {
				t.Fatalf("left on disk: %v, want one generation and its arena", names)
			}
			// And it goes on saving.
			save(t, s, k, 4, testBuffers)
		})
	}
}

func TestAgentKilledAtRandomTimes(t *testing.T) {
	root := filepath.Join(t.TempDir(), "reft")
	k := Key{Shard: DefaultShard}
	var committed int64
	for round := range 8 {
		c := startHelper(t, "agent", map[string]string{"ROOT": root, "KEEP": "1"})
		// Let it commit at least once, then kill it after a random delay.
		for !strings.HasPrefix(c.next(t), "committed ") {
		}
		time.Sleep(time.Duration(rand.IntN(20_000)) * time.Microsecond)
		c.cmd.Process.Signal(syscall.SIGKILL)
		if last := c.waitKilled(t); last > committed {
			committed = last
		}
		s, err := Open(Options{Root: root, JobID: "4242", ChunkSize: testChunk, Keep: 1})
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		got := emptyState(testBuffers)
		g, err := s.Restore(k, got)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		// A commit that returned is never lost; a newer one may have
		// landed after the last line the agent got out.
		if g.Step < committed {
			t.Fatalf("round %d: restored step %d, but step %d had committed", round, g.Step, committed)
		}
		checkState(t, got, g.Step, testBuffers)
		committed = g.Step
		s.Close()
	}
}

func TestCorruptChunkDetected(t *testing.T) {
	root := filepath.Join(t.TempDir(), "reft")
	s := openStore(t, root, func(o *Options) { o.Keep = 1 })
	k := Key{Shard: DefaultShard}
	save(t, s, k, 1, testBuffers)
	g2 := save(t, s, k, 2, testBuffers)

	// Flip one byte in chunk 2 of "params" on the store's file.
	b := g2.Manifest.Buffers[0]
	off := b.Offset + 2*testChunk + 17
	f, err := os.OpenFile(g2.ArenaPath, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	one := make([]byte, 1)
	f.ReadAt(one, off)
	one[0] ^= 0x40
	f.WriteAt(one, off)
	f.Close()

	got := emptyState(testBuffers)
	_, err = s.Restore(k, got)
	var ce *ChecksumError
	if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("restore of a corrupt generation = %v, want a *ChecksumError", err)
	}
	if len(ce.Chunks) != 1 || ce.Chunks[0].Buffer != "params" || ce.Chunks[0].Index != 2 || ce.Step != 2 ||
		ce.Chunks[0].Offset != 2*testChunk || ce.Chunks[0].Length != testChunk {
		t.Fatalf("reported %+v, want params chunk 2 of step 2", ce)
	}
	// Every other chunk landed; the caller fetches chunk 2 elsewhere.
	want := stateFor(2, testBuffers)
	if !slices.Equal(got["params"][:2*testChunk], want["params"][:2*testChunk]) || !slices.Equal(got["params"][3*testChunk:], want["params"][3*testChunk:]) {
		t.Fatal("good chunks were not restored")
	}
	// Never served again, by this agent or the next.
	for _, st := range []*Store{s, nil} {
		if st == nil {
			s.Close()
			st = openStore(t, root, func(o *Options) { o.Keep = 1 })
		}
		if g, ok := st.Latest(k); !ok || g.Step != 1 {
			t.Fatalf("latest after corruption: step %d %v, want the older step 1", g.Step, ok)
		}
		if gens := st.Generations(k); len(gens) != 2 || !gens[0].Bad {
			t.Fatalf("generations %+v, want step 2 flagged bad", gens)
		}
		got := emptyState(testBuffers)
		if _, err := st.Restore(k, got); err != nil {
			t.Fatal(err)
		}
		checkState(t, got, 1, testBuffers)
		s = st
	}
	if s.Metrics().Restores.Load() != 1 {
		t.Fatalf("metrics %d", s.Metrics().Restores.Load())
	}
}

func TestDamagedGenerationIsNotCompleted(t *testing.T) {
	tests := []struct {
		name   string
		damage func(dir, arena string) error
	}{
		{"missing marker", func(dir, _ string) error { return os.Remove(filepath.Join(dir, markerFile)) }},
		{"torn manifest", func(dir, _ string) error {
			st, _ := os.Stat(filepath.Join(dir, manifestFile))
			return os.Truncate(filepath.Join(dir, manifestFile), st.Size()/2)
		}},
		{"altered manifest", func(dir, _ string) error {
			raw, _ := os.ReadFile(filepath.Join(dir, manifestFile))
			return os.WriteFile(filepath.Join(dir, manifestFile), []byte(strings.Replace(string(raw), `"step":2`, `"step":3`, 1)), 0o600)
		}},
		{"missing manifest", func(dir, _ string) error { return os.Remove(filepath.Join(dir, manifestFile)) }},
		{"garbage marker", func(dir, _ string) error { return os.WriteFile(filepath.Join(dir, markerFile), []byte("{"), 0o600) }},
		{"truncated arena", func(_, arena string) error { return os.Truncate(arena, 4096) }},
		{"missing arena", func(_, arena string) error { return os.Remove(arena) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "reft")
			s := openStore(t, root, func(o *Options) { o.Keep = 1 })
			k := Key{Shard: DefaultShard}
			save(t, s, k, 1, testBuffers)
			g2 := save(t, s, k, 2, testBuffers)
			s.Close()
			dir := filepath.Join(filepath.Dir(g2.ArenaPath), genName(2, g2.Seq))
			if err := tc.damage(dir, g2.ArenaPath); err != nil {
				t.Fatal(err)
			}
			s2 := openStore(t, root, func(o *Options) { o.Keep = 1 })
			if gens := steps(s2.Generations(k)); !slices.Equal(gens, []int64{1}) {
				t.Fatalf("generations after damage: %v, want only step 1", gens)
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Fatalf("damaged generation %s left on disk", dir)
			}
			if s2.Metrics().Discarded.Load() != 1 {
				t.Fatalf("discarded %d", s2.Metrics().Discarded.Load())
			}
			got := emptyState(testBuffers)
			if _, err := s2.Restore(k, got); err != nil {
				t.Fatal(err)
			}
			checkState(t, got, 1, testBuffers)
		})
	}
}
