package peer

import (
	"context"
	"encoding/json"
	"errors"
	"github.com/reft-hpc/reft/internal/crc32c"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// rawConn is a test-side connection that speaks frames by hand.
type rawConn struct {
	t *testing.T
	net.Conn
}

func rawDial(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	t.Cleanup(func() { c.Close() })
	return &rawConn{t, c}
}

func (r *rawConn) send(typ Type, id uint32, v any) {
	r.t.Helper()
	p, err := json.Marshal(v)
	if err != nil {
		r.t.Fatal(err)
	}
	b, err := AppendFrame(nil, typ, id, 0, p)
	if err != nil {
		r.t.Fatal(err)
	}
	if _, err := r.Write(b); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rawConn) recv() Frame {
	r.t.Helper()
	f, err := Decode(r)
	if err != nil {
		r.t.Fatalf("reading a frame: %v", err)
	}
	return f
}

// expectRefusal reads an error frame with code and then EOF.
func (r *rawConn) expectRefusal(code, substr string) {
	r.t.Helper()
	f := r.recv()
	var e Error
	if f.Type != TError || json.Unmarshal(f.Payload, &e) != nil || e.Code != code || !strings.Contains(e.Message, substr) {
		r.t.Fatalf("got %s %s, want error %s naming %q", f.Type, f.Payload, code, substr)
	}
	if _, err := Decode(r); !errors.Is(err, io.EOF) {
		r.t.Fatalf("after the refusal: %v, want the connection closed", err)
	}
}

// handshake runs the dialer side by hand with auth a, sealing the binding
// mod returns; it returns the token sent.
func (r *rawConn) handshake(a Authenticator, job string, uid int, mod func(*Binding)) []byte {
	r.t.Helper()
	dn, _ := nonce()
	r.send(THello, 0, &Hello{Protocol: Version, Job: job, Method: a.Method(), Nonce: dn})
	f := r.recv()
	var ch Challenge
	if f.Type != TChallenge || json.Unmarshal(f.Payload, &ch) != nil {
		r.t.Fatalf("got %s %s, want a challenge", f.Type, f.Payload)
	}
	b := Binding{Proto: bindingProto, Dir: "dialer", Job: job, UID: uid, DialerNonce: dn, ListenNonce: ch.Nonce}
	if mod != nil {
		mod(&b)
	}
	msg, _ := json.Marshal(b)
	tok, err := a.Seal(context.Background(), msg)
	if err != nil {
		r.t.Fatal(err)
	}
	r.send(TAuth, 0, &AuthMsg{Token: tok})
	return tok
}

// fakeAuth accepts every token as uid's and seals garbage: a listener
// that does not hold the job's secret but pretends to.
type fakeAuth struct{ uid int }

func (f fakeAuth) Method() string { return "secret" }
func (f fakeAuth) Seal(_ context.Context, msg []byte) ([]byte, error) {
	return append(append([]byte{}, msg...), make([]byte, 32)...), nil
}
func (f fakeAuth) Open(_ context.Context, tok []byte) ([]byte, int, error) {
	return tok[:len(tok)-32], f.uid, nil
}

func TestHandshakeSecret(t *testing.T) {
	other := []byte(strings.Repeat("another job's key, 32 bytes long", 1))
	for _, tc := range []struct {
		name     string
		listener func(*Config)
		dialer   func(*Config)
		code     string // "" : accepted
		substr   string
		byDialer bool // the dialer refuses the listener
	}{
		{name: "same job and uid"},
		{name: "other job", dialer: func(c *Config) { c.Job = "78" }, code: CodeForbidden, substr: `job "78"`},
		{name: "other secret", dialer: func(c *Config) { c.Auth = secretAuth(t, other, 4242) }, code: CodeForbidden, substr: "MAC"},
		{name: "dialer claims another uid", dialer: func(c *Config) { c.UID = 5000; c.Auth = secretAuth(t, testSecret, 5000) },
			code: CodeForbidden, substr: "uid 5000"},
		{name: "other method", listener: func(c *Config) { c.Auth = &Munge{} }, code: CodeForbidden, substr: "authenticates with"},
		{name: "listener without the secret", listener: func(c *Config) { c.Auth = fakeAuth{4242} },
			code: CodeForbidden, substr: "listener's credential refused", byDialer: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lc, dc := baseConfig(t, "listener"), baseConfig(t, "dialer")
			var logs syncBuffer
			lc.Log = zerolog.New(&logs)
			if tc.listener != nil {
				tc.listener(&lc)
			}
			if tc.dialer != nil {
				tc.dialer(&dc)
			}
			srv := startServer(t, lc, newMemSource())
			cl := newClient(t, dc)
			_, err := cl.Watermarks(testCtx(t, 5*time.Second), srv.Addr().String(), nil)
			if tc.code == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), tc.substr) {
				t.Fatalf("got %v, want an authentication error naming %q", err, tc.substr)
			}
			if !tc.byDialer && !IsCode(err, tc.code) {
				t.Fatalf("got %v, want code %s from the listener", err, tc.code)
			}
			// The listener logs the refusal (its own, or the dialer's) with
			// the dialer's address.
			want := `"event":"peer_refused"`
			if tc.byDialer {
				want = tc.substr
			}
			waitFor(t, 2*time.Second, "the refusal in the log", func() bool {
				return strings.Contains(logs.String(), want) && strings.Contains(logs.String(), `"remote":"127.0.0.1:`)
			})
			if tc.byDialer {
				return
			}
			if srv.Stats().Accepted.Load() != 0 {
				t.Fatal("the listener counted the connection as accepted")
			}
		})
	}
}

// TestUnauthenticated: a stranger gets an error frame and a closed
// connection, whatever it sends, and never any data.
func TestUnauthenticated(t *testing.T) {
	src := newMemSource()
	src.add(key1, 4096, map[string][]byte{"b": pattern(4096, "x")})
	srv := startServer(t, baseConfig(t, "n1"), src)
	addr := srv.Addr().String()
	for _, tc := range []struct {
		name   string
		do     func(r *rawConn)
		code   string
		substr string
	}{
		{"fetch before hello", func(r *rawConn) {
			r.send(TFetch, 1, &FetchRequest{ChunkKey: ChunkKey{key1, "b"}, Count: 1})
		}, CodeForbidden, "before authentication"},
		{"http", func(r *rawConn) { r.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n.....")) }, CodeMalformed, "magic"},
		{"other protocol version", func(r *rawConn) {
			b, _ := AppendFrame(nil, THello, 0, 0, []byte("{}"))
			b[4] = 9
			Header{Version: 9, Type: THello, Length: 2, CRC: crc32c.Checksum([]byte("{}"))}.Put(b)
			r.Write(b)
		}, CodeVersion, "speaks peer protocol 1"},
		{"bad nonce", func(r *rawConn) {
			r.send(THello, 0, &Hello{Protocol: Version, Job: "77", Method: "secret", Nonce: []byte{1}})
		}, CodeMalformed, "nonce"},
		{"fetch instead of auth", func(r *rawConn) {
			n, _ := nonce()
			r.send(THello, 0, &Hello{Protocol: Version, Job: "77", Method: "secret", Nonce: n})
			r.recv()
			r.send(TFetch, 1, &FetchRequest{ChunkKey: ChunkKey{key1, "b"}, Count: 1})
		}, CodeForbidden, "where auth was due"},
		{"reflected listener token", func(r *rawConn) {
			r.handshake(secretAuth(t, testSecret, 4242), "77", 4242, func(b *Binding) { b.Dir = "listener" })
		}, CodeForbidden, "reflected"},
		{"binding for another job", func(r *rawConn) {
			r.handshake(secretAuth(t, testSecret, 4242), "77", 4242, func(b *Binding) { b.Job = "78" })
		}, CodeForbidden, `credential is for job "78"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rawDial(t, addr)
			tc.do(r)
			r.expectRefusal(tc.code, tc.substr)
		})
	}
	if n := srv.Stats().Accepted.Load(); n != 0 {
		t.Fatalf("%d strangers accepted", n)
	}
}

// TestReplaySecret: a recorded dialer token is bound to its connection's
// nonces and is refused on any other.
func TestReplaySecret(t *testing.T) {
	srv := startServer(t, baseConfig(t, "n1"), newMemSource())
	a := secretAuth(t, testSecret, 4242)
	r1 := rawDial(t, srv.Addr().String())
	tok := r1.handshake(a, "77", 4242, nil)
	if f := r1.recv(); f.Type != TAuthReply {
		t.Fatalf("first use: %s %s", f.Type, f.Payload)
	}
	r2 := rawDial(t, srv.Addr().String())
	n, _ := nonce()
	r2.send(THello, 0, &Hello{Protocol: Version, Job: "77", Method: "secret", Nonce: n})
	r2.recv()
	r2.send(TAuth, 0, &AuthMsg{Token: tok})
	r2.expectRefusal(CodeForbidden, "nonces")
}

// TestAfterAuth: an authenticated connection survives an unknown frame
// type but not a corrupt frame.
func TestAfterAuth(t *testing.T) {
	srv := startServer(t, baseConfig(t, "n1"), newMemSource())
	r := rawDial(t, srv.Addr().String())
	r.handshake(secretAuth(t, testSecret, 4242), "77", 4242, nil)
	if f := r.recv(); f.Type != TAuthReply {
		t.Fatalf("%s %s", f.Type, f.Payload)
	}
	r.send(Type(0x42), 7, map[string]int{})
	for {
		f := r.recv()
		if f.Type == TPing {
			continue
		}
		if f.Type != TError || f.ID != 7 || !strings.Contains(string(f.Payload), CodeUnknownType) {
			t.Fatalf("got %s %s, want unknown_type for id 7", f.Type, f.Payload)
		}
		break
	}
	r.send(TWatermarks, 8, &WatermarksRequest{})
	for f := r.recv(); f.Type != TWatermarksReply; f = r.recv() {
		if f.Type != TPing {
			t.Fatalf("got %s, want the watermarks reply", f.Type)
		}
	}
	b, _ := AppendFrame(nil, TWatermarks, 9, 0, []byte("{}"))
	b[HeaderSize] = '[' // payload no longer matches its CRC
	r.Write(b)
	for {
		f, err := Decode(r)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if f.Type == TError && !strings.Contains(string(f.Payload), CodeMalformed) {
			t.Fatalf("got %s", f.Payload)
		}
	}
}

func TestSecretFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "job", "peer.secret")
	if err := WriteSecret(good); err != nil {
		t.Fatal(err)
	}
	if err := WriteSecret(good); err == nil {
		t.Fatal("WriteSecret overwrote an existing secret")
	}
	s, err := LoadSecret(good)
	if err != nil {
		t.Fatal(err)
	}
	if s.uid != os.Getuid() {
		t.Fatalf("uid %d", s.uid)
	}
	open := filepath.Join(dir, "open")
	os.WriteFile(open, testSecret, 0o644)
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte("tiny"), 0o600)
	for _, tc := range []struct {
		path, substr string
	}{
		{open, "chmod 600"},
		{short, "want 32"},
		{filepath.Join(dir, "missing"), "no such file"},
		{dir, "not a regular file"},
	} {
		if _, err := LoadSecret(tc.path); err == nil || !strings.Contains(err.Error(), tc.substr) {
			t.Errorf("LoadSecret(%s): %v, want an error naming %q", tc.path, err, tc.substr)
		}
	}
	tok, _ := s.Seal(context.Background(), []byte("m"))
	tok[0] ^= 1
	if _, _, err := s.Open(context.Background(), tok); !errors.Is(err, ErrBadMAC) {
		t.Fatalf("tampered token: %v", err)
	}
}

// TestIdleConnectionStaysUp: heartbeats keep an idle authenticated
// connection alive for many liveness timeouts, in both directions.
func TestIdleConnectionStaysUp(t *testing.T) {
	cfg := baseConfig(t, "n1")
	cfg.Heartbeat, cfg.Timeout = 50*time.Millisecond, 300*time.Millisecond
	srv := startServer(t, cfg, newMemSource())
	cl := newClient(t, cfg)
	ctx := testCtx(t, 10*time.Second)
	for range 3 {
		if _, err := cl.Watermarks(ctx, srv.Addr().String(), nil); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * cfg.Timeout)
	}
	if a := srv.Stats().Accepted.Load(); a != 1 {
		t.Fatalf("%d connections accepted: an idle connection was dropped", a)
	}
}
