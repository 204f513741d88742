package agent

import (
	"net"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/proto"
)

// noticeQueue bounds the notices waiting for one slow client; a client that
// lets this many pile up is not reading, and later ones are dropped (logged).
const noticeQueue = 64

// watcher is a connection that sent watch: the agent pushes notices on it
// (docs/PROTOCOL.md, "Notices") from its own goroutine, so a notifier never
// waits on a client. A frame is one Write, and the Go runtime serializes
// Writes on a conn, so notices never interleave with the replies of the
// connection's own requests.
type watcher struct {
	c   net.Conn
	out chan proto.Notice
}

// handleWatch subscribes the connection to notices. The watcher is listed
// before the reply goes out and starts writing after it, so no notice
// precedes the reply and none between the two is lost.
func (s *Server) handleWatch(c net.Conn, rc *rankConn, f proto.Frame, log zerolog.Logger) error {
	if rc.watch != nil {
		return proto.WriteMsg(c, proto.TWatch|proto.ReplyBit, f.ID, proto.WatchReply{Kinds: noticeKinds})
	}
	w := &watcher{c: c, out: make(chan proto.Notice, noticeQueue)}
	s.noticeMu.Lock()
	s.watchers[w] = struct{}{}
	s.noticeMu.Unlock()
	rc.watch = w
	if err := proto.WriteMsg(c, proto.TWatch|proto.ReplyBit, f.ID, proto.WatchReply{Kinds: noticeKinds}); err != nil {
		return err
	}
	log.Debug().Msg("client watches notices")
	go func() {
		for n := range w.out {
			if err := proto.WriteMsg(c, proto.TNotice, 0, n); err != nil {
				log.Debug().Err(err).Str("kind", n.Kind).Msg("writing a notice failed; the connection is closing")
				for range w.out { // drain until unwatch closes it
				}
				return
			}
		}
	}()
	return nil
}

var noticeKinds = []string{proto.NoticePeerFailure}

// unwatch ends a connection's subscription (the connection is closing).
func (s *Server) unwatch(rc *rankConn) {
	if rc.watch == nil {
		return
	}
	s.noticeMu.Lock()
	delete(s.watchers, rc.watch)
	close(rc.watch.out)
	s.noticeMu.Unlock()
	rc.watch = nil
}

// NotifyPeerFailure tells every local client that watches notices that
// node failed (cause: one line, how it was learned), so that ranks holding
// consistent state newer than their last committed generation save it at
// once (JIT flush, docs/ARCHITECTURE.md). A node is notified once per
// failure: repeated calls (several detectors, a flapping connection) are
// ignored until PeerRecovered(node).
func (s *Server) NotifyPeerFailure(node, cause string) {
	now := time.Now()
	n := proto.Notice{Kind: proto.NoticePeerFailure, Node: node, Cause: cause, Time: now.UTC().Format(time.RFC3339Nano)}
	s.noticeMu.Lock()
	if _, dup := s.failedPeers[node]; dup {
		s.noticeMu.Unlock()
		s.log.Debug().Str("peer_node", node).Str("cause", cause).Msg("peer failure already notified")
		return
	}
	s.failedPeers[node] = now
	sent, dropped := 0, 0
	for w := range s.watchers {
		select {
		case w.out <- n:
			sent++
		default:
			dropped++
		}
	}
	s.noticeMu.Unlock()
	ev := s.log.Info()
	if dropped > 0 {
		ev = s.log.Warn().Int("dropped", dropped)
	}
	ev.Str("event", "peer_failure_notice").Str("peer_node", node).Str("cause", cause).Int("clients", sent).
		Msgf("node %s failed: notified %d local client(s) for a JIT flush", node, sent)
}

// PeerRecovered ends node's failure (its agent is reachable again): a later
// NotifyPeerFailure for it notifies anew.
func (s *Server) PeerRecovered(node string) {
	s.noticeMu.Lock()
	delete(s.failedPeers, node)
	s.noticeMu.Unlock()
}
