package peer

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// Strangers before authentication (issue 14, finding 5): they may send
// only small hello and auth frames, hold a bounded number of connections
// in all and per address, and cannot stop the listener by exhausting the
// process's descriptors.

// rawHeader is a frame header of type t announcing length payload bytes.
func rawHeader(t Type, length uint32) []byte {
	b := make([]byte, HeaderSize)
	Header{Version: Version, Type: t, Length: length}.Put(b)
	return b
}

// heapInUse is the live heap after a collection.
func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestPreAuthHugeLengths: connections that announce huge payloads before
// authenticating cost the listener next to nothing: the frame type and
// length are refused on the header, before any payload is allocated.
func TestPreAuthHugeLengths(t *testing.T) {
	cfg := baseConfig(t, "n1")
	cfg.MaxUnauthenticatedPerHost = 64 // every stranger gets as far as its header
	srv := startServer(t, cfg, newMemSource())
	cases := []struct {
		name string
		hdr  []byte
	}{
		{"chunk frame of MaxPayload", rawHeader(TChunk, MaxPayload)},
		{"hello of MaxControl", rawHeader(THello, MaxControl)},
		{"auth of MaxControl", rawHeader(TAuth, MaxControl)},
		{"status of MaxControl", rawHeader(TStatus, MaxControl)},
	}
	const perCase = 6
	before := heapInUse()
	var conns []*rawConn
	for _, tc := range cases {
		for range perCase {
			r := rawDial(t, srv.Addr().String())
			if _, err := r.Write(tc.hdr); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			conns = append(conns, r) // held open: the payload never comes
		}
	}
	// Each is answered with one error frame and closed; a listener that
	// reads the payload instead waits for it, holding what it allocated.
	for i, r := range conns {
		r.SetDeadline(time.Now().Add(5 * time.Second))
		f, err := Decode(r)
		if err != nil {
			t.Fatalf("%s: no refusal: %v (the listener waits for the payload)", cases[i/perCase].name, err)
		}
		var e Error
		json.Unmarshal(f.Payload, &e)
		if f.Type != TError || (e.Code != CodeForbidden && e.Code != CodeMalformed) {
			t.Fatalf("%s: answered %s %s, want a forbidden or malformed refusal", cases[i/perCase].name, f.Type, f.Payload)
		}
	}
	if grew := int64(heapInUse()) - int64(before); grew > 4<<20 {
		t.Fatalf("%d strangers grew the heap by %d MiB, want < 4", len(conns), grew>>20)
	}
}

// stall opens a connection that sends a valid hello header and then
// nothing: it holds an unauthenticated slot until the handshake deadline.
func stall(t *testing.T, addr string) *rawConn {
	r := rawDial(t, addr)
	if _, err := r.Write(rawHeader(THello, 100)); err != nil {
		t.Fatal(err)
	}
	return r
}

// closedAt reports whether the listener closed r (EOF or reset) within d.
func closedAt(r *rawConn, d time.Duration) (bool, error) {
	r.SetReadDeadline(time.Now().Add(d))
	var b [1]byte
	_, err := r.Read(b[:])
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false, nil
	}
	if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
		return true, nil
	}
	return false, fmt.Errorf("read: %v (want EOF, reset or timeout)", err)
}

// TestPreAuthPerHost: one address holds at most MaxUnauthenticatedPerHost
// unauthenticated connections; more are closed unread, and once the
// stalled ones go, that address is served again.
func TestPreAuthPerHost(t *testing.T) {
	var logs syncBuffer
	cfg := baseConfig(t, "n1")
	cfg.MaxUnauthenticatedPerHost = 4
	cfg.Log = zerolog.New(&logs)
	srv := startServer(t, cfg, newMemSource())
	addr := srv.Addr().String()
	var held []*rawConn
	for range 4 {
		held = append(held, stall(t, addr))
	}
	waitFor(t, 5*time.Second, "4 unauthenticated connections", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return srv.perHost["127.0.0.1"] == 4
	})
	for i := range 3 {
		shut, err := closedAt(stall(t, addr), 3*time.Second)
		if err != nil || !shut {
			t.Fatalf("extra connection %d: closed %v, %v; want closed at once", i, shut, err)
		}
	}
	if n := srv.Stats().Shed.Load(); n != 3 {
		t.Fatalf("shed %d connections, want 3", n)
	}
	if ev := logs.Events("peer_conn_shed"); len(ev) != 1 {
		t.Fatalf("logged %d peer_conn_shed lines, want 1 (rate-limited): %v", len(ev), ev)
	}
	for _, r := range held {
		r.Close()
	}
	// The server notices the closes on its own goroutines; a peer that
	// dials before the count drops is shed, rightly.
	waitFor(t, 5*time.Second, "the stalled connections to be released", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return srv.perHost["127.0.0.1"] == 0
	})
	cl := newClient(t, baseConfig(t, "cli"))
	if _, err := cl.Connect(testCtx(t, 10*time.Second), addr); err != nil {
		t.Fatalf("a real peer after the stalled ones closed: %v", err)
	}
}

// TestPreAuthTotal: the listener holds at most MaxUnauthenticated
// unauthenticated connections; the next waits in the backlog, unread,
// until one of them ends.
func TestPreAuthTotal(t *testing.T) {
	cfg := baseConfig(t, "n1")
	cfg.MaxUnauthenticated = 3
	cfg.MaxUnauthenticatedPerHost = 100
	srv := startServer(t, cfg, newMemSource())
	addr := srv.Addr().String()
	var held []*rawConn
	for range 3 {
		held = append(held, stall(t, addr))
	}
	waitFor(t, 5*time.Second, "3 connections held", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return len(srv.conns) == 3
	})
	next := rawDial(t, addr)
	next.send(THello, 0, &Hello{Protocol: Version, Job: "77", Method: "secret", Nonce: make([]byte, nonceSize)})
	next.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if f, err := Decode(next); err == nil {
		t.Fatalf("the fourth connection was served (%s) while 3 were unauthenticated", f.Type)
	}
	held[0].Close()
	next.SetReadDeadline(time.Now().Add(5 * time.Second))
	if f := next.recv(); f.Type != TChallenge {
		t.Fatalf("after a slot freed, the fourth got %s, want challenge", f.Type)
	}
}

// TestPreAuthDeadline: a stranger that says nothing is closed after the
// handshake timeout.
func TestPreAuthDeadline(t *testing.T) {
	cfg := baseConfig(t, "n1")
	cfg.HandshakeTimeout = 200 * time.Millisecond
	srv := startServer(t, cfg, newMemSource())
	r := rawDial(t, srv.Addr().String())
	start := time.Now()
	f, err := Decode(r) // the refusal, then EOF
	if err != nil || f.Type != TError {
		t.Fatalf("silent stranger: %v %v, want an error frame", f.Type, err)
	}
	if shut, err := closedAt(r, 5*time.Second); !shut || err != nil {
		t.Fatalf("silent stranger not closed: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("closed after %s, want about the 200 ms handshake timeout", d)
	}
}

// TestDialerSquatter: a squatter on a peer's port that answers hello with
// a huge frame is refused on its header; the dialer allocates nothing.
func TestDialerSquatter(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			nc.Write(rawHeader(TChallenge, MaxControl)) // and never the payload
			t.Cleanup(func() { nc.Close() })
		}
	}()
	cfg := baseConfig(t, "cli")
	cfg.HandshakeTimeout = 5 * time.Second
	cl := newClient(t, cfg)
	start := time.Now()
	_, err = cl.Connect(testCtx(t, 10*time.Second), ln.Addr().String())
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Connect to a squatter: %v, want ErrTooLarge", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("the dialer waited %s for the squatter's payload", d)
	}
}

// emfileChild is the environment variable that makes TestAcceptEMFILE's
// process the listener that runs out of descriptors.
const emfileChild = "REFT_PEER_EMFILE_CHILD"

// TestAcceptEMFILE: a listener whose process runs out of descriptors
// keeps listening and serves again once descriptors are free. The
// listener runs in a child process (this test binary again) that lowers
// its own RLIMIT_NOFILE and fills it; this process dials.
func TestAcceptEMFILE(t *testing.T) {
	if os.Getenv(emfileChild) != "" {
		emfileListener()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestAcceptEMFILE$", "-test.v")
	cmd.Env = append(os.Environ(), emfileChild+"=1")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	// await returns the first line of the child's that contains s.
	await := func(s string) string {
		timeout := time.After(20 * time.Second)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("the child exited before saying %q", s)
				}
				t.Logf("child: %s", l)
				if strings.Contains(l, s) {
					return l
				}
			case <-timeout:
				t.Fatalf("the child did not say %q", s)
			}
		}
	}
	addr := strings.TrimPrefix(await("ADDR "), "ADDR ")
	// The child is out of descriptors: this connection waits in the
	// backlog and its accept fails with EMFILE.
	first, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	if l := await(`"level":`); !strings.Contains(l, "peer_accept_backoff") {
		t.Fatalf("the child logged %s, want peer_accept_backoff (the listener stopped?)", l)
	}
	io.WriteString(stdin, "release\n")
	await("RELEASED")
	cl := newClient(t, baseConfig(t, "cli"))
	if node, err := cl.Connect(testCtx(t, 10*time.Second), addr); err != nil || node != "srv" {
		t.Fatalf("after descriptors came back: Connect %q, %v; want the listener serving", node, err)
	}
}

// emfileListener is TestAcceptEMFILE's child: a listener, then every
// descriptor taken until "release" on stdin.
func emfileListener() {
	cfg := Config{Job: "77", UID: 4242, Node: "srv", Bind: "127.0.0.1",
		Heartbeat: 200 * time.Millisecond, Timeout: 2 * time.Second,
		Log: zerolog.New(os.Stdout)}
	var err error
	if cfg.Auth, err = NewSecret(testSecret, 4242); err != nil {
		panic(err)
	}
	srv, err := Listen(cfg, newMemSource())
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		panic(err)
	}
	lim.Cur = 64
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		panic(err)
	}
	var fill []int
	for {
		fd, err := syscall.Open("/dev/null", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			break
		}
		fill = append(fill, fd)
	}
	fmt.Printf("ADDR %s\n", srv.Addr())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() == "release" {
			for _, fd := range fill {
				syscall.Close(fd)
			}
			fmt.Println("RELEASED")
		}
	}
}
