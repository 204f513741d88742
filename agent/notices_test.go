package agent

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/reft-hpc/reft/agent/detect"
	"github.com/reft-hpc/reft/agent/logging/logtest"
	"github.com/reft-hpc/reft/agent/proto"
)

// TestPeerFailureNotices: a watching connection gets one notice per failed
// node (repeats ignored until the node recovers), after its watch reply and
// between its own requests' replies; a connection that never watched gets
// none and its request/reply stream is untouched.
func TestPeerFailureNotices(t *testing.T) {
	var logBuf logtest.Buffer
	s, path := startServer(t, os.Getuid(), &logBuf)
	plain, watching := dial(t, path), dial(t, path)
	if err := proto.Call(plain, proto.THello, 1, nil, nil); err != nil {
		t.Fatal(err)
	}
	var wr proto.WatchReply
	if err := proto.Call(watching, proto.TWatch, 1, nil, &wr); err != nil {
		t.Fatal(err)
	}
	if len(wr.Kinds) != 1 || wr.Kinds[0] != proto.NoticePeerFailure {
		t.Fatalf("watch reply %+v, want kinds [%s]", wr, proto.NoticePeerFailure)
	}
	// A second watch on the same connection is answered, not doubled.
	if err := proto.Call(watching, proto.TWatch, 2, nil, &wr); err != nil {
		t.Fatal(err)
	}

	s.notes.NotifyPeerFailure("n3", "peer_lost: connection reset")
	s.notes.NotifyPeerFailure("n3", "heartbeat timeout") // the same failure, from another detector
	s.notes.NotifyPeerFailure("n4", "peer_lost: EOF")
	s.notes.PeerRecovered("n3")
	s.notes.NotifyPeerFailure("n3", "peer_lost: EOF again")

	var got []string
	for range 3 {
		f, err := proto.Decode(watching)
		if err != nil {
			t.Fatalf("reading notices (got %v): %v", got, err)
		}
		var n proto.Notice
		if f.Type != proto.TNotice || f.ID != 0 || f.Unmarshal(&n) != nil {
			t.Fatalf("frame %v id %d %s, want a notice with id 0", f.Type, f.ID, f.Payload)
		}
		if n.Kind != proto.NoticePeerFailure || n.Time == "" {
			t.Errorf("notice %+v: want kind %s and a time", n, proto.NoticePeerFailure)
		}
		got = append(got, n.Node+": "+n.Cause)
	}
	if want := "n3: peer_lost: connection reset|n4: peer_lost: EOF|n3: peer_lost: EOF again"; strings.Join(got, "|") != want {
		t.Errorf("notices %q, want %q", strings.Join(got, "|"), want)
	}
	// Requests still work on the watching connection, and nothing else is
	// queued on it.
	if err := proto.Call(watching, proto.THello, 3, nil, nil); err != nil {
		t.Fatalf("hello after the notices: %v", err)
	}
	// The plain connection's next reply is its own: no notice came first.
	if err := proto.Call(plain, proto.TStatus, 2, nil, nil); err != nil {
		t.Fatalf("a connection that did not watch: %v", err)
	}
	plain.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if f, err := proto.Decode(plain); err == nil {
		t.Errorf("a connection that did not watch got a %v frame", f.Type)
	}
	if n := strings.Count(logBuf.String(), `"event":"peer_failure_notice"`); n != 3 {
		t.Errorf("%d peer_failure_notice log lines, want 3:\n%s", n, logBuf.String())
	}
	if !strings.Contains(logBuf.String(), `"clients":1`) {
		t.Errorf("the notice log lines do not count the one watching client:\n%s", logBuf.String())
	}
}

// TestDetectorVerdictNotices: a failure the detector publishes reaches the
// watching clients as a peer_failure notice naming its class and cause.
func TestDetectorVerdictNotices(t *testing.T) {
	var logBuf logtest.Buffer
	s, path := startServer(t, os.Getuid(), &logBuf)
	s.notes.noticeFailures()
	watching := dial(t, path)
	var wr proto.WatchReply
	if err := proto.Call(watching, proto.TWatch, 1, nil, &wr); err != nil {
		t.Fatal(err)
	}
	s.notes.peerFailed(detect.Failure{Node: "n2", Class: detect.ClassNode, Cause: "no beat for 1s; slurmd unreachable"})
	f, err := proto.Decode(watching)
	if err != nil {
		t.Fatal(err)
	}
	var n proto.Notice
	if f.Type != proto.TNotice || f.Unmarshal(&n) != nil || n.Node != "n2" || n.Cause != "failure_detected (node): no beat for 1s; slurmd unreachable" {
		t.Errorf("frame %v %s: want n2's node failure as a notice", f.Type, f.Payload)
	}
	// The status reply lists lost nodes (what the SPANK plugin's step-end
	// hold waits on): node verdicts, once each; not hangs or agents.
	s.notes.peerFailed(detect.Failure{Node: "n3", Class: detect.ClassHang, Cause: "no progress"})
	s.notes.peerFailed(detect.Failure{Node: "n4", Class: detect.ClassAgent, Cause: "agent gone"})
	s.notes.peerFailed(detect.Failure{Node: "n2", Class: detect.ClassNode, Cause: "again"})
	s.notes.peerFailed(detect.Failure{Node: "n5", Class: detect.ClassNode, Cause: "rack"})
	var st proto.Status
	if err := proto.Call(dial(t, path), proto.TStatus, 1, nil, &st); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(st.LostNodes, []string{"n2", "n5"}) {
		t.Errorf("status lost_nodes %v, want [n2 n5]", st.LostNodes)
	}
}
