package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/agent/logging/logtest"
	"github.com/reft-hpc/reft/agent/persist"
	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/spank/spec"
	"github.com/reft-hpc/reft/tmpfs"
)

// persistServer runs a server over a store under root with the persistent
// tier in pdir, as reft-agent wires them. stop ends it (a node lost, when
// the next server gets another root).
func persistServer(t *testing.T, root, pdir, specStr string, logs *bytes.Buffer) (sock string, p *persist.Persister, stop func()) {
	t.Helper()
	return persistServerBudget(t, root, pdir, specStr, logs, 0)
}

// persistServerBudget is persistServer with a memory budget (0: none).
func persistServerBudget(t *testing.T, root, pdir, specStr string, logs *bytes.Buffer, budget int64) (sock string, p *persist.Persister, stop func()) {
	t.Helper()
	sp, err := spec.Parse(specStr)
	if err != nil {
		t.Fatal(err)
	}
	sock = filepath.Join(t.TempDir(), "agent.sock")
	sw := &syncWriter{buf: logs}
	t.Cleanup(func() { // after stop, registered below
		sw.mu.Lock()
		defer sw.mu.Unlock()
		for _, err := range logtest.CheckLines(logs.String()) {
			t.Error(err)
		}
	})
	log := zerolog.New(sw)
	s, err := Listen(sock, Info{Job: "42", Node: "n1", Spec: sp.String(), Version: "test", UID: os.Getuid()}, log)
	if err != nil {
		t.Fatal(err)
	}
	st := openTestStore(t, root, budget, 1)
	s.AttachStore(st)
	p, err = persist.New(persist.Options{Dir: pdir, Job: "42", Node: "n1", UID: os.Getuid(), Policy: sp.Persist,
		FailuresPerNodeDay: 0.016, Store: st, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	s.AttachPersist(p)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-done
			p.Close()
			st.Close()
		})
	}
	t.Cleanup(stop)
	return sock, p, stop
}

// stepBytes is what every buffer of a step holds: distinct per step and
// offset, so a misplaced or stale byte shows.
func stepBytes(step int64, name string, n int64) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = byte(int64(i)*7 + step*13 + int64(len(name)))
	}
	return out
}

func (c *client) saveStep(step int64) {
	c.t.Helper()
	var ar proto.ArenaReply
	c.must(proto.TSave, proto.StepReq{Step: step}, &ar)
	m := mapArena(c.t, ar.Arena, ar.ArenaSize, unix.PROT_READ|unix.PROT_WRITE)
	for _, b := range ar.Buffers {
		copy(m[b.Offset:b.Offset+b.Size], stepBytes(step, b.Name, b.Size))
	}
	c.must(proto.TCommit, proto.StepReq{Step: step}, nil)
}

// restoreStep restores step and checks that every buffer holds its bytes.
func (c *client) restoreStep(step int64) {
	c.t.Helper()
	var ar proto.ArenaReply
	c.must(proto.TRestore, proto.StepReq{Step: step}, &ar)
	if ar.Step != step {
		c.t.Fatalf("restored step %d, asked for %d", ar.Step, step)
	}
	m := mapArena(c.t, ar.Arena, ar.ArenaSize, unix.PROT_READ)
	for _, b := range ar.Buffers {
		if !bytes.Equal(m[b.Offset:b.Offset+b.Size], stepBytes(step, b.Name, b.Size)) {
			c.t.Fatalf("step %d buffer %q: the restored bytes differ from the saved ones", step, b.Name)
		}
	}
	c.must(proto.TRelease, proto.StepReq{Step: step}, nil)
}

func (c *client) gens() []string {
	c.t.Helper()
	var g proto.GenerationsReply
	c.must(proto.TGenerations, nil, &g)
	out := []string{}
	for _, x := range g.Generations {
		out = append(out, fmt.Sprintf("%d:%s", x.Step, x.Source))
	}
	return out
}

func TestPersistentRestoreAfterNodeLoss(t *testing.T) {
	pdir := t.TempDir()
	var logs bytes.Buffer
	sock, p, stop := persistServer(t, t.TempDir(), pdir, "arc,persist=2", &logs)
	c := newClient(t, sock)
	c.must(proto.TRegister, regReq(3, twoBufs...), nil)
	for step := int64(1); step <= 4; step++ {
		c.saveStep(step)
		p.Wait() // every due step written, none skipped
	}
	// 4 is in memory and persisted: listed once, as memory.
	if got, want := c.gens(), []string{"4:memory", "3:memory", "2:persistent"}; !slices.Equal(got, want) {
		t.Fatalf("generations %v, want %v", got, want)
	}
	for _, step := range []int64{2, 4} {
		if _, err := os.Stat(filepath.Join(pdir, "42", "r3", fmt.Sprintf("g%d", step), "COMMITTED")); err != nil {
			t.Fatalf("step %d not persisted: %v", step, err)
		}
	}
	c.c.Close()
	stop()

	// The node is lost: a replacement starts with an empty store.
	logs.Reset()
	sock, p, _ = persistServer(t, t.TempDir(), pdir, "arc,persist=2", &logs)
	c = newClient(t, sock)
	c.must(proto.TRegister, regReq(3, twoBufs...), nil)
	if got, want := c.gens(), []string{"4:persistent", "2:persistent"}; !slices.Equal(got, want) {
		t.Fatalf("generations on the new node %v, want %v", got, want)
	}
	c.restoreStep(4)
	var ev map[string]any
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, `"event":"restore_persistent"`) {
			if err := json.Unmarshal([]byte(l), &ev); err != nil {
				t.Fatal(err)
			}
		}
	}
	if ev == nil || ev["generation"] != 4.0 || ev["bytes"] != 15_000.0 || ev["duration"] == nil ||
		ev["reason"] != "rank 3 has no in-memory generation of step 4 on n1 (it has steps [])" {
		t.Fatalf("restore_persistent event %v\n%s", ev, logs.String())
	}
	// Now a local generation too, and served from memory from here on.
	if got, want := c.gens(), []string{"4:memory", "2:persistent"}; !slices.Equal(got, want) {
		t.Fatalf("generations after the restore %v, want %v", got, want)
	}
	c.restoreStep(4)
	if n := strings.Count(logs.String(), `"event":"restore_persistent"`); n != 1 {
		t.Fatalf("%d persistent restores, want 1 (the second is local)", n)
	}
	// The older persisted step also restores, and training goes on from
	// it: the persisted 4 is an abandoned timeline, no longer offered.
	c.restoreStep(2)
	if got, want := c.gens(), []string{"2:memory"}; !slices.Equal(got, want) {
		t.Fatalf("generations after going back to 2: %v, want %v", got, want)
	}
	c.saveStep(3)
	c.saveStep(4)
	p.Wait()
	if got, want := c.gens(), []string{"4:memory", "3:memory", "2:persistent"}; !slices.Equal(got, want) {
		t.Fatalf("generations after training on from 2: %v, want %v", got, want)
	}
	c.restoreStep(4) // the new timeline's 4
	var pg persist.Generation
	if gens, err := p.Generations(3); err != nil || len(gens) != 2 {
		t.Fatalf("persisted %v, %v", gens, err)
	} else {
		pg = gens[0]
	}
	if pg.Step != 4 {
		t.Fatalf("newest persisted step %d, want 4", pg.Step)
	}
}

func TestPersistentRestoreErrors(t *testing.T) {
	pdir := t.TempDir()
	sock, p, stop := persistServer(t, t.TempDir(), pdir, "arc,persist=2", new(bytes.Buffer))
	c := newClient(t, sock)
	c.must(proto.TRegister, regReq(0, twoBufs...), nil)
	c.saveStep(2)
	p.Wait()
	c.c.Close()
	stop()

	data := filepath.Join(pdir, "42", "r0", "g2", "data")
	var m tmpfs.Manifest
	raw, err := os.ReadFile(filepath.Join(filepath.Dir(data), "MANIFEST"))
	if err != nil || json.Unmarshal(raw, &m) != nil {
		t.Fatalf("manifest: %v", err)
	}

	t.Run("other buffers", func(t *testing.T) {
		sock, _, _ := persistServer(t, t.TempDir(), pdir, "arc,persist=2", new(bytes.Buffer))
		c := newClient(t, sock)
		c.must(proto.TRegister, regReq(0, proto.BufferSpec{Name: "params", Size: 10_000, Replicated: true}), nil)
		if code := c.call(proto.TRestore, proto.StepReq{Step: 2}, nil); code != proto.CodeMismatch {
			t.Fatalf("restore with other buffers: %q, want mismatch", code)
		}
	})
	t.Run("corrupt chunk", func(t *testing.T) {
		// Chunk 1 of adam (4096-byte chunks) gets one bit flipped.
		var adam int64 = -1
		for _, b := range m.Buffers {
			if b.Name == "adam" {
				adam = b.Offset
			}
		}
		f, err := os.OpenFile(data, os.O_RDWR, 0)
		if err != nil || adam < 0 {
			t.Fatalf("data file: %v, adam at %d", err, adam)
		}
		one := []byte{0}
		f.ReadAt(one, adam+4096+100)
		one[0] ^= 1
		f.WriteAt(one, adam+4096+100)
		f.Close()

		sock, _, _ := persistServer(t, t.TempDir(), pdir, "arc,persist=2", new(bytes.Buffer))
		c := newClient(t, sock)
		c.must(proto.TRegister, regReq(0, twoBufs...), nil)
		c.id++
		err = proto.Call(c.c, proto.TRestore, c.id, proto.StepReq{Step: 2}, nil)
		var perr *proto.Error
		if !errors.As(err, &perr) || perr.Code != proto.CodeCorrupt || !strings.Contains(perr.Message, data) ||
			!strings.Contains(perr.Message, `buffer "adam" chunk 1`) {
			t.Fatalf("restore of a corrupt persisted chunk: %v; want corrupt naming %s and the chunk", err, data)
		}
		// Marked bad: no longer offered, and nothing was committed locally.
		if got := c.gens(); len(got) != 0 {
			t.Fatalf("generations after a corrupt restore: %v, want none", got)
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(data), "BAD")); err != nil {
			t.Fatalf("no BAD marker: %v", err)
		}
	})
}

// The fourth arena counts against the budget: a registration it does not
// fit fails at once and says how to do without it.
func TestPersistentArenaOverBudget(t *testing.T) {
	const arena = 20480 // twoBufs, page-aligned
	sock, _, _ := persistServerBudget(t, t.TempDir(), t.TempDir(), "arc,persist=2", new(bytes.Buffer), 3*arena+arena/2)
	c := newClient(t, sock)
	c.id++
	err := proto.Call(c.c, proto.TRegister, c.id, regReq(0, twoBufs...), nil)
	var perr *proto.Error
	if !errors.As(err, &perr) || perr.Code != proto.CodeNoSpace || !strings.Contains(perr.Message, "persist=off in --reft frees it") {
		t.Fatalf("register over budget with persistence on: %v", err)
	}
}

// reft-agent says once whether persistent checkpoints are on, which
// interval and why, and makes the job's directory 0700 for the job's user.
func TestAgentPersistStartup(t *testing.T) {
	tests := []struct {
		name, spec string
		withDir    bool
		want       string
	}{
		{"no directory", "arc", false, "persistent checkpoints off: no persist_dir= in --reft and no [persist] dir in reft.toml"},
		{"off", "arc,persist=off", true, "persistent checkpoints off: persist=off in --reft"},
		{"steps", "arc,persist=500", true, "persistent checkpoints every 500 steps (persist=500 in --reft)"},
		{"auto", "arc", true, "persistent checkpoints at the JIT optimum (persist=auto)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var pdir, extra string
			if tc.withDir {
				// A shared directory the job's user (nobody here) can write.
				top, err := os.MkdirTemp("", "reft-persist-")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { os.RemoveAll(top) })
				os.Chmod(top, 0o755)
				pdir = filepath.Join(top, "ckpt")
				os.Mkdir(pdir, 0o700)
				os.Chown(pdir, nobody, nobody)
				extra = fmt.Sprintf("[persist]\ndir = %q\n", pdir)
			}
			f := newAgentFixture(t, extra)
			cmd := f.start(t, tc.spec)
			sock := SocketPath(f.runDir, "7")
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				if c, err := net.Dial("unix", sock); err == nil {
					c.Close()
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("agent socket %s never answered", sock)
				}
			}
			cmd.Process.Signal(syscall.SIGTERM)
			if err := cmd.Wait(); err != nil {
				t.Fatalf("agent exit: %v", err)
			}
			logData, _ := os.ReadFile(filepath.Join(f.dir, "log", "7", "n9.jsonl"))
			if n := strings.Count(string(logData), tc.want); n != 1 {
				t.Fatalf("log has %q %d times, want once:\n%s", tc.want, n, logData)
			}
			if n := strings.Count(string(logData), `"event":"persist_`); n != 1 {
				t.Fatalf("%d persist_ lines at start, want 1:\n%s", n, logData)
			}
			if !tc.withDir || strings.Contains(tc.spec, "off") {
				return
			}
			st, err := os.Stat(filepath.Join(pdir, "7"))
			if err != nil || st.Mode() != os.ModeDir|0o700 || st.Sys().(*syscall.Stat_t).Uid != nobody {
				t.Fatalf("job directory %v, %v: want 0700 owned by %d", st.Mode(), err, nobody)
			}
		})
	}
}

// TestPersistEpochFromHello: a persisted generation carries the epoch of
// the rank that committed it: the job's restart count and the Slurm step
// id its hello named (a reft run relaunch is a later step), which is what
// fences a stale writer (agent/persist, TestStaleWriterFenced).
func TestPersistEpochFromHello(t *testing.T) {
	pdir := t.TempDir()
	var logs bytes.Buffer
	sock, p, _ := persistServer(t, t.TempDir(), pdir, "arc,persist=1", &logs)
	c := newClient(t, sock)
	var h proto.HelloReply
	c.must(proto.THello, proto.Hello{Client: "test", PID: os.Getpid(), Step: "7", Rank: 3}, &h)
	c.must(proto.TRegister, regReq(3, twoBufs...), nil)
	c.saveStep(1)
	p.Wait()
	b, err := os.ReadFile(filepath.Join(pdir, "42", "r3", "g1", "COMMITTED"))
	if err != nil {
		t.Fatal(err)
	}
	var mk struct {
		Epoch persist.Epoch `json:"epoch"`
	}
	if err := json.Unmarshal(b, &mk); err != nil {
		t.Fatal(err)
	}
	if want := (persist.Epoch{Restart: 0, Step: 7}); mk.Epoch != want {
		t.Errorf("persisted with epoch %v, want %v (COMMITTED %s)", mk.Epoch, want, b)
	}
}
