// Package peerconfig fills agent/peer's transport configuration from
// reft.toml (agent/config): the one place the two meet, so that the
// transport does not import the configuration. The agent (agent/peering.go)
// and `reft status` (launcher/status) call it.
package peerconfig

import (
	"fmt"
	"time"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/agent/peer"
)

// FromAgentConfig fills what reft.toml governs into base (which carries
// Job, UID, Node, Log, and Role for a status tool): [agent] port_range,
// peer_bind, peer_auth and peer_secret (an agent creates the job's
// secret if it is the first of the job, see peer.EnsureSecret), and the [heartbeat] interval and timeout. With MUNGE, our
// credentials are restricted to the job's uid, so no other user's process
// can even decode them.
func FromAgentConfig(c config.Config, base peer.Config) (peer.Config, error) {
	base.PortRange = c.Agent.PortRange
	base.Bind = c.Agent.PeerBind
	base.Heartbeat = time.Duration(c.Heartbeat.Interval)
	base.Timeout = time.Duration(c.Heartbeat.Timeout)
	switch c.Agent.PeerAuth {
	case "secret":
		path, err := peer.SecretPath(c.Agent.PeerSecret, base.Job, base.UID)
		if err != nil {
			return base, fmt.Errorf("agent.peer_auth = \"secret\": %w", err)
		}
		// An agent makes the job's secret if it is the first; a status
		// tool only reads it.
		load := peer.LoadSecret
		if base.Role == "" {
			load = peer.EnsureSecret
		}
		s, err := load(path)
		if err != nil {
			return base, fmt.Errorf("agent.peer_auth = \"secret\": %w", err)
		}
		base.Auth = s
	default:
		base.Auth = &peer.Munge{RestrictUID: base.UID}
	}
	return base, nil
}
