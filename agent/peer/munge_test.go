//go:build e2e

// The MUNGE tests need root, munged and the test cluster's users, so they
// run in `make e2e` once the cluster is up, and fail (never skip) when any
// of that is missing.

package peer

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

const mungeSocket = "/run/munge/munge.socket.2"

// mungeAs returns a Munge that makes and reads credentials as user, and
// the user's uid.
func mungeAs(t *testing.T, name string) (*Munge, int) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Fatal("needs root, to make credentials of other users with runuser")
	}
	if _, err := os.Stat(mungeSocket); err != nil {
		t.Fatalf("munged is not running here (tests/cluster/cluster up starts it): %v", err)
	}
	for _, p := range []string{"munge", "unmunge", "runuser"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Fatalf("%s not installed (make deps)", p)
		}
	}
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatalf("test user %s missing (tests/cluster/cluster up creates it): %v", name, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	as := []string{"runuser", "-u", name, "--"}
	return &Munge{Socket: mungeSocket, MungeCmd: append(as, "munge"), UnmungeCmd: append(as, "unmunge")}, uid
}

func TestMungeSealOpen(t *testing.T) {
	alice, aliceUID := mungeAs(t, "reft-alice")
	bob, _ := mungeAs(t, "reft-bob")
	ctx := testCtx(t, 20*time.Second)
	tok, err := alice.Seal(ctx, []byte(`{"x":1}`))
	if err != nil {
		t.Fatal(err)
	}
	msg, uid, err := alice.Open(ctx, tok)
	if err != nil || uid != aliceUID || string(msg) != `{"x":1}` {
		t.Fatalf("open: %q uid %d err %v", msg, uid, err)
	}
	// munged decodes a credential once; a second decode is a replay.
	if _, _, err := alice.Open(ctx, tok); !errors.Is(err, &MungeError{Status: MungeReplayed}) {
		t.Fatalf("second decode: %v, want a replay", err)
	}
	restricted := *alice
	restricted.RestrictUID = aliceUID
	tok, err = restricted.Seal(ctx, []byte("m"))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := bob.Open(ctx, tok); !errors.Is(err, &MungeError{Status: MungeUnauthorized}) {
		t.Fatalf("bob decoding alice's restricted credential: %v", err)
	}
	for _, bad := range []string{"hello", "MUNGE:AAAA:", strings.Repeat("MUNGE:", 3)} {
		if _, _, err := alice.Open(ctx, []byte(bad)); err == nil {
			t.Errorf("token %q accepted", bad)
		}
	}
	missing := &Munge{MungeCmd: []string{"/nonexistent/munge"}}
	if _, err := missing.Seal(ctx, nil); err == nil || !strings.Contains(err.Error(), "install the munge package") {
		t.Errorf("missing munge binary: %v", err)
	}
}

// TestMungeHandshake: alice's agents accept each other; bob's credential,
// another job's credential and a listener that is really bob are refused,
// in both directions.
func TestMungeHandshake(t *testing.T) {
	alice, aliceUID := mungeAs(t, "reft-alice")
	bob, bobUID := mungeAs(t, "reft-bob")
	cfg := func(node string, a *Munge, uid int, job string, logs *syncBuffer) Config {
		c := baseConfig(t, node)
		c.Auth, c.UID, c.Job = a, uid, job
		c.HandshakeTimeout = 15 * time.Second
		if logs != nil {
			c.Log = zerolog.New(logs)
		}
		return c
	}
	restricted := *alice
	restricted.RestrictUID = aliceUID
	for _, tc := range []struct {
		name     string
		listener Config
		dialer   Config
		substr   string // "": accepted
		byDialer bool
	}{
		{name: "alice to alice", listener: cfg("l", alice, aliceUID, "100", nil), dialer: cfg("d", alice, aliceUID, "100", nil)},
		{name: "alice to alice, credentials restricted to alice", listener: cfg("l", &restricted, aliceUID, "100", nil),
			dialer: cfg("d", &restricted, aliceUID, "100", nil)},
		{name: "bob claiming alice's uid", listener: cfg("l", alice, aliceUID, "100", nil), dialer: cfg("d", bob, aliceUID, "100", nil),
			substr: "made by uid " + strconv.Itoa(bobUID)},
		{name: "bob as himself", listener: cfg("l", alice, aliceUID, "100", nil), dialer: cfg("d", bob, bobUID, "100", nil),
			substr: "made by uid " + strconv.Itoa(bobUID)},
		{name: "alice of another job", listener: cfg("l", alice, aliceUID, "100", nil), dialer: cfg("d", alice, aliceUID, "101", nil),
			substr: `job "101"`},
		{name: "listener is bob", listener: cfg("l", bob, aliceUID, "100", nil), dialer: cfg("d", alice, aliceUID, "100", nil),
			substr: "made by uid " + strconv.Itoa(bobUID), byDialer: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs syncBuffer
			tc.listener.Log = zerolog.New(&logs)
			srv := startServer(t, tc.listener, newMemSource())
			cl := newClient(t, tc.dialer)
			_, err := cl.Watermarks(testCtx(t, 30*time.Second), srv.Addr().String(), nil)
			if tc.substr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), tc.substr) {
				t.Fatalf("got %v, want a refusal naming %q", err, tc.substr)
			}
			if !tc.byDialer && !IsCode(err, CodeForbidden) {
				t.Fatalf("got %v, want forbidden from the listener", err)
			}
			inLog, _ := json.Marshal(tc.substr) // as it appears in a JSON line
			waitFor(t, 5*time.Second, "the refusal in the listener's log", func() bool {
				return strings.Contains(logs.String(), string(inLog[1:len(inLog)-1])) && strings.Contains(logs.String(), `"remote":"127.0.0.1:`)
			})
		})
	}
}

// TestMungeBindingJob: a valid alice credential whose payload names another
// job is refused even when the hello named the right one.
func TestMungeBindingJob(t *testing.T) {
	alice, aliceUID := mungeAs(t, "reft-alice")
	c := baseConfig(t, "l")
	c.Auth, c.UID, c.Job, c.HandshakeTimeout = alice, aliceUID, "100", 15*time.Second
	srv := startServer(t, c, newMemSource())
	r := rawDial(t, srv.Addr().String())
	r.handshake(alice, "100", aliceUID, func(b *Binding) { b.Job = "101" })
	r.expectRefusal(CodeForbidden, `credential is for job "101"`)
}

// TestMungeReplay: a credential recorded from a successful handshake is
// refused by munged itself when replayed on a new connection.
func TestMungeReplay(t *testing.T) {
	alice, aliceUID := mungeAs(t, "reft-alice")
	c := baseConfig(t, "l")
	c.Auth, c.UID, c.Job, c.HandshakeTimeout = alice, aliceUID, "100", 15*time.Second
	var logs syncBuffer
	c.Log = zerolog.New(&logs)
	srv := startServer(t, c, newMemSource())
	r1 := rawDial(t, srv.Addr().String())
	tok := r1.handshake(alice, "100", aliceUID, nil)
	if f := r1.recv(); f.Type != TAuthReply {
		t.Fatalf("first use: %s %s", f.Type, f.Payload)
	}
	r2 := rawDial(t, srv.Addr().String())
	n, _ := nonce()
	r2.send(THello, 0, &Hello{Protocol: Version, Job: "100", Method: "munge", Nonce: n})
	r2.recv()
	r2.send(TAuth, 0, &AuthMsg{Token: tok})
	r2.expectRefusal(CodeForbidden, "replayed credential")
	waitFor(t, 5*time.Second, "the replay in the log", func() bool { return strings.Contains(logs.String(), "replayed") })
}
