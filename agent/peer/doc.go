// Package peer is the TCP transport between the agents of one job: they
// authenticate each other, exchange commit watermarks and manifests, and
// stream snapshot chunks out of each other's node-local stores.
// docs/PEER_PROTOCOL.md is the wire specification; this package is its Go
// implementation.
//
// A Server (Listen) binds the first free port of Config.Ports (agent/mesh:
// the node's candidates) or else of [agent] port_range, and
// serves a ChunkSource: StoreSource over the agent's *tmpfs.Store, or a
// fake in tests. A Client dials lazily and keeps Config.ConnsPerPeer
// authenticated connections per peer; many requests share one connection,
// told apart by request id.
//
// Authentication. Every connection is authenticated in both directions as
// the same job and the same uid: the dialer sends hello (job, nonce), the
// listener a challenge (its nonce), the dialer a token sealing a Binding
// (job, uid, both nonces, direction), and the listener its own token over
// the same nonces. A side accepts a token only if its Authenticator says the
// token was made by Config.UID (for MUNGE, the uid munged recorded in the
// credential, never a uid in the payload) and the binding names this job,
// this uid and this connection's nonces. Munge runs the munge/unmunge
// programs with os/exec, keeping the agent free of cgo; munged refuses to
// decode a credential twice, and the nonces stop replays on other nodes
// whose munged never saw it. Secret (per-job secret file, HMAC-SHA256) is
// the alternative for sites without MUNGE. A refused peer gets an error
// frame naming the reason, then the connection closes; the listener logs it
// with the remote address.
//
// Fetching. Client.Fetch takes a buffer's layout, candidate sources per
// chunk and a destination: Dst, where chunks land straight from the socket
// (no intermediate copy), or Deliver, a callback whose buffers are bounded
// by the window. The listener sends each chunk with the CRC-32C recorded
// when it was stored, never one computed on the way out, and the fetcher
// checks every chunk against it (and against the manifest's list if given),
// so corruption at rest or on the wire is caught end to end. Per request
// the listener keeps at most Window bytes unacknowledged; the fetcher
// returns credit as chunks are consumed, so memory is bounded and a slow
// consumer pushes back on the sender. A chunk that fails (checksum, the
// peer lacks it, the connection dies or falls silent past Config.Timeout,
// or its foreground stream stalls that long on a live connection) moves
// to its next candidate while the rest keep streaming.
//
// Neither side trusts a length, index, id or size from the other before
// checking it (docs/PEER_PROTOCOL.md, "Receiver checks"); a listener
// answers each bad request with an error frame and a log line. The fuzz
// targets FuzzDecode, FuzzHostileListener and FuzzHostileDialer drive
// the decoder, the dialer's receive path and the listener's request path.
//
// Liveness. Both ends ping an idle connection every Config.Heartbeat and
// declare it dead after Config.Timeout without a byte, so a peer whose node
// vanished (no FIN) is noticed in at most Timeout, and a paused background
// stream is not mistaken for a dead one.
//
// Background traffic. Fetches flagged Background pass through
// Config.Background, a token-bucket Limiter that the agent pauses while
// the trainer reports a communication phase; restores are never limited.
package peer
