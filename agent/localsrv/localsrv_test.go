package localsrv

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/agent/proto"
)

// fake is a Handler whose sessions record the frames they get and answer
// each with an empty hello reply; a frame of id failID makes Handle fail,
// one of blockID blocks it until its ctx is done.
type fake struct {
	mu      sync.Mutex
	ids     []uint32
	opened  int
	pid     int32
	closed  chan struct{} // closed by the first session's Close (a second panics)
	failID  uint32
	blockID uint32
	blocked chan struct{} // closed when Handle blocks
	ctxErr  error         // why the blocked Handle ended
}

func newFake() *fake { return &fake{closed: make(chan struct{}), blocked: make(chan struct{})} }

func (h *fake) Open(c net.Conn, cred *unix.Ucred, _ zerolog.Logger) Session {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.opened++
	h.pid = cred.Pid
	return &fakeSession{h: h, c: c}
}

func (h *fake) got() []uint32 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.ids)
}

type fakeSession struct {
	h *fake
	c net.Conn
}

func (s *fakeSession) Handle(ctx context.Context, f proto.Frame) error {
	s.h.mu.Lock()
	s.h.ids = append(s.h.ids, f.ID)
	s.h.mu.Unlock()
	switch f.ID {
	case s.h.failID:
		return errors.New("reply not written")
	case s.h.blockID:
		close(s.h.blocked)
		<-ctx.Done()
		s.h.mu.Lock()
		s.h.ctxErr = ctx.Err()
		s.h.mu.Unlock()
		return ctx.Err()
	}
	return proto.WriteMsg(s.c, proto.THelloReply, f.ID, proto.HelloReply{})
}

func (s *fakeSession) Close() { close(s.h.closed) }

// serve runs a Server for uid with h and returns it; the test's cleanup
// stops it and checks that Serve returned nil and the socket is gone.
func serve(t *testing.T, uid int, h Handler) *Server {
	t.Helper()
	path := filepath.Join(t.TempDir(), "agent.sock")
	s, err := Listen(path, Config{UID: uid, Job: "42", Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, h) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("socket %s left behind: %v", path, err)
		}
	})
	return s
}

func dial(t *testing.T, path string) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

// raw is a frame as bytes, header fields as given.
func raw(ver, typ byte, flags uint16, id uint32, payload string) []byte {
	b := make([]byte, proto.HeaderSize)
	binary.BigEndian.PutUint32(b, uint32(proto.HeaderSize-4+len(payload)))
	b[4], b[5] = ver, typ
	binary.BigEndian.PutUint16(b[6:], flags)
	binary.BigEndian.PutUint32(b[8:], id)
	return append(b, payload...)
}

func hello(id uint32) []byte { return raw(proto.Version, byte(proto.THello), 0, id, "") }

// wait waits for ch to close, failing the test after a while.
func wait(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// TestListen: the socket is born 0600 and owned by its creator; a live
// socket is not taken over; a stale one is replaced.
func TestListen(t *testing.T) {
	s := serve(t, os.Getuid(), newFake())
	st, err := os.Stat(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode()&os.ModeSocket == 0 || st.Mode().Perm() != 0o600 || int(st.Sys().(*syscall.Stat_t).Uid) != os.Getuid() {
		t.Fatalf("socket mode %v, owner %d; want a 0600 socket of uid %d", st.Mode(), st.Sys().(*syscall.Stat_t).Uid, os.Getuid())
	}
	if _, err := Listen(s.Path(), Config{UID: os.Getuid()}); err == nil {
		t.Fatal("a second Listen took over a live socket")
	}

	stale := filepath.Join(t.TempDir(), "stale.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	s2, err := Listen(stale, Config{UID: os.Getuid()})
	if err != nil {
		t.Fatalf("a stale socket was not replaced: %v", err)
	}
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s2.Close(); err != nil {
		t.Fatalf("a second Close: %v", err)
	}
}

// TestRefusesOtherUID: a peer of another uid gets forbidden and never a
// session.
func TestRefusesOtherUID(t *testing.T) {
	h := newFake()
	s := serve(t, os.Getuid()+1, h)
	c := dial(t, s.Path())
	var rep proto.HelloReply
	err := proto.Call(c, proto.THello, 1, proto.Hello{}, &rep)
	var pe *proto.Error
	if !errors.As(err, &pe) || pe.Code != proto.CodeForbidden {
		t.Fatalf("hello from another uid: %v, want forbidden", err)
	}
	if _, err := proto.Decode(c); err == nil {
		t.Fatal("the connection stayed open after the refusal")
	}
	if h.opened != 0 || s.Clients() != 0 || s.Accepted() != 1 {
		t.Fatalf("opened %d sessions, %d clients, %d accepted; want 0, 0, 1", h.opened, s.Clients(), s.Accepted())
	}
}

// TestFrames: well-formed frames reach the session in order; a malformed
// one is answered with an error and counted, and the connection goes on
// unless the frame boundary is lost. The session is closed once, when the
// peer goes away.
func TestFrames(t *testing.T) {
	cases := []struct {
		name   string
		bad    []byte
		code   string
		id     uint32
		closes bool
	}{
		{"none", nil, "", 0, false},
		{"version 9", raw(9, 1, 0, 7, ""), proto.CodeVersion, 7, false},
		{"flags", raw(proto.Version, 1, 3, 8, ""), proto.CodeMalformed, 8, false},
		{"payload not an object", raw(proto.Version, 1, 0, 9, "[1]"), proto.CodeMalformed, 9, false},
		{"length below header", []byte{0, 0, 0, 2, 0, 0}, proto.CodeMalformed, 0, true},
		{"length above limit", []byte{0x7f, 0, 0, 0}, proto.CodeMalformed, 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newFake()
			s := serve(t, os.Getuid(), h)
			c := dial(t, s.Path())
			in := append(hello(1), hello(2)...)
			in = append(in, tc.bad...)
			if !tc.closes {
				in = append(in, hello(3)...)
			}
			if _, err := c.Write(in); err != nil {
				t.Fatal(err)
			}
			var ids []uint32
			for {
				f, err := proto.Decode(c)
				if err != nil {
					break
				}
				ids = append(ids, f.ID)
				if f.Type == proto.TError {
					var e proto.Error
					if err := f.Unmarshal(&e); err != nil || e.Code != tc.code || f.ID != tc.id {
						t.Fatalf("error reply %+v (id %d), %v; want code %s, id %d", e, f.ID, err, tc.code, tc.id)
					}
				}
				if len(ids) == 4 || tc.bad == nil && len(ids) == 3 || tc.closes && len(ids) == 3 {
					break
				}
			}
			wantIDs, wantGot := []uint32{1, 2, tc.id, 3}, []uint32{1, 2, 3}
			switch {
			case tc.bad == nil:
				wantIDs = []uint32{1, 2, 3}
			case tc.closes:
				wantIDs, wantGot = []uint32{1, 2, tc.id}, []uint32{1, 2}
			}
			if !slices.Equal(ids, wantIDs) {
				t.Fatalf("replies to ids %v, want %v", ids, wantIDs)
			}
			if !tc.closes {
				c.Close()
			}
			wait(t, h.closed, "the session's Close")
			if got := h.got(); !slices.Equal(got, wantGot) {
				t.Fatalf("session got frames %v, want %v", got, wantGot)
			}
			if want := uint64(len(tc.bad) / max(len(tc.bad), 1)); s.BadFrames() != want {
				t.Fatalf("%d bad frames counted, want %d", s.BadFrames(), want)
			}
			if h.opened != 1 || h.pid != int32(os.Getpid()) {
				t.Fatalf("%d sessions opened, for pid %d; want 1, for %d", h.opened, h.pid, os.Getpid())
			}
		})
	}
}

// TestSessionEnds: a session is closed once when a reply cannot be
// written (Handle fails) and when the server closes, which also ends
// Serve and cancels a frame's work in progress; Clients counts open
// connections.
func TestSessionEnds(t *testing.T) {
	t.Run("handle fails", func(t *testing.T) {
		h := newFake()
		h.failID = 2
		s := serve(t, os.Getuid(), h)
		c := dial(t, s.Path())
		if _, err := c.Write(append(append(hello(1), hello(2)...), hello(3)...)); err != nil {
			t.Fatal(err)
		}
		wait(t, h.closed, "the session's Close")
		if got := h.got(); !slices.Equal(got, []uint32{1, 2}) {
			t.Fatalf("session got frames %v, want [1 2] (none after the failed reply)", got)
		}
	})
	t.Run("server closes", func(t *testing.T) {
		h := newFake()
		path := filepath.Join(t.TempDir(), "agent.sock")
		s, err := Listen(path, Config{UID: os.Getuid(), Log: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- s.Serve(context.Background(), h) }()
		c := dial(t, path)
		var rep proto.HelloReply
		if err := proto.Call(c, proto.THello, 1, nil, &rep); err != nil {
			t.Fatal(err)
		}
		if s.Clients() != 1 || s.Accepted() != 1 {
			t.Fatalf("%d clients, %d accepted; want 1, 1", s.Clients(), s.Accepted())
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		wait(t, h.closed, "the session's Close")
		if err := <-done; err != nil {
			t.Fatalf("Serve after Close: %v", err)
		}
		if s.Clients() != 0 {
			t.Fatalf("%d clients after Close", s.Clients())
		}
		if _, err := proto.Decode(c); err == nil {
			t.Fatal("the connection stayed open after Close")
		}
	})
	t.Run("server closes during a frame", func(t *testing.T) {
		h := newFake()
		h.blockID = 5
		path := filepath.Join(t.TempDir(), "agent.sock")
		s, err := Listen(path, Config{UID: os.Getuid(), Log: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- s.Serve(context.Background(), h) }()
		if _, err := dial(t, path).Write(hello(5)); err != nil {
			t.Fatal(err)
		}
		wait(t, h.blocked, "Handle to block")
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		wait(t, h.closed, "the session's Close")
		if err := <-done; err != nil {
			t.Fatalf("Serve after Close: %v", err)
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		if !errors.Is(h.ctxErr, context.Canceled) {
			t.Fatalf("the blocked frame's ctx ended with %v, want canceled", h.ctxErr)
		}
	})
}
