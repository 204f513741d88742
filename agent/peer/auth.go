package peer

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Authenticator makes and checks the tokens of the handshake.
//
// Seal wraps msg in a token that proves this process's uid; Open checks a
// peer's token and returns the message and the uid that made it. The uid
// must come from the token's own proof (the MUNGE credential, or the
// secret's owner), never from msg.
type Authenticator interface {
	Method() string
	Seal(ctx context.Context, msg []byte) ([]byte, error)
	Open(ctx context.Context, token []byte) (msg []byte, uid int, err error)
}

// bindingProto is the Proto of every Binding of this version.
const bindingProto = "reft-peer/1"

const nonceSize = 32

// MaxToken bounds a token on the wire (a MUNGE credential of a small
// payload is a few hundred bytes).
const MaxToken = 16 << 10

// ErrAuth wraps every handshake refusal; errors.As(err, *Error) gives the
// code the other side sent, if it sent one.
var ErrAuth = errors.New("peer authentication failed")

func nonce() ([]byte, error) {
	n := make([]byte, nonceSize)
	if _, err := rand.Read(n); err != nil {
		return nil, fmt.Errorf("reading random nonce: %w", err)
	}
	return n, nil
}

// refusal is a handshake failure: the code and message go to the other
// side in an error frame, err to our log and caller.
type refusal struct {
	code string
	msg  string
}

func (r *refusal) Error() string { return r.code + ": " + r.msg }

func refuse(code, format string, a ...any) *refusal {
	return &refusal{code: code, msg: fmt.Sprintf(format, a...)}
}

// checkBinding verifies a peer's opened token against this connection.
func checkBinding(cfg *Config, msg []byte, uid int, dir string, dn, ln []byte) (*Binding, *refusal) {
	if uid != cfg.UID {
		return nil, refuse(CodeForbidden, "credential was made by uid %d; this job runs as uid %d", uid, cfg.UID)
	}
	var b Binding
	dec := json.NewDecoder(bytes.NewReader(msg))
	if err := dec.Decode(&b); err != nil {
		return nil, refuse(CodeForbidden, "credential payload is not a binding: %v", err)
	}
	switch {
	case b.Proto != bindingProto:
		return nil, refuse(CodeForbidden, "credential payload protocol %q, want %q", b.Proto, bindingProto)
	case b.Dir != dir:
		return nil, refuse(CodeForbidden, "credential is a %q token where a %q one was due (reflected?)", b.Dir, dir)
	case b.Job != cfg.Job:
		return nil, refuse(CodeForbidden, "credential is for job %q; this agent serves job %q", b.Job, cfg.Job)
	case b.UID != cfg.UID:
		return nil, refuse(CodeForbidden, "credential payload names uid %d; this job runs as uid %d", b.UID, cfg.UID)
	case !bytes.Equal(b.DialerNonce, dn) || !bytes.Equal(b.ListenNonce, ln):
		return nil, refuse(CodeForbidden, "credential is bound to another connection's nonces (replayed?)")
	}
	return &b, nil
}

func seal(ctx context.Context, cfg *Config, b Binding) ([]byte, error) {
	msg, err := json.Marshal(b)
	if err != nil {
		return nil, err
	}
	tok, err := cfg.Auth.Seal(ctx, msg)
	if err != nil {
		return nil, fmt.Errorf("making our %s credential: %w", cfg.Auth.Method(), err)
	}
	if len(tok) > MaxToken {
		return nil, fmt.Errorf("%s token of %d bytes exceeds %d", cfg.Auth.Method(), len(tok), MaxToken)
	}
	return tok, nil
}

// acceptHandshake runs the listener side: hello -> challenge, auth -> auth
// reply. sem bounds concurrent credential checks. On failure the returned
// refusal has already been sent to the dialer.
func acceptHandshake(cfg *Config, c *conn, sem chan struct{}) (peerNode, role string, err error) {
	deadline := time.Now().Add(cfg.HandshakeTimeout)
	c.nc.SetDeadline(deadline)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	go func() { // a server closing mid-handshake stops the credential tools
		select {
		case <-c.closed:
			cancel()
		case <-ctx.Done():
		}
	}()
	fail := func(r *refusal) (string, string, error) {
		c.writeError(0, r.code, r.msg, nil)
		return "", "", fmt.Errorf("%w: %w", ErrAuth, r)
	}
	h, r := readHello(cfg, c)
	if r != nil {
		return fail(r)
	}
	ln, err := nonce()
	if err != nil {
		return fail(refuse(CodeInternal, "%v", err))
	}
	if err := c.writeMsg(TChallenge, 0, &Challenge{Protocol: Version, Method: cfg.Auth.Method(), Nonce: ln, Node: cfg.Node}); err != nil {
		return "", "", fmt.Errorf("%w: %w", ErrAuth, err)
	}
	a, r := readAuth(c)
	if r != nil {
		return fail(r)
	}
	b, r := openDialer(ctx, cfg, sem, a.Token, h.Nonce, ln)
	if r != nil {
		return fail(r)
	}
	tok, err := seal(ctx, cfg, Binding{Proto: bindingProto, Dir: "listener", Job: cfg.Job, UID: cfg.UID, DialerNonce: h.Nonce, ListenNonce: ln, Node: cfg.Node})
	if err != nil {
		return fail(refuse(CodeInternal, "%v", err))
	}
	if err := c.writeMsg(TAuthReply, 0, &AuthMsg{Token: tok}); err != nil {
		return "", "", fmt.Errorf("%w: %w", ErrAuth, err)
	}
	c.live()
	return b.Node, b.Role, nil
}

// readHello reads and checks the dialer's hello: this protocol version,
// this job, this authentication method, a nonce of the right size.
func readHello(cfg *Config, c *conn) (Hello, *refusal) {
	var h Hello
	f, err := c.readHandshake(THello)
	if err != nil {
		switch {
		case errors.Is(err, ErrVersion):
			return h, refuse(CodeVersion, "this agent speaks peer protocol %d", Version)
		case errors.Is(err, errUnexpected):
			return h, refuse(CodeForbidden, "%s frame before authentication; a connection starts with hello", f.Type)
		}
		return h, refuse(CodeMalformed, "reading hello: %v", err)
	}
	if err := unmarshal(f, &h); err != nil {
		return h, refuse(CodeMalformed, "%v", err)
	}
	switch {
	case h.Protocol != Version:
		return h, refuse(CodeVersion, "dialer speaks peer protocol %d, this agent %d", h.Protocol, Version)
	case h.Job != cfg.Job:
		return h, refuse(CodeForbidden, "dialer is job %q; this agent serves job %q", h.Job, cfg.Job)
	case h.Method != cfg.Auth.Method():
		return h, refuse(CodeForbidden, "dialer authenticates with %q, this agent with %q (configure the same method on every node)", h.Method, cfg.Auth.Method())
	case len(h.Nonce) != nonceSize:
		return h, refuse(CodeMalformed, "hello nonce of %d bytes, want %d", len(h.Nonce), nonceSize)
	}
	return h, nil
}

// readAuth reads the dialer's auth message, a token of 1 to MaxToken
// bytes.
func readAuth(c *conn) (AuthMsg, *refusal) {
	var a AuthMsg
	f, err := c.readHandshake(TAuth)
	if err != nil {
		if errors.Is(err, errUnexpected) {
			return a, refuse(CodeForbidden, "%s frame where auth was due", f.Type)
		}
		return a, refuse(CodeMalformed, "reading auth: %v", err)
	}
	if err := unmarshal(f, &a); err != nil {
		return a, refuse(CodeMalformed, "%v", err)
	}
	if len(a.Token) == 0 || len(a.Token) > MaxToken {
		return a, refuse(CodeMalformed, "token of %d bytes (want 1 to %d)", len(a.Token), MaxToken)
	}
	return a, nil
}

// openDialer opens the dialer's token (one credential check at a time per
// slot of sem, none after ctx ends) and checks its binding to both nonces
// and its role.
func openDialer(ctx context.Context, cfg *Config, sem chan struct{}, token, dialerNonce, listenNonce []byte) (*Binding, *refusal) {
	select {
	case sem <- struct{}{}:
	case <-ctx.Done():
		return nil, refuse(CodeBusy, "too many handshakes in progress")
	}
	msg, uid, err := cfg.Auth.Open(ctx, token)
	<-sem
	if err != nil {
		return nil, refuse(CodeForbidden, "credential refused: %v", err)
	}
	b, r := checkBinding(cfg, msg, uid, "dialer", dialerNonce, listenNonce)
	if r != nil {
		return b, r
	}
	if b.Role != "" && b.Role != RoleStatus {
		return b, refuse(CodeForbidden, "dialer role %q; this agent knows agents and %q", b.Role, RoleStatus)
	}
	return b, nil
}

// dialHandshake runs the dialer side. The listener is authenticated as
// strictly as the dialer: same job, same uid, bound to both nonces.
func dialHandshake(ctx context.Context, cfg *Config, c *conn) (peerNode string, err error) {
	deadline := time.Now().Add(cfg.HandshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	c.nc.SetDeadline(deadline)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	fail := func(r *refusal) (string, error) {
		c.writeError(0, r.code, r.msg, nil)
		return "", fmt.Errorf("%w: %w", ErrAuth, r)
	}
	dn, err := nonce()
	if err != nil {
		return "", err
	}
	if err := c.writeMsg(THello, 0, &Hello{Protocol: Version, Job: cfg.Job, Method: cfg.Auth.Method(), Nonce: dn, Node: cfg.Node}); err != nil {
		return "", err
	}
	var ch Challenge
	if err := expectFrame(c, TChallenge, &ch); err != nil {
		return "", err
	}
	if r := checkChallenge(cfg, ch); r != nil {
		return fail(r)
	}
	tok, err := seal(ctx, cfg, Binding{Proto: bindingProto, Dir: "dialer", Job: cfg.Job, UID: cfg.UID, DialerNonce: dn, ListenNonce: ch.Nonce, Node: cfg.Node, Role: cfg.Role})
	if err != nil {
		return "", err
	}
	if err := c.writeMsg(TAuth, 0, &AuthMsg{Token: tok}); err != nil {
		return "", err
	}
	var a AuthMsg
	if err := expectFrame(c, TAuthReply, &a); err != nil {
		return "", err
	}
	if len(a.Token) == 0 || len(a.Token) > MaxToken {
		return fail(refuse(CodeMalformed, "token of %d bytes (want 1 to %d)", len(a.Token), MaxToken))
	}
	msg, uid, err := cfg.Auth.Open(ctx, a.Token)
	if err != nil {
		return fail(refuse(CodeForbidden, "listener's credential refused: %v", err))
	}
	b, r := checkBinding(cfg, msg, uid, "listener", dn, ch.Nonce)
	if r != nil {
		return fail(r)
	}
	c.live()
	return b.Node, nil
}

// expectFrame reads the next handshake frame, of type t, into v; an
// error frame from the listener is its refusal and is returned as *Error.
func expectFrame(c *conn, t Type, v any) error {
	// A squatter on the peer's port gets no more of our memory than a
	// stranger gets of a listener's: small frames of the due type.
	f, err := c.readHandshake(t, TError)
	if errors.Is(err, errUnexpected) {
		return fmt.Errorf("%w: %s frame where %s was due", ErrAuth, f.Type, t)
	}
	if err != nil {
		return fmt.Errorf("reading %s: %w", t, err)
	}
	if f.Type == TError {
		e := &Error{}
		if err := unmarshal(f, e); err != nil {
			return err
		}
		return fmt.Errorf("%w: listener refused us: %w", ErrAuth, e)
	}
	if f.Type != t {
		return fmt.Errorf("%w: %s frame where %s was due", ErrAuth, f.Type, t)
	}
	return unmarshal(f, v)
}

// checkChallenge: the listener speaks this protocol version and method,
// with a nonce of the right size.
func checkChallenge(cfg *Config, ch Challenge) *refusal {
	switch {
	case ch.Protocol != Version:
		return refuse(CodeVersion, "listener speaks peer protocol %d, this agent %d", ch.Protocol, Version)
	case ch.Method != cfg.Auth.Method():
		return refuse(CodeForbidden, "listener authenticates with %q, this agent with %q", ch.Method, cfg.Auth.Method())
	case len(ch.Nonce) != nonceSize:
		return refuse(CodeMalformed, "challenge nonce of %d bytes, want %d", len(ch.Nonce), nonceSize)
	}
	return nil
}
