package peer

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os/exec"
	"strconv"
	"strings"
)

// Munge authenticates with MUNGE credentials through the `munge` and
// `unmunge` programs (Debian package munge), so the agent stays free of
// cgo and of munged's private socket protocol. A handshake runs each
// program once on each side, a few milliseconds, paid once per connection.
//
// munged puts the encoding process's uid into the credential, encrypted and
// MACed with the cluster key, and refuses to decode a credential twice
// (EMUNGE_CRED_REPLAYED), so a credential proves "a process of uid U on a
// node of this cluster made this payload, once". Replays across nodes,
// which munged's per-node cache cannot see, are stopped by the nonces in
// the payload.
type Munge struct {
	// Socket is munged's socket; "": the programs' default.
	Socket string
	// MungeCmd and UnmungeCmd are the programs and leading arguments;
	// nil: {"munge"} and {"unmunge"}. Tests prefix `runuser -u USER --`.
	MungeCmd   []string
	UnmungeCmd []string
	// RestrictUID, if not 0, makes our credentials decodable only by that
	// uid (munge -u): a process of another user cannot even read them.
	RestrictUID int
	// TTL is the credential lifetime in seconds; 0: munged's default (300).
	TTL int
}

// Method implements Authenticator.
func (m *Munge) Method() string { return "munge" }

func (m *Munge) cmd(ctx context.Context, base []string, def string, extra ...string) *exec.Cmd {
	if len(base) == 0 {
		base = []string{def}
	}
	args := append([]string{}, base[1:]...)
	if m.Socket != "" {
		args = append(args, "--socket="+m.Socket)
	}
	return exec.CommandContext(ctx, base[0], append(args, extra...)...)
}

// Seal implements Authenticator: the credential is munge's output for msg.
func (m *Munge) Seal(ctx context.Context, msg []byte) ([]byte, error) {
	var extra []string
	if m.RestrictUID != 0 {
		extra = append(extra, "--restrict-uid="+strconv.Itoa(m.RestrictUID))
	}
	if m.TTL != 0 {
		extra = append(extra, "--ttl="+strconv.Itoa(m.TTL))
	}
	cmd := m.cmd(ctx, m.MungeCmd, "munge", extra...)
	cmd.Stdin = bytes.NewReader(msg)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return nil, mungeErr("munge", cmd, err, stderr.String())
	}
	cred := bytes.TrimSpace(out.Bytes())
	if !bytes.HasPrefix(cred, []byte("MUNGE:")) {
		return nil, fmt.Errorf("munge printed no credential (got %q)", truncate(cred, 40))
	}
	return cred, nil
}

// Open implements Authenticator: unmunge decodes the credential; the uid is
// the one munged recorded, not anything in the payload.
func (m *Munge) Open(ctx context.Context, token []byte) ([]byte, int, error) {
	if !bytes.HasPrefix(token, []byte("MUNGE:")) {
		return nil, 0, fmt.Errorf("%w: token is not a MUNGE credential", &MungeError{Status: 8})
	}
	cmd := m.cmd(ctx, m.UnmungeCmd, "unmunge", "--numeric", "--keys=STATUS,UID,GID,LENGTH")
	cmd.Stdin = bytes.NewReader(token)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	runErr := cmd.Run()
	meta, payload, perr := parseUnmunge(out.Bytes())
	if runErr != nil {
		var ee *exec.ExitError
		if errors.As(runErr, &ee) && ee.ExitCode() > 0 {
			return nil, 0, &MungeError{Status: ee.ExitCode(), Detail: strings.TrimSpace(stderr.String())}
		}
		return nil, 0, mungeErr("unmunge", cmd, runErr, stderr.String())
	}
	if perr != nil {
		return nil, 0, fmt.Errorf("unmunge output: %w", perr)
	}
	if st := meta["STATUS"]; st != "0" {
		s, _ := strconv.Atoi(st)
		return nil, 0, &MungeError{Status: s, Detail: strings.TrimSpace(stderr.String())}
	}
	uid, err := strconv.Atoi(meta["UID"])
	if err != nil {
		return nil, 0, fmt.Errorf("unmunge output: UID %q: %w", meta["UID"], err)
	}
	if n, err := strconv.Atoi(meta["LENGTH"]); err != nil || n != len(payload) {
		return nil, 0, fmt.Errorf("unmunge output: LENGTH %q but %d payload bytes", meta["LENGTH"], len(payload))
	}
	return payload, uid, nil
}

// parseUnmunge splits unmunge's output: "KEY: value" lines, an empty line,
// then the payload verbatim.
func parseUnmunge(out []byte) (map[string]string, []byte, error) {
	head, payload, ok := bytes.Cut(out, []byte("\n\n"))
	if !ok {
		return nil, nil, fmt.Errorf("no metadata/payload separator in %q", truncate(out, 80))
	}
	meta := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(head))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok {
			meta[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return meta, payload, nil
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

func mungeErr(prog string, cmd *exec.Cmd, err error, stderr string) error {
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: %w (install the munge package on every node, or configure the secret method)", prog, err)
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() > 0 {
		return fmt.Errorf("%s: %w", prog, &MungeError{Status: ee.ExitCode(), Detail: strings.TrimSpace(stderr)})
	}
	return fmt.Errorf("running %s: %w: %s", cmd, err, strings.TrimSpace(stderr))
}

// MUNGE error statuses the handshake distinguishes (munge.h).
const (
	MungeSocket       = 6  // munged not reachable
	MungeBadCred      = 8  // not a credential
	MungeCredInvalid  = 14 // another cluster's key, or damaged
	MungeExpired      = 15 // older than its TTL
	MungeRewound      = 16 // clock skew between nodes
	MungeReplayed     = 17 // decoded before: a replay
	MungeUnauthorized = 18 // restricted to another uid or gid
)

// MungeError is a failed munge or unmunge, by status.
type MungeError struct {
	Status int
	Detail string // the program's stderr
}

func (e *MungeError) Error() string {
	s := fmt.Sprintf("munge status %d", e.Status)
	switch e.Status {
	case MungeSocket:
		s += ": cannot reach munged (is it running? check munge.socket / `munge -n | unmunge`)"
	case MungeBadCred:
		s += ": not a valid credential"
	case MungeCredInvalid:
		s += ": invalid credential (made with another munge key? every node needs the same /etc/munge/munge.key)"
	case MungeExpired:
		s += ": credential expired (clock skew or a stalled peer)"
	case MungeRewound:
		s += ": credential from the future (node clocks disagree; run NTP)"
	case MungeReplayed:
		s += ": replayed credential (it was decoded before)"
	case MungeUnauthorized:
		s += ": credential restricted to another user"
	}
	if e.Detail != "" {
		s += " [" + e.Detail + "]"
	}
	return s
}

// Is matches another *MungeError by status, so that
// errors.Is(err, &MungeError{Status: MungeReplayed}) works.
func (e *MungeError) Is(target error) bool {
	t, ok := target.(*MungeError)
	return ok && t.Status == e.Status
}
