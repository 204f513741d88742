package main

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/reft-hpc/reft/agent/proto"
)

// TestContract: the socket path is the first stdout line, the agent serves
// until stdin closes, and then its directory is gone.
func TestContract(t *testing.T) {
	dir := t.TempDir()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	var stderr bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run([]string{"--job", "77", "--dir", dir}, inR, outW, &stderr)
		outW.Close()
	}()
	line, err := bufio.NewReader(outR).ReadString('\n')
	if err != nil {
		t.Fatalf("first line: %v (stderr %q)", err, stderr.String())
	}
	sock := strings.TrimSpace(line)
	if filepath.Dir(filepath.Dir(sock)) != dir {
		t.Errorf("socket %s is not in a fresh directory under --dir %s", sock, dir)
	}
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	var h proto.HelloReply
	if err := proto.Call(c, proto.THello, 1, nil, &h); err != nil || h.Job != "77" || h.Protocol != proto.Version {
		t.Fatalf("hello = %+v, %v", h, err)
	}
	var st proto.Status
	if err := proto.Call(c, proto.TStatus, 2, nil, &st); err != nil || !strings.HasPrefix(st.StoreDir, filepath.Dir(sock)) {
		t.Fatalf("status store_dir %q (%v), want under %s", st.StoreDir, err, filepath.Dir(sock))
	}
	c.Close()
	inW.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("still serving 30 s after stdin closed")
	}
	if _, err := os.Stat(filepath.Dir(sock)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the agent's directory is still there: %v", err)
	}
}

func TestBadFlag(t *testing.T) {
	var stderr bytes.Buffer
	if err := run([]string{"--nope"}, strings.NewReader(""), io.Discard, &stderr); err == nil {
		t.Fatal("an unknown flag was accepted")
	}
}

// TestLayout: --layout, or $REFT_CONFORMANCE_AGENT without it, picks the
// agent's arena layout; an unknown one is refused.
func TestLayout(t *testing.T) {
	for _, tc := range []struct {
		name, env string
		args      []string
		sections  []string // of a save of buffers "a" and "b"; nil: refused
	}{
		{"default", "", nil, []string{"a", "b"}},
		{"flag", "", []string{"--layout", "scatter"}, []string{"scatter-0", "scatter-1"}},
		{"environment", "scatter", nil, []string{"scatter-0", "scatter-1"}},
		{"flag wins", "scatter", []string{"--layout", "identity"}, []string{"a", "b"}},
		{"unknown", "", []string{"--layout", "nope"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(LayoutEnv, tc.env)
			inR, inW := io.Pipe()
			outR, outW := io.Pipe()
			done := make(chan error, 1)
			go func() {
				done <- run(append([]string{"--dir", t.TempDir()}, tc.args...), inR, outW, io.Discard)
				outW.Close()
			}()
			defer func() {
				inW.Close()
				if err := <-done; (err != nil) != (tc.sections == nil) {
					t.Errorf("run: %v", err)
				}
			}()
			line, err := bufio.NewReader(outR).ReadString('\n')
			if tc.sections == nil {
				if err == nil {
					t.Fatalf("layout %v accepted: socket %q", tc.args, line)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c, err := net.Dial("unix", strings.TrimSpace(line))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			reg := proto.Register{World: 1, Buffers: []proto.BufferSpec{{Name: "a", Size: 5000}, {Name: "b", Size: 7000}}}
			var ar proto.ArenaReply
			if err := proto.Call(c, proto.TRegister, 1, reg, nil); err != nil {
				t.Fatal(err)
			}
			if err := proto.Call(c, proto.TSave, 2, proto.StepReq{Step: 1}, &ar); err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, s := range ar.Sections {
				got = append(got, s.Name)
			}
			if !slices.Equal(got, tc.sections) {
				t.Fatalf("sections %v, want %v", got, tc.sections)
			}
		})
	}
}

// TestMemoryBudget: --memory-budget is the budget the message log's
// per-rank cap derives from (half of it for a lone rank); without it the
// cap is 0, and every log append is refused.
func TestMemoryBudget(t *testing.T) {
	for _, tc := range []struct {
		name          string
		args          []string
		budget, cap64 int64
	}{
		{"none", nil, 0, 0},
		{"1 GiB", []string{"--memory-budget", "1073741824"}, 1 << 30, 1 << 29},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inR, inW := io.Pipe()
			outR, outW := io.Pipe()
			done := make(chan error, 1)
			go func() {
				done <- run(append([]string{"--dir", t.TempDir()}, tc.args...), inR, outW, io.Discard)
				outW.Close()
			}()
			defer func() {
				inW.Close()
				if err := <-done; err != nil {
					t.Errorf("run: %v", err)
				}
			}()
			line, err := bufio.NewReader(outR).ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			c, err := net.Dial("unix", strings.TrimSpace(line))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			reg := proto.Register{World: 1, Buffers: []proto.BufferSpec{{Name: "a", Size: 4096}}}
			if err := proto.Call(c, proto.TRegister, 1, reg, nil); err != nil {
				t.Fatal(err)
			}
			var st proto.Status
			if err := proto.Call(c, proto.TStatus, 2, nil, &st); err != nil {
				t.Fatal(err)
			}
			if int64(st.MemoryBudget) != tc.budget || st.MsgLog == nil || st.MsgLog.RankCap != tc.cap64 {
				t.Fatalf("status memory_budget %d, msglog %+v; want %d and a rank cap of %d", st.MemoryBudget, st.MsgLog, tc.budget, tc.cap64)
			}
		})
	}
}
