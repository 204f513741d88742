package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/logging/logtest"
	"github.com/reft-hpc/reft/agent/proto"
)

const nobody = 65534

// startServer runs a server for a job owned by uid and returns its socket.
func startServer(t *testing.T, uid int, logBuf *logtest.Buffer) (*Server, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "reft-agent-test-") // not t.TempDir: its parent is 0700 and uid 65534 must reach the socket
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "agent.sock")
	log := zerolog.Nop()
	if logBuf != nil {
		logBuf.CheckEvents(t)
		log = zerolog.New(logBuf)
	}
	s, err := Listen(path, Info{Job: "42", Node: "n1", Spec: "arc", Version: "test", UID: uid, Restart: 1}, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("socket %s left behind after Close: %v", path, err)
		}
	})
	return s, path
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

func TestSocketMode(t *testing.T) {
	_, path := startServer(t, os.Getuid(), nil)
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode()&os.ModeSocket == 0 || st.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, want a socket with 0600", st.Mode())
	}
	if uid := st.Sys().(*syscall.Stat_t).Uid; int(uid) != os.Getuid() {
		t.Fatalf("socket owned by %d, want %d", uid, os.Getuid())
	}
}

func TestHelloAndStatus(t *testing.T) {
	_, path := startServer(t, os.Getuid(), nil)
	c := dial(t, path)
	var h proto.HelloReply
	if err := proto.Call(c, proto.THello, 1, proto.Hello{Client: "test", PID: os.Getpid()}, &h); err != nil {
		t.Fatal(err)
	}
	want := proto.HelloReply{Protocol: 1, Job: "42", Node: "n1", Spec: "arc", AgentVersion: "test", Restart: 1}
	if h != want {
		t.Fatalf("hello reply %+v, want %+v", h, want)
	}
	var st proto.Status
	if err := proto.Call(c, proto.TStatus, 2, nil, &st); err != nil {
		t.Fatal(err)
	}
	if st.Job != "42" || st.Clients != 1 || st.Connections != 1 || st.PID != os.Getpid() {
		t.Fatalf("status %+v", st)
	}
}

// TestMalformedFrames: each bad frame gets an error reply and a log line, and
// the agent keeps serving (on the same connection when the frame boundary
// is intact, on a new one otherwise).
func TestMalformedFrames(t *testing.T) {
	raw := func(ver, typ byte, flags uint16, id uint32, payload string) []byte {
		b := make([]byte, 12)
		binary.BigEndian.PutUint32(b, uint32(8+len(payload)))
		b[4], b[5] = ver, typ
		binary.BigEndian.PutUint16(b[6:], flags)
		binary.BigEndian.PutUint32(b[8:], id)
		return append(b, payload...)
	}
	tests := []struct {
		name   string
		in     []byte
		code   string
		id     uint32
		closes bool
	}{
		{"bad json", raw(1, 1, 0, 5, "{"), proto.CodeMalformed, 5, false},
		{"hello with wrong field types", raw(1, 1, 0, 6, `{"pid":"x"}`), proto.CodeMalformed, 6, false},
		{"version 9", raw(9, 1, 0, 7, ""), proto.CodeVersion, 7, false},
		{"flags", raw(1, 1, 3, 8, ""), proto.CodeMalformed, 8, false},
		{"unknown type", raw(1, 0x33, 0, 9, ""), proto.CodeUnknownType, 9, false},
		{"length below header", []byte{0, 0, 0, 2, 0, 0}, proto.CodeMalformed, 0, true},
		{"length above limit", []byte{0x7f, 0, 0, 0}, proto.CodeMalformed, 0, true},
	}
	var logBuf logtest.Buffer
	s, path := startServer(t, os.Getuid(), &logBuf)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := dial(t, path)
			if _, err := c.Write(tt.in); err != nil {
				t.Fatal(err)
			}
			f, err := proto.Decode(c)
			if err != nil || f.Type != proto.TError || f.ID != tt.id {
				t.Fatalf("reply %+v, %v; want an error frame with id %d", f, err, tt.id)
			}
			var e proto.Error
			if err := f.Unmarshal(&e); err != nil || e.Code != tt.code || e.Message == "" {
				t.Fatalf("error payload %+v, %v; want code %s", e, err, tt.code)
			}
			var h proto.HelloReply
			err = proto.Call(c, proto.THello, 100, nil, &h)
			if tt.closes && err == nil {
				t.Fatal("connection still open after a frame with a bad length")
			}
			if !tt.closes && (err != nil || h.Job != "42") {
				t.Fatalf("hello after the bad frame on the same connection: %+v, %v", h, err)
			}
			var h2 proto.HelloReply
			if err := proto.Call(dial(t, path), proto.THello, 1, nil, &h2); err != nil {
				t.Fatalf("agent stopped serving after %s: %v", tt.name, err)
			}
		})
	}
	if got := s.Status().BadFrames; got != uint64(len(tests)) {
		t.Errorf("bad_frames = %d, want %d", got, len(tests))
	}
	if n := strings.Count(logBuf.String(), `"level":"warn"`); n != len(tests) {
		t.Errorf("%d warn log lines for %d bad frames:\n%s", n, len(tests), logBuf.String())
	}
}

// TestRefusesRootForAnotherUsersJob: root connecting to the agent of a job
// owned by nobody is refused by the SO_PEERCRED check.
func TestRefusesRootForAnotherUsersJob(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("this test needs root (it checks that even root is refused); run the unit tests as root")
	}
	var logBuf logtest.Buffer
	_, path := startServer(t, nobody, &logBuf)
	var h proto.HelloReply
	err := proto.Call(dial(t, path), proto.THello, 1, nil, &h)
	var pe *proto.Error
	if !errors.As(err, &pe) || pe.Code != proto.CodeForbidden {
		t.Fatalf("hello as root to nobody's agent: %v, want forbidden", err)
	}
	if !strings.Contains(logBuf.String(), "refused a connection from another uid") {
		t.Errorf("no log line for the refusal:\n%s", logBuf.String())
	}
}

// TestRefusesOtherUID: a client running as another uid (nobody) is refused
// by SO_PEERCRED even when file permissions would let it connect, and by
// the socket's 0600 mode otherwise.
func TestRefusesOtherUID(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("this test needs root to run a client as uid 65534; run the unit tests as root")
	}
	py := "/usr/bin/python3" // not a per-user shim: uid 65534 must be able to run it
	if _, err := os.Stat(py); err != nil {
		t.Fatal("python3 is needed to run a client as another uid: ", err)
	}
	client := `import socket,struct,sys
s=socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print("connect-error", e.errno); sys.exit(0)
try:
    s.sendall(struct.pack(">IBBHI",8,1,1,0,1))
except BrokenPipeError:
    pass  # the agent may refuse and close before the request is sent
h=s.recv(12)
n=struct.unpack(">I",h[:4])[0]
body=b""
while len(body)<n-8:
    d=s.recv(n-8-len(body))
    if not d: break
    body+=d
print("type", h[5], body.decode())`
	runAs := func(path string) string {
		cmd := exec.Command(py, "-c", client, path)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("client as nobody: %v\n%s", err, out)
		}
		return strings.TrimSpace(string(out))
	}

	_, path := startServer(t, os.Getuid(), nil)
	if out := runAs(path); out != "connect-error 13" {
		t.Errorf("nobody connecting to a 0600 root socket: %q, want EACCES (13)", out)
	}
	if err := os.Chmod(path, 0o666); err != nil { // let the SO_PEERCRED check do the work
		t.Fatal(err)
	}
	out := runAs(path)
	if !strings.HasPrefix(out, "type 255 ") || !strings.Contains(out, `"code":"forbidden"`) {
		t.Errorf("nobody with socket access: %q, want an error frame with code forbidden", out)
	}
}

func TestListenRefusesLiveSocketAndReplacesStale(t *testing.T) {
	_, path := startServer(t, os.Getuid(), nil)
	if _, err := Listen(path, Info{}, zerolog.Nop()); err == nil || !strings.Contains(err.Error(), "already listening") {
		t.Fatalf("second Listen on a live socket: %v", err)
	}
	stale := filepath.Join(t.TempDir(), "stale.sock")
	ln, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	s, err := Listen(stale, Info{}, zerolog.Nop())
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	s.Close()
}

type syncWriter struct {
	mu  sync.Mutex
	buf *bytes.Buffer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}
