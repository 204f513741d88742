package peer

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestConfigDefaults(t *testing.T) {
	a := secretAuth(t, testSecret, 1)
	for _, tc := range []struct {
		name   string
		cfg    Config
		substr string
	}{
		{"defaults", Config{Job: "1", Auth: a}, ""},
		{"no job", Config{Auth: a}, "no job id"},
		{"no auth", Config{Job: "1"}, "no authenticator"},
		{"negative uid", Config{Job: "1", Auth: a, UID: -1}, "not a uid"},
		{"heartbeat not below timeout", Config{Job: "1", Auth: a, Heartbeat: 2 * time.Second, Timeout: time.Second}, "shorter than timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tc.cfg.withDefaults()
			if tc.substr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.substr) {
					t.Fatalf("got %v, want an error naming %q", err, tc.substr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Timeout != 2*time.Second || c.Heartbeat != 500*time.Millisecond || c.Window != 16<<20 || c.ConnsPerPeer != 1 {
				t.Fatalf("defaults %+v", c)
			}
		})
	}
}

// TestEnsureSecret: the agents of a job starting at once agree on one
// secret, 0600 in a 0700 directory; a directory or file others could
// reach or swap is refused with the fix named.
func TestEnsureSecret(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "secrets")
	path := filepath.Join(dir, "42")
	keys := make([][]byte, 16)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := EnsureSecret(path)
			if err != nil {
				t.Errorf("agent %d: %v", i, err)
				return
			}
			keys[i] = s.key
		}()
	}
	wg.Wait()
	for i, k := range keys {
		if len(k) != minSecret || !bytes.Equal(k, keys[0]) {
			t.Fatalf("agent %d got key %x, agent 0 %x", i, k, keys[0])
		}
	}
	for p, mode := range map[string]os.FileMode{dir: os.ModeDir | 0o700, path: 0o600} {
		if fi, err := os.Lstat(p); err != nil || fi.Mode() != mode {
			t.Fatalf("%s: %v %v, want %v", p, fi.Mode(), err, mode)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("temporary files left: %v", ents)
	}

	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, dir string) string // returns the secret path
		want  string
	}{
		{"open directory", func(t *testing.T, d string) string {
			os.Mkdir(filepath.Join(d, "s"), 0o755)
			os.Chmod(filepath.Join(d, "s"), 0o755)
			return filepath.Join(d, "s", "1")
		}, "chmod 700"},
		{"directory is a link", func(t *testing.T, d string) string {
			os.Mkdir(filepath.Join(d, "real"), 0o700)
			os.Symlink(filepath.Join(d, "real"), filepath.Join(d, "s"))
			return filepath.Join(d, "s", "1")
		}, "not a directory"},
		{"secret is a link", func(t *testing.T, d string) string {
			os.Mkdir(filepath.Join(d, "s"), 0o700)
			os.WriteFile(filepath.Join(d, "other"), testSecret, 0o600)
			os.Symlink(filepath.Join(d, "other"), filepath.Join(d, "s", "1"))
			return filepath.Join(d, "s", "1")
		}, "symbolic link"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.plant(t, t.TempDir())
			if _, err := EnsureSecret(p); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("EnsureSecret = %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

func TestSecretPath(t *testing.T) {
	t.Setenv("HOME", "/home/alice")
	for _, tc := range []struct{ tmpl, want, err string }{
		{"/shared/reft/%u/%j.key", "/shared/reft/1001/42.key", ""},
		{"~/.reft/secrets/%j", "/home/alice/.reft/secrets/42", ""},
		{"secrets/%j", "", "not an absolute path"},
		{"/x/%j/../../etc/%j", "/etc/42", ""},
	} {
		got, err := SecretPath(tc.tmpl, "42", 1001)
		if got != tc.want || (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("SecretPath(%q) = %q, %v; want %q, %q", tc.tmpl, got, err, tc.want, tc.err)
		}
	}
}
