package peer

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Secret authenticates with a per-job secret shared by the job's agents
// (HMAC-SHA256 over the binding, which carries both connection nonces, so
// a token is good for one connection only). It is the alternative for
// sites without MUNGE. Its uid claim is weaker than MUNGE's: the file must
// be private to the job's user, and whoever can read it is taken to be
// that user.
type Secret struct {
	key []byte
	uid int
}

// Secret sizes: at least 256 bits of key.
const (
	minSecret = 32
	maxSecret = 4096
)

const secretLabel = "reft-peer/1 secret\x00"

// NewSecret uses key, which must be at least 32 bytes, held by uid.
func NewSecret(key []byte, uid int) (*Secret, error) {
	if len(key) < minSecret || len(key) > maxSecret {
		return nil, fmt.Errorf("peer secret of %d bytes: want %d to %d", len(key), minSecret, maxSecret)
	}
	return &Secret{key: append([]byte(nil), key...), uid: uid}, nil
}

// The per-job secret (peer_auth = "secret") is a file of 32 random
// bytes on a filesystem every node of the job sees, in a directory of
// the job's user that nobody else can enter. The job's agents make it
// themselves: they all run as the job's user, so the first to start
// creates it (EnsureSecret: written under a temporary name, then
// hard-linked into place, which exactly one agent wins even on NFS) and
// every other agent, and `reft status`, reads that one. It never passes
// through an environment, a command line or Slurm, so no process of
// another user, and none of the job's tasks unless they read the file,
// sees it. docs/PEER_PROTOCOL.md, "Authentication".

// SecretPath expands agent.peer_secret for a job: %j is the job id, %u
// the job's uid, and a leading ~/ the home directory ($HOME).
func SecretPath(tmpl, job string, uid int) (string, error) {
	p := strings.NewReplacer("%j", job, "%u", strconv.Itoa(uid)).Replace(tmpl)
	if rest, ok := strings.CutPrefix(p, "~/"); ok {
		home := os.Getenv("HOME")
		if !filepath.IsAbs(home) {
			return "", fmt.Errorf("agent.peer_secret %q starts with ~/, but HOME is %q (use an absolute path with %%u)", tmpl, home)
		}
		p = filepath.Join(home, rest)
	}
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("agent.peer_secret %q is not an absolute path", tmpl)
	}
	return filepath.Clean(p), nil
}

// LoadSecret reads a secret file. It must be a regular file owned by the
// reading user with no group or other permissions, or it proves nothing;
// it is opened without following a link.
func LoadSecret(path string) (*Secret, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, syscall.ELOOP) {
		return nil, fmt.Errorf("peer secret %s is a symbolic link: refused (it must be the job user's own file)", path)
	}
	if err != nil {
		return nil, fmt.Errorf("peer secret: %w (the job's first agent creates it; is agent.peer_secret on a filesystem every node sees?)", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("peer secret %s: %w", path, err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.Mode().IsRegular() || !ok:
		return nil, fmt.Errorf("peer secret %s is not a regular file", path)
	case fi.Mode().Perm()&0o077 != 0:
		return nil, fmt.Errorf("peer secret %s has mode %04o: others could impersonate the job (chmod 600 it)", path, fi.Mode().Perm())
	case int(st.Uid) != os.Getuid():
		return nil, fmt.Errorf("peer secret %s belongs to uid %d, not to this agent's uid %d (another user created it: remove it)", path, st.Uid, os.Getuid())
	}
	key, err := io.ReadAll(io.LimitReader(f, maxSecret+1))
	if err != nil {
		return nil, fmt.Errorf("peer secret %s: %w", path, err)
	}
	return NewSecret(key, int(st.Uid))
}

// WriteSecret creates path (mode 0600, failing if it exists) holding 32
// random bytes, in a private directory (see EnsureSecret).
func WriteSecret(path string) error {
	created, err := createSecret(path)
	if err == nil && !created {
		err = fmt.Errorf("creating peer secret %s: %w", path, fs.ErrExist)
	}
	return err
}

// EnsureSecret makes sure the job's secret exists at path: it creates
// it unless another agent of the job did first, then loads it. The
// directory is created (0700) if missing and must be the user's own,
// closed to others: a file in a directory others can write could be
// swapped under the agent.
func EnsureSecret(path string) (*Secret, error) {
	if _, err := createSecret(path); err != nil {
		return nil, err
	}
	return LoadSecret(path)
}

// createSecret writes 32 random bytes to path unless it exists (false).
// The bytes go to a temporary file first, and link(2) puts it in place:
// it fails if path exists, atomically even on NFS, so concurrent agents
// agree on one secret and none reads a partial one.
func createSecret(path string) (bool, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, fmt.Errorf("peer secret directory: %w", err)
	}
	if err := privateDir(dir); err != nil {
		return false, err
	}
	key := make([]byte, minSecret)
	if _, err := rand.Read(key); err != nil {
		return false, fmt.Errorf("peer secret: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".secret-*")
	if err != nil {
		return false, fmt.Errorf("creating peer secret: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(key)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, fmt.Errorf("writing peer secret %s: %w", tmp.Name(), err)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return false, nil // another agent of the job was first
		}
		return false, fmt.Errorf("creating peer secret %s: %w", path, err)
	}
	return true, nil
}

// privateDir checks that dir is a directory of this uid that group and
// other can neither read nor write.
func privateDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("peer secret directory: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir() || !ok:
		return fmt.Errorf("peer secret directory %s is not a directory (a link?): refused", dir)
	case int(st.Uid) != os.Getuid():
		return fmt.Errorf("peer secret directory %s belongs to uid %d, not to this agent's uid %d: refused (another user may have created it; "+
			"point agent.peer_secret into a directory of the job's user, e.g. \"~/.reft/secrets/%%j\")", dir, st.Uid, os.Getuid())
	case fi.Mode().Perm()&0o077 != 0:
		return fmt.Errorf("peer secret directory %s has mode %04o: others could read or swap the secret (chmod 700 it)", dir, fi.Mode().Perm())
	}
	return nil
}

// Method implements Authenticator.
func (s *Secret) Method() string { return "secret" }

func (s *Secret) mac(msg []byte) []byte {
	h := hmac.New(sha256.New, s.key)
	h.Write([]byte(secretLabel))
	h.Write(msg)
	return h.Sum(nil)
}

// Seal implements Authenticator: msg followed by its MAC.
func (s *Secret) Seal(_ context.Context, msg []byte) ([]byte, error) {
	return append(append([]byte(nil), msg...), s.mac(msg)...), nil
}

// ErrBadMAC: a token was not made with this job's secret.
var ErrBadMAC = errors.New("token MAC does not match this job's secret (another job, or a stale secret file)")

// Open implements Authenticator.
func (s *Secret) Open(_ context.Context, token []byte) ([]byte, int, error) {
	if len(token) < sha256.Size {
		return nil, 0, fmt.Errorf("token of %d bytes is shorter than a MAC", len(token))
	}
	msg, mac := token[:len(token)-sha256.Size], token[len(token)-sha256.Size:]
	if !hmac.Equal(mac, s.mac(msg)) {
		return nil, 0, ErrBadMAC
	}
	return msg, s.uid, nil
}
