package proto

// Peering is the agent's connections to the job's other agents, in a
// status reply (absent with snapshots off).
type Peering struct {
	// State is "starting" (learning the job's nodes, binding a port), "on"
	// or "off" (Reason says why; snapshots then stay node-local).
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	// Listen is this agent's peer listener, host:port.
	Listen string       `json:"listen,omitempty"`
	Peers  []PeerStatus `json:"peers,omitempty"`
}

// Peering states.
const (
	PeeringStarting = "starting"
	PeeringOn       = "on"
	PeeringOff      = "off"
)

// PeerStatus is another node of the job, as this agent sees its agent.
type PeerStatus struct {
	Node      string `json:"node"`
	Index     int    `json:"index"`          // position in the allocation's node list
	Addr      string `json:"addr,omitempty"` // its listener, host:port, once found
	Connected bool   `json:"connected"`
	// Met: connected at least once since this agent started (a spare
	// that runs no step has no agent to meet); absent from older agents.
	Met   bool   `json:"met,omitempty"`
	Error string `json:"error,omitempty"` // why it is not connected
}
