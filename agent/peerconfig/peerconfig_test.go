package peerconfig

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/agent/peer"
)

func TestFromAgentConfig(t *testing.T) {
	c, err := FromAgentConfig(config.Default(), peer.Config{Job: "1", UID: 1001})
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := c.Auth.(*peer.Munge); !ok || m.RestrictUID != 1001 || c.PortRange != [2]int{47000, 47999} ||
		c.Heartbeat != 500*time.Millisecond || c.Timeout != 2*time.Second || c.Bind != "" {
		t.Fatalf("from reft.toml defaults: %+v", c)
	}
	dir := filepath.Join(t.TempDir(), "secrets")
	if err := peer.WriteSecret(filepath.Join(dir, "42.key")); err != nil {
		t.Fatal(err)
	}
	ac := config.Default()
	ac.Agent.PeerAuth, ac.Agent.PeerSecret, ac.Agent.PeerBind = "secret", filepath.Join(dir, "%j.key"), "127.0.0.1"
	c, err = FromAgentConfig(ac, peer.Config{Job: "42", UID: os.Getuid()})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c.Auth.(*peer.Secret); !ok || c.Bind != "127.0.0.1" {
		t.Fatalf("secret config: %+v", c)
	}
	// A status tool only reads the job's secret; the job's first agent
	// makes it (issue 14, finding 7: nothing made it before).
	if _, err := FromAgentConfig(ac, peer.Config{Job: "43", UID: os.Getuid(), Role: peer.RoleStatus}); err == nil || !strings.Contains(err.Error(), "first agent creates it") {
		t.Fatalf("status tool, missing secret file: %v", err)
	}
	a, err := FromAgentConfig(ac, peer.Config{Job: "43", UID: os.Getuid()})
	if err != nil {
		t.Fatalf("the job's first agent: %v", err)
	}
	b, err := FromAgentConfig(ac, peer.Config{Job: "43", UID: os.Getuid(), Role: peer.RoleStatus})
	if err != nil {
		t.Fatalf("status tool after the agent: %v", err)
	}
	// The same secret: what the agent seals, the status tool opens.
	tok, err := a.Auth.Seal(context.Background(), []byte("hello"))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Auth.Open(context.Background(), tok); err != nil {
		t.Fatalf("the status tool read another secret than the agent made: %v", err)
	}
}
