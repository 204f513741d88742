package peer

import (
	"fmt"
	"time"

	"github.com/rs/zerolog"
)

// Config is shared by a Server and a Client of one agent.
type Config struct {
	// Job is the Slurm job id. Peers of another job are refused.
	Job string
	// UID is the job's uid. A peer is accepted only if its credential was
	// made by this uid (agents run as the job's user, so normally
	// os.Getuid()).
	UID int
	// Node names this agent in handshakes and logs.
	Node string
	// Auth proves who we are and checks who the peer is: *Munge or *Secret.
	Auth Authenticator
	// Role is a dialer's role, sealed in its binding: "" (an agent) or
	// RoleStatus (a tool of the job's user that asks only for status).
	Role string
	// Status, on a Server, answers status requests: the agent's status
	// reply, marshalled as JSON. nil: status requests get not_found.
	Status func() any

	// Bind is the listener's address ("" or "0.0.0.0": every interface).
	Bind string
	// PortRange is the inclusive range the listener tries in order,
	// skipping ports in use ([agent] port_range). [0, 0]: any free port.
	PortRange [2]int
	// Ports, if set, are the only ports the listener tries, in order,
	// instead of PortRange (agent/mesh: this node's candidates).
	Ports []int

	DialTimeout      time.Duration // TCP connect; 0: 5 s
	HandshakeTimeout time.Duration // hello to auth reply, credential tools included; 0: 10 s
	// Heartbeat is the ping interval on an idle connection; 0: 500 ms.
	Heartbeat time.Duration
	// Timeout declares a connection dead when nothing arrived for this
	// long, heartbeats included; 0: 2 s. With the defaults a dead peer is
	// noticed in 1.5 to 2 s, inside the 2 s failure-detection budget. A
	// foreground fetch request that gets no chunk for this long, with its
	// window open and no chunk bytes on its connection, is stalled.
	Timeout time.Duration

	// Window is the default bytes a fetch may have in flight; 0: 16 MiB.
	Window int64
	// ConnsPerPeer is how many connections a Client keeps to one peer and
	// spreads a large fetch over; 0: 1.
	ConnsPerPeer int
	// MaxStreams caps the fetches a Server streams at once, over all
	// connections; beyond it a fetch gets `busy`. 0: 64.
	MaxStreams int
	// MaxHandshakes caps concurrent handshakes on a Server, so that
	// strangers cannot make it run credential tools without bound. 0: 8.
	MaxHandshakes int
	// MaxUnauthenticated caps the connections a Server holds before they
	// authenticate; when they are all taken it stops accepting (new ones
	// wait in the kernel's backlog) until a handshake ends. 0: 64.
	MaxUnauthenticated int
	// MaxUnauthenticatedPerHost caps those of one remote address; beyond
	// it a new connection from that address is closed at once. An agent
	// dials a peer with ConnsPerPeer connections. 0: 8.
	MaxUnauthenticatedPerHost int
	// Background, if set, rate-limits fetches flagged background (on the
	// Server, before each chunk is sent; on the Client, before credit is
	// returned). Foreground fetches (restores) are never limited.
	Background *Limiter
	// Replicate, if set, takes the replicate requests of peers (from is
	// the authenticated peer node); it must return at once. Without it a
	// replicate request is answered unknown_type.
	Replicate func(from string, req ReplicateRequest) error

	// Counters, if set, counts this agent's frames and connections, on
	// its Server and its Client alike (give both the same value); nil
	// counts nothing.
	Counters *Counters

	Log zerolog.Logger
}

func (c Config) withDefaults() (Config, error) {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.DialTimeout, 5*time.Second)
	def(&c.HandshakeTimeout, 10*time.Second)
	def(&c.Heartbeat, 500*time.Millisecond)
	def(&c.Timeout, 2*time.Second)
	if c.Window <= 0 {
		c.Window = 16 << 20
	}
	if c.ConnsPerPeer <= 0 {
		c.ConnsPerPeer = 1
	}
	if c.MaxStreams <= 0 {
		c.MaxStreams = 64
	}
	if c.MaxHandshakes <= 0 {
		c.MaxHandshakes = 8
	}
	if c.MaxUnauthenticated <= 0 {
		c.MaxUnauthenticated = 64
	}
	if c.MaxUnauthenticatedPerHost <= 0 {
		c.MaxUnauthenticatedPerHost = 8
	}
	switch {
	case c.Job == "":
		return c, fmt.Errorf("peer: no job id configured (the agent passes SLURM_JOB_ID)")
	case c.Auth == nil:
		return c, fmt.Errorf("peer: no authenticator configured (use peer.Munge, or peer.LoadSecret for a per-job secret file)")
	case c.UID < 0:
		return c, fmt.Errorf("peer: uid %d is not a uid", c.UID)
	case c.Heartbeat >= c.Timeout:
		return c, fmt.Errorf("peer: heartbeat %s must be shorter than timeout %s (see [heartbeat] in reft.toml)", c.Heartbeat, c.Timeout)
	}
	return c, nil
}
