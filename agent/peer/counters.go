package peer

import "sync/atomic"

// Counters count one agent's peer traffic at the frame layer: frames sent
// and received by type, their bytes (headers included), and connections
// open now, on both its Server and its Client (Config.Counters, one value
// shared by the two). Every method is safe for concurrent use; a nil
// *Counters counts nothing. A frame counts once it is written whole or
// once its header has been read and checked, so a frame refused at its
// header is not received.
type Counters struct {
	sent, recv       [256]atomic.Uint64
	sentBytes, recvB atomic.Uint64
	open, opened     atomic.Int64
}

// CountersSnapshot is a copy of Counters at one moment; Sub of two gives
// the traffic between them.
type CountersSnapshot struct {
	Sent, Recv           [256]uint64 // frames by Type
	SentBytes, RecvBytes uint64
	Open                 int64 // connections open at the moment
	Opened               int64 // connections ever opened (dialed or accepted)
}

func (c *Counters) sentFrame(t Type, n int) {
	if c != nil {
		c.sent[t].Add(1)
		c.sentBytes.Add(uint64(HeaderSize + n))
	}
}

func (c *Counters) recvFrame(h Header) {
	if c != nil {
		c.recv[h.Type].Add(1)
		c.recvB.Add(uint64(HeaderSize) + uint64(h.Length))
	}
}

func (c *Counters) connOpened() {
	if c != nil {
		c.open.Add(1)
		c.opened.Add(1)
	}
}

func (c *Counters) connClosed() {
	if c != nil {
		c.open.Add(-1)
	}
}

// Snapshot copies the counters (each read atomically, not all at one
// instant: a frame in flight may show on one side of a pair only).
func (c *Counters) Snapshot() CountersSnapshot {
	var s CountersSnapshot
	if c == nil {
		return s
	}
	for i := range c.sent {
		s.Sent[i], s.Recv[i] = c.sent[i].Load(), c.recv[i].Load()
	}
	s.SentBytes, s.RecvBytes = c.sentBytes.Load(), c.recvB.Load()
	s.Open, s.Opened = c.open.Load(), c.opened.Load()
	return s
}

// Sub is the traffic from earlier to s; Open stays s's (a level, not a
// count).
func (s CountersSnapshot) Sub(earlier CountersSnapshot) CountersSnapshot {
	d := s
	for i := range d.Sent {
		d.Sent[i] -= earlier.Sent[i]
		d.Recv[i] -= earlier.Recv[i]
	}
	d.SentBytes -= earlier.SentBytes
	d.RecvBytes -= earlier.RecvBytes
	d.Opened -= earlier.Opened
	return d
}

// Frames sums sent and received frames of the types keep accepts (nil:
// every type).
func (s CountersSnapshot) Frames(keep func(Type) bool) (sent, recv uint64) {
	for i := range s.Sent {
		if keep == nil || keep(Type(i)) {
			sent += s.Sent[i]
			recv += s.Recv[i]
		}
	}
	return sent, recv
}
