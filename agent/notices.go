package agent

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/detect"
	"github.com/reft-hpc/reft/agent/metrics"
	"github.com/reft-hpc/reft/agent/proto"
)

// noticeQueue bounds the notices waiting for one slow client; a client that
// lets this many pile up is not reading, and later ones are dropped (logged).
const noticeQueue = 64

// notifier is the agent's side of peer failures: the local clients that
// watch notices and the failed nodes already told (the ranks' JIT flush),
// the failure hooks, and the nodes whose loss was published (the status
// reply's lost_nodes). NotifyPeerFailure, PeerRecovered, peerLost,
// peerFailed and lostNodes are safe from any goroutine (the mesh's, the
// detector's); watch and unwatch run on the watching connection's
// goroutine; OnPeerFailure and noticeFailures only before the agent
// serves. peerFailed runs the hooks on its caller's goroutine, in order;
// a hook must not block, and nothing here blocks on a client (each
// watcher has its own writer).
type notifier struct {
	log zerolog.Logger
	met *metrics.Recorder // the failure metrics; nil: none

	mu       sync.Mutex
	watchers map[*watcher]struct{}
	failed   map[string]time.Time // nodes notified, until they recover

	hooks []func(detect.Failure)
	// lost: the nodes whose loss the detector published, in the order
	// learned.
	lostMu sync.Mutex
	lost   []string
	// flushOnLost: no detector runs (detect.enabled = false, or it could
	// not start), so a lost peer connection is the JIT flush's failure
	// signal after all; said once, in the detect_off event.
	flushOnLost atomic.Bool
}

func newNotifier(log zerolog.Logger, met *metrics.Recorder) *notifier {
	return &notifier{log: log, met: met, watchers: map[*watcher]struct{}{}, failed: map[string]time.Time{}}
}

// watcher is a connection that sent watch: the agent pushes notices on it
// (docs/PROTOCOL.md, "Notices") from its own goroutine, so a notifier never
// waits on a client. A frame is one Write, and the Go runtime serializes
// Writes on a conn, so notices never interleave with the replies of the
// connection's own requests.
type watcher struct {
	c   net.Conn
	out chan proto.Notice
}

// watch subscribes the connection to notices. The watcher is listed
// before the reply goes out and starts writing after it, so no notice
// precedes the reply and none between the two is lost.
func (s *notifier) watch(c net.Conn, rc *rankConn, f proto.Frame, log zerolog.Logger) error {
	if rc.watch != nil {
		return proto.WriteMsg(c, proto.TWatch|proto.ReplyBit, f.ID, proto.WatchReply{Kinds: noticeKinds})
	}
	w := &watcher{c: c, out: make(chan proto.Notice, noticeQueue)}
	s.mu.Lock()
	s.watchers[w] = struct{}{}
	s.mu.Unlock()
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
func (s *notifier) unwatch(rc *rankConn) {
	if rc.watch == nil {
		return
	}
	s.mu.Lock()
	delete(s.watchers, rc.watch)
	close(rc.watch.out)
	s.mu.Unlock()
	rc.watch = nil
}

// NotifyPeerFailure tells every local client that watches notices that
// node failed (cause: one line, how it was learned), so that ranks holding
// consistent state newer than their last committed generation save it at
// once (JIT flush, docs/ARCHITECTURE.md). A node is notified once per
// failure: repeated calls (several detectors, a flapping connection) are
// ignored until PeerRecovered(node).
func (s *notifier) NotifyPeerFailure(node, cause string) {
	now := time.Now()
	n := proto.Notice{Kind: proto.NoticePeerFailure, Node: node, Cause: cause, Time: now.UTC().Format(time.RFC3339Nano)}
	s.mu.Lock()
	if _, dup := s.failed[node]; dup {
		s.mu.Unlock()
		s.log.Debug().Str("peer_node", node).Str("cause", cause).Msg("peer failure already notified")
		return
	}
	s.failed[node] = now
	sent, dropped := 0, 0
	for w := range s.watchers {
		select {
		case w.out <- n:
			sent++
		default:
			dropped++
		}
	}
	s.mu.Unlock()
	ev := s.log.Info()
	if dropped > 0 {
		ev = s.log.Warn().Int("dropped", dropped)
	}
	ev.Str("event", "peer_failure_notice").Str("peer_node", node).Str("cause", cause).Int("clients", sent).
		Msgf("node %s failed: notified %d local client(s) for a JIT flush", node, sent)
}

// NotifyPeerFailure tells the agent's watching clients that node failed,
// as its detector does for a published verdict (notifier.NotifyPeerFailure
// says how); for programs that embed the agent without a mesh (the
// conformance agent's JIT flush tests).
func (s *Server) NotifyPeerFailure(node, cause string) { s.notes.NotifyPeerFailure(node, cause) }

// PeerRecovered ends node's failure (its agent is reachable again): a later
// NotifyPeerFailure for it notifies anew.
func (s *notifier) PeerRecovered(node string) {
	s.mu.Lock()
	delete(s.failed, node)
	s.mu.Unlock()
}
