package peer

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reft-hpc/reft/agent/config"
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

func TestFromAgentConfig(t *testing.T) {
	c, err := FromAgentConfig(config.Default(), Config{Job: "1", UID: 1001})
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := c.Auth.(*Munge); !ok || m.RestrictUID != 1001 || c.PortRange != [2]int{47000, 47999} ||
		c.Heartbeat != 500*time.Millisecond || c.Timeout != 2*time.Second || c.Bind != "" {
		t.Fatalf("from reft.toml defaults: %+v", c)
	}
	dir := t.TempDir()
	if err := WriteSecret(filepath.Join(dir, "42.key")); err != nil {
		t.Fatal(err)
	}
	ac := config.Default()
	ac.Agent.PeerAuth, ac.Agent.PeerSecret, ac.Agent.PeerBind = "secret", filepath.Join(dir, "%j.key"), "127.0.0.1"
	c, err = FromAgentConfig(ac, Config{Job: "42", UID: os.Getuid()})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c.Auth.(*Secret); !ok || c.Bind != "127.0.0.1" {
		t.Fatalf("secret config: %+v", c)
	}
	if _, err := FromAgentConfig(ac, Config{Job: "43"}); err == nil || !strings.Contains(err.Error(), "peer_auth") {
		t.Fatalf("missing secret file: %v", err)
	}
}
