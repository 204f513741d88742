package peer

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
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

// LoadSecret reads a secret file. It must be a regular file owned by the
// reading user with no group or other permissions, or it proves nothing.
func LoadSecret(path string) (*Secret, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("peer secret: %w (create it with peer.WriteSecret, mode 0600)", err)
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
		return nil, fmt.Errorf("peer secret %s belongs to uid %d, not to this agent's uid %d", path, st.Uid, os.Getuid())
	}
	key, err := io.ReadAll(io.LimitReader(f, maxSecret+1))
	if err != nil {
		return nil, fmt.Errorf("peer secret %s: %w", path, err)
	}
	return NewSecret(key, int(st.Uid))
}

// WriteSecret creates path (mode 0600, failing if it exists) holding 32
// random bytes, for the launcher to make one per job.
func WriteSecret(path string) error {
	key := make([]byte, minSecret)
	if _, err := rand.Read(key); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("peer secret directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("creating peer secret: %w", err)
	}
	if _, err := f.Write(key); err != nil {
		f.Close()
		return fmt.Errorf("writing peer secret %s: %w", path, err)
	}
	return f.Close()
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
