package client_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/reft-hpc/reft/client"
	"github.com/reft-hpc/reft/tests/conformance-agent/agenttest"
	"github.com/reft-hpc/reft/tmpfs"
)

func TestOpenWithoutSocket(t *testing.T) {
	t.Setenv(client.SocketEnv, "")
	os.Unsetenv(client.SocketEnv)
	t.Run("required", func(t *testing.T) {
		_, err := client.Open(context.Background(), client.Options{})
		if err == nil || !strings.Contains(err.Error(), "REFT_AGENT_SOCKET is not set") || !strings.Contains(err.Error(), "Options.Optional") {
			t.Fatalf("Open = %v, want the not-enabled error", err)
		}
	})
	t.Run("optional", func(t *testing.T) {
		var notes []string
		c, err := client.Open(context.Background(), client.Options{Optional: true, Log: func(m string) { notes = append(notes, m) }})
		if err != nil {
			t.Fatal(err)
		}
		if c.Enabled() {
			t.Fatal("Enabled() = true without a socket")
		}
		buf := patterned(100, 1)
		if err := c.Register("w", buf, client.Replicated); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			if err := c.Save(int64(i)).Wait(context.Background()); err != nil {
				t.Fatalf("Save: %v", err)
			}
		}
		step, ok, err := c.Restore(context.Background())
		if step != 0 || ok || err != nil {
			t.Fatalf("Restore = %d, %v, %v; want nothing", step, ok, err)
		}
		if g, err := c.Generations(context.Background()); g != nil || err != nil {
			t.Fatalf("Generations = %v, %v", g, err)
		}
		if err := c.RestoreStep(context.Background(), 1); err == nil {
			t.Fatal("RestoreStep of a disabled client succeeded")
		}
		c.Hint(time.Second)
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if len(notes) != 1 || !strings.Contains(notes[0], "REFT_AGENT_SOCKET") {
			t.Fatalf("notices %q, want exactly one naming REFT_AGENT_SOCKET", notes)
		}
	})
}

func TestOpenOptions(t *testing.T) {
	a := startAgent(t)
	tests := []struct {
		name string
		opt  client.Options
		want string // "" for success
	}{
		{"defaults", client.Options{}, ""},
		{"rank of world", client.Options{Rank: 3, World: 4, LocalRank: 1}, ""},
		{"rank above world", client.Options{Rank: 4, World: 4}, "Rank = 4"},
		{"negative world", client.Options{World: -1}, "World = -1"},
		{"negative rank", client.Options{Rank: -1}, "Rank = -1"},
		{"negative local rank", client.Options{LocalRank: -2}, "LocalRank = -2"},
		{"negative chunk", client.Options{ChunkSize: -1}, "ChunkSize"},
		{"negative workers", client.Options{Workers: -1}, "Workers"},
		{"negative restore workers", client.Options{RestoreWorkers: -1}, "RestoreWorkers"},
		{"no agent", client.Options{Socket: "/nonexistent/agent.sock"}, "connecting to the reft agent"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.opt.Socket == "" {
				tt.opt.Socket = a.Socket
			}
			c, err := client.Open(ctxT(t), tt.opt)
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if h := c.Agent(); h.Protocol != 1 || h.Job != "4242" {
					t.Errorf("hello reply %+v", h)
				}
				if err := c.Close(); err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Open = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestFromEnv(t *testing.T) {
	tests := []struct {
		name              string
		procid, ntasks, l string // "-": unset
		want              client.Options
		err               string
	}{
		{"outside slurm", "-", "-", "-", client.Options{World: 1}, ""},
		{"task", "3", "8", "1", client.Options{Rank: 3, World: 8, LocalRank: 1}, ""},
		{"partial", "3", "-", "-", client.Options{}, "only some"},
		{"not a number", "x", "8", "0", client.Options{}, "SLURM_PROCID"},
		{"negative", "0", "-2", "0", client.Options{}, "SLURM_NTASKS"},
		{"rank too large", "8", "8", "0", client.Options{}, "not below"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range map[string]string{"SLURM_PROCID": tt.procid, "SLURM_NTASKS": tt.ntasks, "SLURM_LOCALID": tt.l} {
				t.Setenv(k, v)
				if v == "-" {
					os.Unsetenv(k)
				}
			}
			got, err := client.FromEnv()
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("FromEnv = %+v, %v; want error with %q", got, err, tt.err)
				}
				return
			}
			if err != nil || got.Rank != tt.want.Rank || got.World != tt.want.World || got.LocalRank != tt.want.LocalRank {
				t.Fatalf("FromEnv = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestRegisterRules(t *testing.T) {
	a := startAgent(t)
	tests := []struct {
		name  string
		setup func(c *client.Client) // before the Register under test
		reg   func(c *client.Client) error
		want  string
	}{
		{"ok", nil, func(c *client.Client) error { return c.Register("w", make([]byte, 10), client.Sharded) }, ""},
		{"empty buffer", nil, func(c *client.Client) error { return c.Register("w", nil, client.Replicated) }, ""},
		{"empty name", nil, func(c *client.Client) error { return c.Register("", make([]byte, 1), client.Replicated) }, "1 to 256 bytes"},
		{"long name", nil, func(c *client.Client) error { return c.Register(strings.Repeat("n", 257), nil, client.Replicated) }, "1 to 256 bytes"},
		{"bad kind", nil, func(c *client.Client) error { return c.Register("w", nil, client.Kind(7)) }, "neither"},
		{"duplicate", func(c *client.Client) { c.Register("w", make([]byte, 5), client.Replicated) },
			func(c *client.Client) error { return c.Register("w", make([]byte, 5), client.Replicated) }, "already registered"},
		{"after save", func(c *client.Client) {
			c.Register("w", make([]byte, 5), client.Replicated)
			c.Save(1).Wait(context.Background())
		}, func(c *client.Client) error { return c.Register("x", make([]byte, 5), client.Replicated) }, "before the first Save"},
		{"after restore", func(c *client.Client) {
			c.Register("w", make([]byte, 5), client.Replicated)
			c.Restore(context.Background())
		}, func(c *client.Client) error { return c.Register("x", make([]byte, 5), client.Replicated) }, "before the first Save"},
		{"after close", func(c *client.Client) { c.Close() },
			func(c *client.Client) error { return c.Register("x", make([]byte, 5), client.Replicated) }, "closed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := open(t, a, client.Options{})
			if tt.setup != nil {
				tt.setup(c)
			}
			err := tt.reg(c)
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Register = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestSaveRestore(t *testing.T) {
	tests := []struct {
		name    string
		sizes   []int
		chunk   int64
		workers int
		layout  string // the agent's arena layout (agenttest.Options.Layout)
	}{
		{"one buffer", []int{5000}, 0, 0, ""},
		{"several, small chunks", []int{100_000, 12_345, 0, 1}, 4096, 1, ""},
		{"several, workers", []int{300_000, 4096, 70_001}, 8192, 3, ""},
		{"more workers than chunks", []int{10}, 0, 8, ""},
		// Regions in permuted order across two sections, straddling
		// chunks: the client verifies the section checksums at every
		// restore as it copies.
		{"scatter, small chunks", []int{100_000, 12_345, 0, 1}, 4096, 1, "scatter"},
		{"scatter, workers", []int{300_000, 4096, 70_001}, 8192, 3, "scatter"},
		{"scatter, default chunks", []int{9 << 20, 3}, 0, 2, "scatter"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := startAgentWith(t, agenttest.Options{Layout: tt.layout})
			ctx := ctxT(t)
			opt := client.Options{ChunkSize: tt.chunk, Workers: tt.workers, Layout: "dp=1"}
			c := open(t, a, opt)
			bufs := make([][]byte, len(tt.sizes))
			for i, n := range tt.sizes {
				bufs[i] = make([]byte, n)
				if err := c.Register(fmt.Sprintf("b%d", i), bufs[i], client.Kind(i%2)); err != nil {
					t.Fatal(err)
				}
			}
			fill := func(seed int) {
				for i, b := range bufs {
					pattern(b, seed+i)
				}
			}
			check := func(seed int) {
				t.Helper()
				for i, b := range bufs {
					mustEqual(t, fmt.Sprintf("buffer %d", i), b, patterned(len(b), seed+i))
				}
			}
			for step := int64(1); step <= 3; step++ {
				fill(int(step))
				h := c.Save(step)
				if h.Step() != step {
					t.Fatalf("handle step %d", h.Step())
				}
				if err := h.Wait(ctx); err != nil {
					t.Fatalf("save %d: %v", step, err)
				}
				if st := h.Stats(); st.Seq == 0 && step > 1 || st.Bytes != int64(total(tt.sizes)) || st.Commit <= 0 {
					t.Errorf("save %d: stats %+v after commit", step, st)
				}
			}
			gens, err := c.Generations(ctx)
			if err != nil || len(gens) == 0 || gens[0] != 3 {
				t.Fatalf("Generations = %v, %v; want 3 first", gens, err)
			}
			fill(99)
			step, ok, err := c.Restore(ctx)
			if err != nil || !ok || step != 3 {
				t.Fatalf("Restore = %d, %v, %v; want 3", step, ok, err)
			}
			check(3)
			if len(gens) > 1 {
				if err := c.RestoreStep(ctx, gens[1]); err != nil {
					t.Fatal(err)
				}
				check(int(gens[1]))
			}
			// A restarted rank: a new connection restores what the old one saved.
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			c2 := open(t, a, opt)
			fresh := make([][]byte, len(tt.sizes))
			for i, n := range tt.sizes {
				fresh[i] = make([]byte, n)
				c2.Register(fmt.Sprintf("b%d", i), fresh[i], client.Kind(i%2))
			}
			if step, ok, err := c2.Restore(ctx); err != nil || !ok || step != 3 {
				t.Fatalf("Restore after reconnect = %d, %v, %v", step, ok, err)
			}
			for i, b := range fresh {
				mustEqual(t, fmt.Sprintf("restored buffer %d", i), b, patterned(len(b), 3+i))
			}
		})
	}
}

// TestRestoreCorruptChunk: the client verifies a restore while it copies
// (the agent leaves the checksums to it); a byte flipped in a committed
// generation's arena fails the restore with CodeCorrupt naming the section
// and chunk, the agent marks the generation bad in its store, and the next
// Restore takes the newest step left, whole and intact.
func TestRestoreCorruptChunk(t *testing.T) {
	for _, tc := range []struct {
		name    string
		layout  string
		workers int
	}{
		{"identity", "", 1},
		{"scatter, workers", "scatter", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := startAgentWith(t, agenttest.Options{Layout: tc.layout})
			ctx := ctxT(t)
			c := open(t, a, client.Options{ChunkSize: 4096, Workers: tc.workers, RestoreWorkers: tc.workers})
			bufs := [][]byte{make([]byte, 20_000), make([]byte, 9_000)}
			for i, b := range bufs {
				if err := c.Register(fmt.Sprintf("b%d", i), b, client.Kind(i%2)); err != nil {
					t.Fatal(err)
				}
			}
			for step := int64(1); step <= 2; step++ {
				for i, b := range bufs {
					pattern(b, int(step)*10+i)
				}
				if err := c.Save(step).Wait(ctx); err != nil {
					t.Fatal(err)
				}
			}
			key := tmpfs.Key{Rank: 0, Shard: tmpfs.DefaultShard}
			g, ok := a.Store.Latest(key)
			if !ok || g.Step != 2 {
				t.Fatalf("newest generation %d (%v), want 2", g.Step, ok)
			}
			sec := g.Manifest.Buffers[0]
			f, err := os.OpenFile(g.ArenaPath, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			one := []byte{0}
			at := sec.Offset + 4096 + 17 // the section's chunk 1
			if _, err := f.ReadAt(one, at); err != nil {
				t.Fatal(err)
			}
			one[0] ^= 0x01
			if _, err := f.WriteAt(one, at); err != nil {
				t.Fatal(err)
			}
			f.Close()
			err = c.RestoreStep(ctx, 2)
			var ae *client.Error
			want := fmt.Sprintf("%q chunk 1", sec.Name)
			if !errors.As(err, &ae) || ae.Code != client.CodeCorrupt || !strings.Contains(err.Error(), want) {
				t.Fatalf("restore of the corrupt step = %v, want CodeCorrupt naming %s", err, want)
			}
			for _, h := range a.Store.Generations(key) {
				if h.Step == 2 && !h.Bad {
					t.Fatal("the agent's store does not mark step 2 bad")
				}
			}
			if got, err := c.Generations(ctx); err != nil || !slices.Equal(got, []int64{1}) {
				t.Fatalf("generations after the corrupt restore = %v, %v; want [1]", got, err)
			}
			step, ok, err := c.Restore(ctx)
			if err != nil || !ok || step != 1 {
				t.Fatalf("Restore = %d, %v, %v; want 1", step, ok, err)
			}
			for i, b := range bufs {
				mustEqual(t, fmt.Sprintf("buffer %d", i), b, patterned(len(b), 10+i))
			}
		})
	}
}

func TestSavesBackToBack(t *testing.T) {
	// Saves without waiting: each Save first waits for the one before.
	a := startAgent(t)
	ctx := ctxT(t)
	c := open(t, a, client.Options{ChunkSize: 4096})
	buf := patterned(1<<20, 5)
	c.Register("w", buf, client.Replicated)
	var hs []*client.Handle
	for step := range int64(6) {
		hs = append(hs, c.Save(step))
		for _, h := range hs[:len(hs)-1] {
			select {
			case <-h.Done():
			default:
				t.Fatalf("save %d is not done after Save(%d) returned", h.Step(), step)
			}
		}
	}
	for _, h := range hs {
		if err := h.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	clear(buf)
	if step, ok, err := c.Restore(ctx); err != nil || !ok || step != 5 {
		t.Fatalf("Restore = %d, %v, %v", step, ok, err)
	}
	mustEqual(t, "w", buf, patterned(len(buf), 5))
}

// TestProgress: the progress heartbeat needs registered buffers and a
// step >= 0, and the agent takes it before and after saves.
func TestProgress(t *testing.T) {
	a := startAgent(t)
	ctx := ctxT(t)
	c := open(t, a, client.Options{})
	if err := c.Progress(ctx, 1); err == nil || !strings.Contains(err.Error(), "nothing is registered") {
		t.Fatalf("Progress before Register = %v, want the client's error", err)
	}
	c.Register("w", patterned(4096, 1), client.Replicated)
	for _, tc := range []struct {
		step int64
		ok   bool
	}{{-1, false}, {1, true}, {2, true}} {
		if err := c.Progress(ctx, tc.step); (err == nil) != tc.ok {
			t.Errorf("Progress(%d) = %v, want ok=%v", tc.step, err, tc.ok)
		}
	}
	if err := c.Save(3).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Progress(ctx, 4); err != nil {
		t.Fatalf("Progress after a save: %v", err)
	}
}

func TestAgentErrors(t *testing.T) {
	a := startAgent(t)
	ctx := ctxT(t)
	c := open(t, a, client.Options{})
	w := patterned(4096, 1)
	c.Register("w", w, client.Replicated)
	if err := c.Save(3).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		do   func() error
		code string // "": an error from the client itself
	}{
		{"unknown step", func() error { return c.RestoreStep(ctx, 4) }, client.CodeNotFound},
		{"negative restore step", func() error { return c.RestoreStep(ctx, -1) }, ""},
		{"negative save step", func() error { return c.Save(-1).Wait(ctx) }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.do()
			if err == nil {
				t.Fatal("no error")
			}
			var ae *client.Error
			if tt.code == "" {
				if errors.As(err, &ae) {
					t.Fatalf("error %v came from the agent, want one from the client", err)
				}
				return
			}
			if !errors.As(err, &ae) || ae.Code != tt.code {
				t.Fatalf("error %v, want agent code %q", err, tt.code)
			}
		})
	}
	// The connection is still good after agent errors.
	if err := c.Save(4).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	t.Run("mismatch", func(t *testing.T) {
		c2 := open(t, a, client.Options{})
		c2.Register("w", make([]byte, 8192), client.Replicated)
		var ae *client.Error
		if err := c2.RestoreStep(ctx, 4); !errors.As(err, &ae) || ae.Code != client.CodeMismatch {
			t.Fatalf("RestoreStep with other sizes = %v, want mismatch", err)
		}
	})
	t.Run("nothing registered", func(t *testing.T) {
		c3 := open(t, a, client.Options{})
		err := c3.Save(1).Wait(ctx)
		var ae *client.Error
		if err == nil || errors.As(err, &ae) || !strings.Contains(err.Error(), "Register") {
			t.Fatalf("Save with nothing registered = %v", err)
		}
		if _, _, err := c3.Restore(ctx); err == nil || errors.As(err, &ae) {
			t.Fatalf("Restore with nothing registered = %v", err)
		}
	})
}

func TestRestoreAgreement(t *testing.T) {
	a := startAgent(t)
	ctx := ctxT(t)
	// Rank 0 has steps 1 and 2, rank 1 only 1: the job restores 1.
	const world = 2
	have := [][]int64{{1, 2}, {1}}
	g := newGather(world)
	cs := make([]*client.Client, world)
	bufs := make([][]byte, world)
	for r := range world {
		cs[r] = open(t, a, client.Options{Rank: r, World: world, Agree: client.Gather(g.gather(r))})
		bufs[r] = make([]byte, 10_000)
		cs[r].Register("w", bufs[r], client.Sharded)
		for _, s := range slices.Backward(have[r]) {
			pattern(bufs[r], 10*r+int(s))
			if err := cs[r].Save(s).Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}
		clear(bufs[r])
	}
	var wg sync.WaitGroup
	steps := make([]int64, world)
	errs := make([]error, world)
	for r := range world {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var ok bool
			steps[r], ok, errs[r] = cs[r].Restore(ctx)
			if !ok && errs[r] == nil {
				errs[r] = errors.New("nothing restored")
			}
		}()
	}
	wg.Wait()
	for r := range world {
		if errs[r] != nil || steps[r] != 1 {
			t.Fatalf("rank %d: Restore = %d, %v; want step 1", r, steps[r], errs[r])
		}
		mustEqual(t, fmt.Sprintf("rank %d", r), bufs[r], patterned(len(bufs[r]), 10*r+1))
	}

	t.Run("no agree", func(t *testing.T) {
		c := open(t, a, client.Options{Rank: 0, World: 2})
		c.Register("w", make([]byte, 10), client.Replicated)
		_, _, err := c.Restore(ctx)
		if err == nil || !strings.Contains(err.Error(), "Options.Agree") {
			t.Fatalf("Restore without Agree = %v", err)
		}
	})
	t.Run("agree fails", func(t *testing.T) {
		c := open(t, a, client.Options{Rank: 0, World: 2, Agree: func(context.Context, []int64) ([]int64, error) {
			return nil, errors.New("communicator down")
		}})
		c.Register("w", make([]byte, 10_000), client.Sharded)
		_, _, err := c.Restore(ctx)
		if err == nil || !strings.Contains(err.Error(), "communicator down") {
			t.Fatalf("Restore = %v", err)
		}
	})
	t.Run("no common step is said", func(t *testing.T) {
		// This rank holds a step, the other rank none of the same: the job
		// starts over, and the rank says which work it throws away.
		var said []string
		c := open(t, a, client.Options{Rank: 0, World: 2, Log: func(m string) { said = append(said, m) },
			Agree: func(_ context.Context, mine []int64) ([]int64, error) {
				if slices.Contains(mine, 7) {
					return nil, nil // the step agreement: the other rank holds no step 7
				}
				return mine, nil // the outcome agreement: the other rank restored fine
			}})
		c.Register("w", make([]byte, 10_000), client.Sharded)
		if err := c.Save(7).Wait(ctx); err != nil {
			t.Fatal(err)
		}
		step, ok, err := c.Restore(ctx)
		if err != nil || ok {
			t.Fatalf("Restore = %d, %v, %v; want nothing to restore", step, ok, err)
		}
		if len(said) != 1 || !strings.Contains(said[0], "holds step(s) [7 1], but no step is held by every rank") {
			t.Fatalf("logged %q; want one line naming steps 7 and 1 (step 1 from above)", said)
		}
	})
	t.Run("local failure still takes part", func(t *testing.T) {
		var calls [][]int64
		c := open(t, a, client.Options{Rank: 1, World: 2, Agree: func(_ context.Context, mine []int64) ([]int64, error) {
			calls = append(calls, slices.Clone(mine))
			if len(calls) == 1 {
				return []int64{1}, nil
			}
			return slices.DeleteFunc(slices.Clone(mine), func(v int64) bool { return v == 1 }), nil // the other rank fails nowhere
		}})
		// Nothing registered: this rank cannot restore, but the others
		// must not hang in the collectives, the step's nor the outcome's.
		_, _, err := c.Restore(ctx)
		var re *client.RestoreError
		if !errors.As(err, &re) || len(calls) < 2 || len(calls[0]) != 0 || len(calls[1]) != 0 || !slices.Equal(re.Ranks, []int{1}) || re.Step != -1 {
			t.Fatalf("Restore = %v, Agree calls %v; want a RestoreError naming rank 1 after agreeing with no steps and on a failure", err, calls)
		}
		if !strings.Contains(err.Error(), "restore failed on rank 1 before a step was chosen") || !strings.Contains(err.Error(), "no buffers registered") {
			t.Fatalf("error %q does not say rank 1 failed before a step was chosen, and why", err)
		}
	})
}

// corruptGeneration flips a byte of rank's committed generation of step in
// the agent's store, so that the agent's restore finds it corrupt.
func corruptGeneration(t *testing.T, a *agenttest.Agent, rank int, step int64) {
	t.Helper()
	dir := filepath.Join(a.Store.Dir(), fmt.Sprintf("r%d", rank), "state")
	ms, _ := filepath.Glob(filepath.Join(dir, fmt.Sprintf("g%d-*", step), "MANIFEST"))
	if len(ms) != 1 {
		t.Fatalf("rank %d's manifests of step %d: %v", rank, step, ms)
	}
	m := readManifest(t, ms[0])
	f, err := os.OpenFile(filepath.Join(dir, m.Arena), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [1]byte
	off := m.Buffers[0].Offset + 100
	if _, err := f.ReadAt(b[:], off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b[:], off); err != nil {
		t.Fatal(err)
	}
}

// TestRestoreAllOrNothing: four ranks agree on step 2; the ranks whose
// copy of it is corrupt cannot restore it, and then no rank's Restore
// succeeds: every rank gets a RestoreError naming exactly the failed
// ranks (the failed ones with their own corrupt error). Calling Restore
// again on every rank, as the error says, restores step 1 everywhere,
// since the agent dropped the corrupt generations.
func TestRestoreAllOrNothing(t *testing.T) {
	const world = 4
	cases := []struct {
		name   string
		failed []int
		who    string // how the error names them
	}{
		{"none", nil, ""},
		{"rank 2", []int{2}, "rank 2"},
		{"ranks 1 and 3", []int{1, 3}, "ranks 1, 3"},
		{"every rank", []int{0, 1, 2, 3}, "ranks 0, 1, 2, 3"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := startAgent(t)
			ctx := ctxT(t)
			g := newGather(world)
			cs := make([]*client.Client, world)
			bufs := make([][]byte, world)
			for r := range world {
				cs[r] = open(t, a, client.Options{Rank: r, World: world, Agree: client.Gather(g.gather(r))})
				bufs[r] = make([]byte, 10_000)
				cs[r].Register("w", bufs[r], client.Sharded)
				for s := 1; s <= 2; s++ {
					pattern(bufs[r], 10*r+s)
					if err := cs[r].Save(int64(s)).Wait(ctx); err != nil {
						t.Fatal(err)
					}
				}
				clear(bufs[r])
			}
			for _, r := range tc.failed {
				corruptGeneration(t, a, r, 2)
			}
			restoreAll := func() ([]int64, []error) {
				steps, errs := make([]int64, world), make([]error, world)
				var wg sync.WaitGroup
				for r := range world {
					wg.Add(1)
					go func() {
						defer wg.Done()
						var ok bool
						steps[r], ok, errs[r] = cs[r].Restore(ctx)
						if !ok && errs[r] == nil {
							errs[r] = errors.New("nothing restored")
						}
					}()
				}
				wg.Wait()
				return steps, errs
			}
			steps, errs := restoreAll()
			want := int64(2)
			if len(tc.failed) > 0 {
				for r, err := range errs {
					var re *client.RestoreError
					if !errors.As(err, &re) || re.Step != 2 || !slices.Equal(re.Ranks, tc.failed) || re.More {
						t.Fatalf("rank %d: Restore = %d, %v; want a RestoreError of step 2 naming ranks %v", r, steps[r], err, tc.failed)
					}
					if !strings.Contains(err.Error(), "restore of step 2 failed on "+tc.who+": no rank may train") {
						t.Errorf("rank %d: error %q does not name %s", r, err, tc.who)
					}
					var ce *client.Error
					if slices.Contains(tc.failed, r) != (errors.As(err, &ce) && ce.Code == client.CodeCorrupt) {
						t.Errorf("rank %d: error %v; want its own corrupt error exactly on the failed ranks", r, err)
					}
				}
				t.Logf("rank 0: %v", errs[0])
				steps, errs = restoreAll() // again, as the error says
				want = 1
			}
			for r := range world {
				if errs[r] != nil || steps[r] != want {
					t.Fatalf("rank %d: Restore = %d, %v; want step %d", r, steps[r], errs[r], want)
				}
				mustEqual(t, fmt.Sprintf("rank %d", r), bufs[r], patterned(len(bufs[r]), 10*r+int(want)))
			}
		})
	}
}

// gather is an in-process all-gather among world goroutines, standing in
// for MPI or torch.distributed: each rank's n-th call joins round n.
type gather struct {
	mu     sync.Mutex
	world  int
	rounds []*gatherRound
	next   []int // per rank, its next round
}

type gatherRound struct {
	lists [][]int64
	n     int
	done  chan struct{}
}

func newGather(world int) *gather {
	return &gather{world: world, next: make([]int, world)}
}

func (g *gather) gather(rank int) func(context.Context, []int64) ([][]int64, error) {
	return func(ctx context.Context, mine []int64) ([][]int64, error) {
		g.mu.Lock()
		i := g.next[rank]
		g.next[rank]++
		for len(g.rounds) <= i {
			g.rounds = append(g.rounds, &gatherRound{lists: make([][]int64, g.world), done: make(chan struct{})})
		}
		rd := g.rounds[i]
		rd.lists[rank] = slices.Clone(mine) // a real all-gather copies too
		rd.n++
		if rd.n == g.world {
			close(rd.done)
		}
		g.mu.Unlock()
		select {
		case <-rd.done:
			return rd.lists, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func TestCommonNewest(t *testing.T) {
	tests := []struct {
		name  string
		lists [][]int64
		want  int64
		ok    bool
	}{
		{"no lists", nil, 0, false},
		{"one rank", [][]int64{{3, 2}}, 3, true},
		{"one empty rank", [][]int64{{3, 2}, {}}, 0, false},
		{"common older", [][]int64{{5, 4, 3}, {4, 3}, {6, 4}}, 4, true},
		{"unsorted", [][]int64{{1, 9, 4}, {4, 9}}, 9, true},
		{"disjoint", [][]int64{{1, 2}, {3}}, 0, false},
		{"duplicates", [][]int64{{2, 2, 1}, {2}}, 2, true},
		{"step zero", [][]int64{{0}, {0, 1}}, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := client.CommonNewest(tt.lists)
			if got != tt.want || ok != tt.ok {
				t.Fatalf("CommonNewest(%v) = %d, %v; want %d, %v", tt.lists, got, ok, tt.want, tt.ok)
			}
		})
	}
	if got := client.Common([][]int64{{5, 4, 3}, {3, 4}}); !slices.Equal(got, []int64{4, 3}) {
		t.Fatalf("Common = %v, want [4 3]", got)
	}
}

func TestHintWindows(t *testing.T) {
	a := startAgent(t)
	ctx := ctxT(t)
	c := open(t, a, client.Options{ChunkSize: 4096})
	buf := patterned(1<<20, 1)
	c.Register("w", buf, client.Replicated)
	if err := c.Save(1).Wait(ctx); err != nil { // before any hint: copies at once
		t.Fatal(err)
	}

	c.Hint(0) // from now on, copy only inside windows; none is open
	h := c.Save(2)
	select {
	case <-h.Done():
		t.Fatal("the save finished outside any idle window")
	case <-time.After(100 * time.Millisecond):
	}
	c.Hint(time.Minute) // a window opens: the copy goes on without Wait
	select {
	case <-h.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the save did not finish inside an open idle window")
	}
	if err := h.Wait(ctx); err != nil {
		t.Fatal(err)
	}

	c.Hint(0)
	h = c.Save(3)
	if err := h.Wait(ctx); err != nil { // Wait copies the rest at once
		t.Fatal(err)
	}
	c.Hint(0)
	h = c.Save(4)
	if err := c.Close(); err != nil { // so does Close
		t.Fatal(err)
	}
	if err := h.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	c2 := open(t, a, client.Options{})
	c2.Register("w", make([]byte, len(buf)), client.Replicated)
	if g, err := c2.Generations(ctx); err != nil || len(g) == 0 || g[0] != 4 {
		t.Fatalf("Generations after Close = %v, %v; want step 4 committed", g, err)
	}
}

func TestCopyFault(t *testing.T) {
	// The arena shrinks under the copier (a full tmpfs does the same to a
	// sparse file): the copy faults, the save fails and is aborted, and the
	// rank lives on with a working connection.
	a := startAgent(t)
	ctx := ctxT(t)
	c := open(t, a, client.Options{})
	buf := patterned(1<<18, 1)
	c.Register("w", buf, client.Replicated)
	if err := c.Save(1).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	c.Hint(0) // hold the copier
	h := c.Save(2)
	arenas, _ := filepath.Glob(filepath.Join(a.Store.Dir(), "r0", "state", "arena-*"))
	if len(arenas) == 0 {
		t.Fatal("no arena files in the store")
	}
	// Truncate every arena but the one holding step 1's committed bytes.
	committed := committedArena(t, a.Store.Dir(), 1)
	for _, p := range arenas {
		if p != committed {
			if err := os.Truncate(p, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	err := h.Wait(ctx)
	if err == nil || !strings.Contains(err.Error(), "memory fault") {
		t.Fatalf("Wait = %v, want a memory fault", err)
	}
	if g, err := c.Generations(ctx); err != nil || !slices.Equal(g, []int64{1}) {
		t.Fatalf("Generations = %v, %v; want only step 1 (step 2 aborted)", g, err)
	}
}

// committedArena is the arena file of the committed generation of step.
func committedArena(t *testing.T, storeDir string, step int64) string {
	t.Helper()
	ms, _ := filepath.Glob(filepath.Join(storeDir, "r0", "state", fmt.Sprintf("g%d-*", step), "MANIFEST"))
	if len(ms) != 1 {
		t.Fatalf("manifests of step %d: %v", step, ms)
	}
	m := readManifest(t, ms[0])
	return filepath.Join(storeDir, "r0", "state", m.Arena)
}

func TestClosedClient(t *testing.T) {
	a := startAgent(t)
	ctx := ctxT(t)
	c := open(t, a, client.Options{})
	c.Register("w", make([]byte, 10), client.Replicated)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	checks := map[string]error{
		"save":         c.Save(1).Wait(ctx),
		"restore step": c.RestoreStep(ctx, 1),
	}
	_, _, checks["restore"] = c.Restore(ctx)
	_, checks["generations"] = c.Generations(ctx)
	for name, err := range checks {
		if err == nil || !strings.Contains(err.Error(), "closed") {
			t.Errorf("%s after Close = %v, want a closed error", name, err)
		}
	}
}

func total(sizes []int) (n int) {
	for _, s := range sizes {
		n += s
	}
	return n
}
