package client_test

import (
	"bytes"
	"context"
	"errors"
	"github.com/reft-hpc/reft/internal/crc32c"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/client"
)

// fakeAgent answers each request with what reply returns: frames to send,
// and whether to close the connection afterwards. It starts the
// conversation with greet when that is set.
type fakeAgent struct {
	greet []proto.Frame
	reply func(f proto.Frame) (out []proto.Frame, hangup bool)

	mu    sync.Mutex
	conns []net.Conn
}

func (fa *fakeAgent) start(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "reft-fake-")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "agent.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		fa.hangup()
		wg.Wait()
		os.RemoveAll(dir)
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fa.mu.Lock()
			fa.conns = append(fa.conns, c)
			fa.mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				for _, f := range fa.greet {
					proto.Write(c, f)
				}
				for {
					f, err := proto.Decode(c)
					if err != nil {
						return
					}
					out, hangup := fa.reply(f)
					for _, o := range out {
						if proto.Write(c, o) != nil {
							return
						}
					}
					if hangup {
						return
					}
				}
			}()
		}
	}()
	return path
}

// hangup closes every connection, as an agent that dies.
func (fa *fakeAgent) hangup() {
	fa.mu.Lock()
	defer fa.mu.Unlock()
	for _, c := range fa.conns {
		c.Close()
	}
}

func msg(t proto.Type, id uint32, payload string) proto.Frame {
	return proto.Frame{Type: t, ID: id, Payload: []byte(payload)}
}

const helloOK = `{"protocol":1,"job":"7","node":"n","spec":"arc","agent_version":"fake","restart":0}`

// standard answers hello, register (one 4096-byte buffer "w") and save like
// an agent with arena; anything else goes to other.
func standard(arena string, other func(f proto.Frame) ([]proto.Frame, bool)) func(f proto.Frame) ([]proto.Frame, bool) {
	return func(f proto.Frame) ([]proto.Frame, bool) {
		switch f.Type {
		case proto.THello:
			return []proto.Frame{msg(proto.THelloReply, f.ID, helloOK)}, false
		case proto.TRegister:
			return []proto.Frame{msg(proto.TRegister|proto.ReplyBit, f.ID,
				`{"rank":0,"chunk_size":4096,"arena_size":4096,"buffers":[{"name":"w","offset":0,"size":4096,"replicated":true}]}`)}, false
		case proto.TSave:
			return []proto.Frame{msg(proto.TSave|proto.ReplyBit, f.ID,
				`{"step":1,"arena":"`+arena+`","arena_size":4096,"buffers":[{"name":"w","offset":0,"size":4096,"replicated":true}]}`)}, false
		}
		return other(f)
	}
}

// saveReplying answers hello, register (one 4096-byte buffer "w") and
// save, whose reply has the given JSON fields besides step, arena and
// arena_size; anything else (the abort) gets an empty reply.
func saveReplying(arena, fields string) func(f proto.Frame) ([]proto.Frame, bool) {
	std := standard(arena, func(f proto.Frame) ([]proto.Frame, bool) {
		return []proto.Frame{msg(f.Type|proto.ReplyBit, f.ID, `{"step":1}`)}, false
	})
	return func(f proto.Frame) ([]proto.Frame, bool) {
		if f.Type == proto.TSave {
			return []proto.Frame{msg(f.Type|proto.ReplyBit, f.ID, `{"step":1,"arena":"`+arena+`","arena_size":4096,`+fields+`}`)}, false
		}
		return std(f)
	}
}

func save1(_ *testing.T, c *client.Client, _ *fakeAgent) error {
	return c.Save(1).Wait(context.Background())
}

func arenaFile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "arena-0")
	if err := os.WriteFile(p, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestProtocolEdges(t *testing.T) {
	arena := arenaFile(t)
	never := func(proto.Frame) ([]proto.Frame, bool) { return nil, false }
	tests := []struct {
		name  string
		fa    *fakeAgent
		run   func(t *testing.T, c *client.Client, fa *fakeAgent) error // nil: Open must fail
		code  string                                                    // agent error code wanted; "" none
		match string                                                    // text the error must contain
	}{
		{name: "other protocol", fa: &fakeAgent{reply: func(f proto.Frame) ([]proto.Frame, bool) {
			return []proto.Frame{msg(proto.THelloReply, f.ID, `{"protocol":2,"agent_version":"9.0"}`)}, false
		}}, match: "speaks protocol 2"},
		{name: "forbidden", fa: &fakeAgent{
			greet: []proto.Frame{msg(proto.TError, 0, `{"code":"forbidden","message":"uid 1 may not"}`)},
			reply: func(proto.Frame) ([]proto.Frame, bool) { return nil, true },
		}, code: client.CodeForbidden},
		{name: "reply with another id", fa: &fakeAgent{reply: func(f proto.Frame) ([]proto.Frame, bool) {
			return []proto.Frame{msg(proto.THelloReply, f.ID+1, helloOK)}, false
		}}, match: "answered request id"},
		{name: "reply of another type", fa: &fakeAgent{reply: func(f proto.Frame) ([]proto.Frame, bool) {
			return []proto.Frame{msg(proto.TStatusReply, f.ID, `{}`)}, false
		}}, match: "type 0x82"},
		{name: "error id 0 answers the outstanding request", fa: &fakeAgent{reply: standard(arena, func(f proto.Frame) ([]proto.Frame, bool) {
			if f.Type == proto.TCommit {
				return []proto.Frame{msg(proto.TError, 0, `{"code":"internal","message":"disk on fire"}`)}, false
			}
			return []proto.Frame{msg(f.Type|proto.ReplyBit, f.ID, `{"generations":[{"step":1}]}`)}, false
		})}, run: func(t *testing.T, c *client.Client, _ *fakeAgent) error {
			err := c.Save(1).Wait(context.Background())
			if g, gerr := c.Generations(context.Background()); gerr != nil || len(g) != 1 {
				t.Errorf("the connection should still work after an error reply: %v, %v", g, gerr)
			}
			return err
		}, code: client.CodeInternal, match: "disk on fire"},
		{name: "agent dies during commit", fa: &fakeAgent{reply: standard(arena, func(proto.Frame) ([]proto.Frame, bool) { return nil, true })},
			run: func(t *testing.T, c *client.Client, _ *fakeAgent) error {
				err := c.Save(1).Wait(context.Background())
				if _, gerr := c.Generations(context.Background()); gerr == nil || !strings.Contains(gerr.Error(), "unusable") {
					t.Errorf("Generations after a lost connection = %v, want unusable", gerr)
				}
				return err
			}, match: "commit of step 1"},
		{name: "wait times out, the save goes on", fa: &fakeAgent{reply: standard(arena, never)},
			run: func(t *testing.T, c *client.Client, fa *fakeAgent) error {
				h := c.Save(1)
				ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
				defer cancel()
				err := h.Wait(ctx)
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("Wait = %v, want a deadline error", err)
				}
				fa.hangup() // the agent goes: the commit fails and Close returns
				err = h.Wait(context.Background())
				if err == nil || !errors.Is(err, io.EOF) && !strings.Contains(err.Error(), "reading") {
					t.Errorf("Wait after hangup = %v", err)
				}
				return err
			}, match: "commit"},
		{name: "request cut off by its context", fa: &fakeAgent{reply: standard(arena, never)},
			run: func(t *testing.T, c *client.Client, _ *fakeAgent) error {
				ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
				defer cancel()
				_, err := c.Generations(ctx)
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("Generations = %v, want a deadline error", err)
				}
				_, err = c.Generations(context.Background())
				return err
			}, match: "unusable"},
		// Save replies that break the layout rules are refused (and the
		// save aborted) before anything is copied.
		{name: "layout that does not fit", fa: &fakeAgent{reply: saveReplying(arena,
			`"buffers":[{"name":"w","offset":4000,"size":4096}]`)}, run: save1, match: "does not fit"},
		{name: "buffer offset -1 without regions", fa: &fakeAgent{reply: saveReplying(arena,
			`"buffers":[{"name":"w","offset":-1,"size":4096}]`)}, run: save1, match: "does not fit"},
		{name: "regions without sections", fa: &fakeAgent{reply: saveReplying(arena,
			`"buffers":[{"name":"w","offset":-1,"size":4096}],"regions":[{"buffer":"w","offset":0,"size":4096,"arena_offset":0}]`)},
			run: save1, match: "both or neither"},
		{name: "regions that overlap", fa: &fakeAgent{reply: saveReplying(arena, `"buffers":[{"name":"w","offset":-1,"size":4096}],`+
			`"regions":[{"buffer":"w","offset":0,"size":2048,"arena_offset":0},{"buffer":"w","offset":2048,"size":2048,"arena_offset":2000}],`+
			`"sections":[{"name":"s","arena_offset":0,"size":4096}]`)}, run: save1, match: "overlap"},
		{name: "section not filled", fa: &fakeAgent{reply: saveReplying(arena, `"buffers":[{"name":"w","offset":-1,"size":4096}],`+
			`"regions":[{"buffer":"w","offset":0,"size":2048,"arena_offset":0}],"sections":[{"name":"s","arena_offset":0,"size":4096}]`)},
			run: save1, match: "must fill every section"},
		{name: "region of an unregistered buffer", fa: &fakeAgent{reply: saveReplying(arena, `"buffers":[{"name":"w","offset":-1,"size":4096}],`+
			`"regions":[{"buffer":"x","offset":0,"size":4096,"arena_offset":0}],"sections":[{"name":"s","arena_offset":0,"size":4096}]`)},
			run: save1, match: "not registered"},
		{name: "save reply naming a missing arena", fa: &fakeAgent{reply: standard("/nonexistent/arena", func(f proto.Frame) ([]proto.Frame, bool) {
			return []proto.Frame{msg(f.Type|proto.ReplyBit, f.ID, `{"step":1}`)}, false // the abort
		})}, run: func(t *testing.T, c *client.Client, _ *fakeAgent) error {
			return c.Save(1).Wait(context.Background())
		}, match: "opening arena"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sock := tt.fa.start(t)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := client.Open(ctx, client.Options{Socket: sock})
			if tt.run != nil {
				if err != nil {
					t.Fatal(err)
				}
				if err := c.Register("w", make([]byte, 4096), client.Replicated); err != nil {
					t.Fatal(err)
				}
				err = tt.run(t, c, tt.fa)
				tt.fa.hangup()
				c.Close()
			}
			if err == nil {
				t.Fatal("no error")
			}
			var ae *client.Error
			if tt.code != "" && (!errors.As(err, &ae) || ae.Code != tt.code) {
				t.Errorf("error %v, want agent code %q", err, tt.code)
			}
			if !strings.Contains(err.Error(), tt.match) {
				t.Errorf("error %q does not contain %q", err, tt.match)
			}
		})
	}
}

// TestCommitChecksums: the commit's crc32c is keyed by the save reply's
// sections, one CRC-32C per chunk of the section as filled through the
// regions; an agent from before regions gets them keyed by buffer, whole
// buffers copied at their offsets.
func TestCommitChecksums(t *testing.T) {
	for _, tc := range []struct {
		name   string
		fields string
		want   map[string][2]int // section: its arena range
		place  [][3]int          // buffer offset, size, arena offset
	}{
		{"agent without regions", `"buffers":[{"name":"w","offset":0,"size":4096}]`,
			map[string][2]int{"w": {0, 4096}}, [][3]int{{0, 4096, 0}}},
		{"regions in two sections", `"buffers":[{"name":"w","offset":-1,"size":4096}],` +
			`"regions":[{"buffer":"w","offset":3096,"size":1000,"arena_offset":0},{"buffer":"w","offset":0,"size":3096,"arena_offset":1000}],` +
			`"sections":[{"name":"b","arena_offset":1000,"size":3096},{"name":"a","arena_offset":0,"size":1000}]`,
			map[string][2]int{"a": {0, 1000}, "b": {1000, 4096}}, [][3]int{{3096, 1000, 0}, {0, 3096, 1000}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			arena := arenaFile(t)
			commits := make(chan proto.Commit, 1)
			reply := saveReplying(arena, tc.fields)
			fa := &fakeAgent{reply: func(f proto.Frame) ([]proto.Frame, bool) {
				if f.Type == proto.TCommit {
					var cm proto.Commit
					if err := f.Unmarshal(&cm); err != nil {
						t.Errorf("commit: %v", err)
					}
					commits <- cm
				}
				return reply(f)
			}}
			c, err := client.Open(context.Background(), client.Options{Socket: fa.start(t)})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			buf := make([]byte, 4096)
			for i := range buf {
				buf[i] = byte(i * 13)
			}
			c.Register("w", buf, client.Replicated)
			if err := c.Save(1).Wait(context.Background()); err != nil {
				t.Fatal(err)
			}
			data, err := os.ReadFile(arena)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range tc.place {
				if !bytes.Equal(data[p[2]:p[2]+p[1]], buf[p[0]:p[0]+p[1]]) {
					t.Fatalf("buffer bytes [%d, +%d) are not at arena offset %d", p[0], p[1], p[2])
				}
			}
			cm := <-commits
			if len(cm.CRC32C) != len(tc.want) {
				t.Fatalf("crc32c %v, want sections %v", cm.CRC32C, tc.want)
			}
			for name, r := range tc.want {
				if got, want := cm.CRC32C[name], crc32c.Checksum(data[r[0]:r[1]]); len(got) != 1 || got[0] != want {
					t.Errorf("crc32c[%q] = %v, want [%d]", name, got, want)
				}
			}
		})
	}
}

// TestWatchFailuresReportsRefusals: an agent that answers the notice
// connection's hello or watch with an error makes WatchFailures fail with
// it (a shadowed err once made it return nil, leaving the JIT flush off
// without a word); unknown_type (an agent from before notices) says so.
func TestWatchFailuresReportsRefusals(t *testing.T) {
	for _, tc := range []struct {
		name     string
		refuse   proto.Type // the request answered with an error
		code     string
		wantText string
	}{
		{"watch unknown_type", proto.TWatch, "unknown_type", "has no notices"},
		{"watch internal", proto.TWatch, "internal", "disk on fire"},
		{"second hello", proto.THello, "internal", "disk on fire"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			hellos := 0
			fa := &fakeAgent{reply: func(f proto.Frame) ([]proto.Frame, bool) {
				mu.Lock()
				defer mu.Unlock()
				if f.Type == proto.THello {
					hellos++
				}
				if f.Type == tc.refuse && (f.Type != proto.THello || hellos > 1) {
					return []proto.Frame{msg(proto.TError, f.ID, `{"code":"`+tc.code+`","message":"disk on fire"}`)}, false
				}
				if f.Type == proto.THello {
					return []proto.Frame{msg(proto.THelloReply, f.ID, helloOK)}, false
				}
				return []proto.Frame{msg(f.Type|proto.ReplyBit, f.ID, `{}`)}, false
			}}
			c, err := client.Open(context.Background(), client.Options{Socket: fa.start(t)})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			err = c.WatchFailures(context.Background())
			if err == nil {
				t.Fatal("WatchFailures = nil; want the agent's refusal")
			}
			var ae *client.Error
			if !errors.As(err, &ae) || ae.Code != tc.code || !strings.Contains(err.Error(), tc.wantText) {
				t.Errorf("WatchFailures = %v; want a *client.Error with code %s saying %q", err, tc.code, tc.wantText)
			}
		})
	}
}
