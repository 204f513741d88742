package mesh

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/peer"
	"github.com/reft-hpc/reft/tmpfs"
)

func TestCandidates(t *testing.T) {
	const lo, hi = 47000, 47999
	// A fixed vector: other implementations must agree with it
	// (docs/PEER_PROTOCOL.md, "Finding peers").
	if got, want := Candidates("1234", lo, hi, 1, 4), []int{47662, 47666, 47670, 47674, 47678, 47682, 47686, 47690}; !equal(got, want) {
		t.Fatalf("Candidates(1234, node 1 of 4) = %v, want %v", got, want)
	}
	for _, n := range []int{1, 2, 5, 125} {
		seen := map[int]int{}
		for i := range n {
			c := Candidates("98765", lo, hi, i, n)
			if len(c) != NumCandidates {
				t.Fatalf("n=%d node %d: %d candidates, want %d", n, i, len(c), NumCandidates)
			}
			if !equal(c, Candidates("98765", lo, hi, i, n)) {
				t.Fatalf("n=%d node %d: not deterministic", n, i)
			}
			for _, p := range c {
				if p < lo || p > hi {
					t.Fatalf("n=%d node %d: port %d outside [%d, %d]", n, i, p, lo, hi)
				}
				if j, ok := seen[p]; ok {
					t.Fatalf("n=%d: port %d is a candidate of nodes %d and %d (8n <= span must keep them apart)", n, p, j, i)
				}
				seen[p] = i
			}
		}
	}
	if equal(Candidates("1", lo, hi, 0, 4), Candidates("2", lo, hi, 0, 4)) {
		t.Error("jobs 1 and 2 share node 0's candidates: the job hash does not spread jobs")
	}
	// A range smaller than 8 ports: no duplicates, every port of it.
	if c := Candidates("5", 100, 102, 0, 1); len(c) != 3 {
		t.Errorf("span 3: candidates %v, want the 3 ports once each", c)
	}
	for _, bad := range [][4]int{{0, 10, 0, 1}, {10, 5, 0, 1}, {10, 20, 2, 2}, {10, 20, -1, 2}, {10, 20, 0, 0}} {
		if c := Candidates("5", bad[0], bad[1], bad[2], bad[3]); c != nil {
			t.Errorf("Candidates(%v) = %v, want nil", bad, c)
		}
	}
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestMeshConnects: four agents on one host find each other on their first
// candidates and each says once per peer that it connected.
func TestMeshConnects(t *testing.T) {
	const n = 4
	lo := freeRange(t, testJob, n)
	topo := topology(n)
	var agents []*agent
	for _, nd := range topo.Nodes {
		agents = append(agents, startAgent(t, topo, nd.Name, lo))
	}
	for i, a := range agents {
		waitConnected(t, a, 20*time.Second)
		if want := Candidates(testJob, lo, lo+testSpan-1, i, n)[0]; a.m.Addr().Port != want {
			t.Errorf("%s listens on %d, want its first candidate %d", a.m.Self().Name, a.m.Addr().Port, want)
		}
		if l := a.log.Events("peer_listening"); len(l) != 1 || l[0]["port"] != float64(a.m.Addr().Port) {
			t.Errorf("%s: peer_listening events %v, want one with port %d", a.m.Self().Name, l, a.m.Addr().Port)
		}
	}
	for _, a := range agents {
		got := map[string]int{}
		for _, e := range a.log.Events("peer_connected") {
			got[e["peer_node"].(string)]++
		}
		for _, p := range a.m.Peers() {
			want := net.JoinHostPort("127.0.0.1", strconv.Itoa(agents[p.Node.Index].m.Addr().Port))
			if !p.Connected || p.Addr != want || p.Err != nil {
				t.Errorf("%s sees %+v, want connected at %s", a.m.Self().Name, p, want)
			}
			if got[p.Node.Name] != 1 {
				t.Errorf("%s logged peer_connected for %s %d times, want once", a.m.Self().Name, p.Node.Name, got[p.Node.Name])
			}
		}
		if len(a.m.Peers()) != n-1 {
			t.Errorf("%s lists %d peers, want %d", a.m.Self().Name, len(a.m.Peers()), n-1)
		}
	}
}

// TestMeshSkipsForeignAndStrangers: node 2's first candidate is held by
// another job's agent, node 3's first by a program that answers garbage
// and its second by one that accepts and says nothing. Those nodes'
// agents bind later candidates, the dialers skip the occupants (the
// foreign agent refuses them after authentication), and everyone connects.
func TestMeshSkipsForeignAndStrangers(t *testing.T) {
	const n = 3
	lo := freeRange(t, testJob, n)
	hi := lo + testSpan - 1
	topo := topology(n)
	c2 := Candidates(testJob, lo, hi, 1, n)
	c3 := Candidates(testJob, lo, hi, 2, n)

	fcfg := peerConfig(t, "9999", "n2", lo, zerolog.New(zerolog.NewTestWriter(t)))
	fcfg.Ports = []int{c2[0]}
	foreign, err := peer.Listen(fcfg, peer.StoreSource{Store: openStore(t, "9999")})
	if err != nil {
		t.Fatal(err)
	}
	defer foreign.Close()
	garbage := stranger(t, c3[0], func(c net.Conn) { c.Write([]byte("HTTP/1.0 400 Bad Request\r\n\r\n")); c.Close() })
	defer garbage.Close()
	silent := stranger(t, c3[1], func(c net.Conn) {}) // holds the connection open, says nothing
	defer silent.Close()

	short := func(c *Config) { c.Peer.HandshakeTimeout = time.Second }
	var agents []*agent
	for _, nd := range topo.Nodes {
		agents = append(agents, startAgent(t, topo, nd.Name, lo, short))
	}
	if p := agents[1].m.Addr().Port; p != c2[1] {
		t.Errorf("n2 listens on %d, want its second candidate %d (the first is the other job's)", p, c2[1])
	}
	if p := agents[2].m.Addr().Port; p != c3[2] {
		t.Errorf("n3 listens on %d, want its third candidate %d (the first two are strangers')", p, c3[2])
	}
	for _, a := range agents {
		waitConnected(t, a, 30*time.Second)
	}
	if foreign.Stats().Refused.Load() == 0 || foreign.Stats().Accepted.Load() != 0 {
		t.Errorf("the other job's agent refused %d and accepted %d connections; want our dialers refused, none accepted",
			foreign.Stats().Refused.Load(), foreign.Stats().Accepted.Load())
	}
	for _, a := range agents {
		for _, e := range a.log.Events("peer_connected") {
			want := map[string]float64{"n1": 0, "n2": 1, "n3": 2}[e["peer_node"].(string)]
			if e["candidate"] != want {
				t.Errorf("%s connected to %s on candidate %v, want %v", a.m.Self().Name, e["peer_node"], e["candidate"], want)
			}
		}
		// Whoever found n2 or n3 says what sat on their earlier
		// candidates, though the search succeeded.
		skipped := map[string]string{}
		for _, e := range a.log.Events("peer_candidates_skipped") {
			skipped[e["peer_node"].(string)], _ = e["error"].(string)
		}
		for node, ports := range map[string][]int{"n2": {c2[0]}, "n3": {c3[0], c3[1]}} {
			if node == a.m.Self().Name {
				continue
			}
			for _, port := range ports {
				if !strings.Contains(skipped[node], strconv.Itoa(port)+" ") {
					t.Errorf("%s: peer_candidates_skipped for %s is %q; want it to name port %d", a.m.Self().Name, node, skipped[node], port)
				}
			}
		}
		if s, ok := skipped["n1"]; ok {
			t.Errorf("%s: peer_candidates_skipped for n1 (%q), whose first candidate is its agent's", a.m.Self().Name, s)
		}
	}
}

// stranger listens on port and hands every connection to serve.
func stranger(t *testing.T, port int, serve func(net.Conn)) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				mu.Lock()
				for _, c := range conns {
					c.Close()
				}
				mu.Unlock()
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			serve(c)
		}
	}()
	return ln
}

// TestMeshAllCandidatesTaken: when every candidate of this node is in use
// the mesh does not start, and says which ports.
func TestMeshAllCandidatesTaken(t *testing.T) {
	lo := freeRange(t, testJob, 2)
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	for _, p := range Candidates(testJob, lo, lo+testSpan-1, 0, 2) {
		held = append(held, stranger(t, p, func(c net.Conn) { c.Close() }))
	}
	log := zerolog.New(zerolog.NewTestWriter(t))
	_, err := Start(context.Background(), Config{Peer: peerConfig(t, testJob, "n1", lo, log)}, topology(2), openStore(t, testJob), log)
	if err == nil || !strings.Contains(err.Error(), "all in use") || !strings.Contains(err.Error(), strconv.Itoa(Candidates(testJob, lo, lo+testSpan-1, 0, 2)[7])) {
		t.Fatalf("Start with every candidate taken: %v, want an error naming the ports", err)
	}
	_, err = Start(context.Background(), Config{Peer: peerConfig(t, testJob, "n9", lo, log)}, topology(2), openStore(t, testJob), log)
	if err == nil || !strings.Contains(err.Error(), `"n9" is not in job`) {
		t.Fatalf("Start on a node outside the topology: %v", err)
	}
}

// TestMeshFetch: node 1 reads node 3's watermarks and fetches a buffer of
// its committed generation by node name.
func TestMeshFetch(t *testing.T) {
	const n = 3
	lo := freeRange(t, testJob, n)
	topo := topology(n)
	var agents []*agent
	for _, nd := range topo.Nodes {
		agents = append(agents, startAgent(t, topo, nd.Name, lo))
	}
	bufs := []tmpfs.BufferSpec{{Name: "params", Size: 300_001}, {Name: "adam.m", Size: 1000}}
	data := map[string][]byte{}
	for i, b := range bufs {
		p := make([]byte, b.Size)
		for j := range p {
			p[j] = byte(j*7 + i)
		}
		data[b.Name] = p
	}
	k := tmpfs.Key{Rank: 5, Shard: "state"}
	o, err := agents[2].store.Begin(k, tmpfs.Spec{Step: 12, Buffers: bufs})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.CopyIn(data); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Commit(); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m := agents[0].m
	wm, err := m.Watermarks(ctx, "n3", nil)
	if err != nil {
		t.Fatal(err)
	}
	if wm.Node != "n3" || len(wm.Generations) != 1 || wm.Generations[0].Rank != 5 || wm.Generations[0].Step != 12 {
		t.Fatalf("watermarks of n3: %+v, want rank 5 step 12", wm)
	}
	if wm, err := m.Watermarks(ctx, "n2", nil); err != nil || len(wm.Generations) != 0 {
		t.Fatalf("watermarks of n2 (empty store): %+v, %v", wm, err)
	}
	w := wm.Generations[0]
	gk := peer.GenKey{Rank: w.Rank, Shard: w.Shard, Step: w.Step, Seq: w.Seq}
	info, err := m.Manifest(ctx, "n3", gk)
	if err != nil {
		t.Fatal(err)
	}
	b := info.Buffer("params")
	src, err := m.Source(ctx, "n3", peer.ChunkKey{GenKey: gk, Buffer: "params"})
	if err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, b.Size)
	st, err := m.Fetch(ctx, peer.FetchSpec{ChunkSize: info.ChunkSize, Size: b.Size, CRC: b.CRC32C, Sources: []peer.Source{src}, Dst: dst})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst, data["params"]) || st.Bytes != b.Size {
		t.Fatalf("fetched %d bytes, equal %v; want the committed %d", st.Bytes, bytes.Equal(dst, data["params"]), b.Size)
	}
	if _, err := m.Watermarks(ctx, "n7", nil); err == nil || !strings.Contains(err.Error(), "not in job") {
		t.Fatalf("watermarks of a node outside the job: %v", err)
	}
}

// TestMeshLateAndLost: a peer that starts late is found once it is up; one
// that goes away is reported lost with its cause and found again when it
// comes back; PeerFound and PeerLost are called at each (the agent's JIT
// notices hang on them).
func TestMeshLateAndLost(t *testing.T) {
	const n = 2
	lo := freeRange(t, testJob, n)
	topo := topology(n)
	var cbMu sync.Mutex
	var calls []string
	a := startAgent(t, topo, "n1", lo, func(c *Config) {
		c.PeerFound = func(node string) { cbMu.Lock(); calls = append(calls, "found "+node); cbMu.Unlock() }
		c.PeerLost = func(node string, err error) {
			cbMu.Lock()
			calls = append(calls, fmt.Sprintf("lost %s (cause given: %v)", node, err != nil))
			cbMu.Unlock()
		}
	})
	waitFor(t, 20*time.Second, "a failed search for n2", func() bool {
		p := a.m.Peers()[0]
		var ue *UnreachableError
		return errors.As(p.Err, &ue) && len(ue.Tries) == NumCandidates
	})
	p := a.m.Peers()[0]
	var ue *UnreachableError
	errors.As(p.Err, &ue)
	for _, tr := range ue.Tries {
		if tr.Kind != TryRefused {
			t.Errorf("n2 not started, port %d: %s (%v), want refused", tr.Port, tr.Kind, tr.Err)
		}
	}
	if p.Connected || len(a.log.Events("peer_unreachable")) != 1 {
		t.Errorf("before n2 starts: %+v; peer_unreachable logged %d times, want once\n%s", p, len(a.log.Events("peer_unreachable")), a.log)
	}

	b := startAgent(t, topo, "n2", lo)
	waitConnected(t, a, 20*time.Second)
	b.m.Close()
	waitFor(t, 20*time.Second, "n1 to notice n2 gone", func() bool { return !a.m.Peers()[0].Connected })
	waitFor(t, 20*time.Second, "a peer_lost event", func() bool { return len(a.log.Events("peer_lost")) == 1 })
	if e := a.log.Events("peer_lost")[0]; e["peer_node"] != "n2" || e["error"] == "" {
		t.Errorf("peer_lost event %v: want node n2 and a cause", e)
	}

	startAgent(t, topo, "n2", lo)
	waitConnected(t, a, 20*time.Second)
	if c := len(a.log.Events("peer_connected")); c != 2 {
		t.Errorf("peer_connected logged %d times over two connections, want 2", c)
	}
	cbMu.Lock()
	got := strings.Join(calls, "; ")
	cbMu.Unlock()
	if want := "found n2; lost n2 (cause given: true); found n2"; got != want {
		t.Errorf("callbacks: %q, want %q", got, want)
	}
}

func TestUnreachableErrorIsRefused(t *testing.T) {
	refused := Try{Port: 1, Kind: TryRefused, Err: syscall.ECONNREFUSED}
	for _, tc := range []struct {
		name  string
		tries []Try
		want  bool
	}{
		{"every port refused", []Try{refused, refused}, true},
		{"one port timed out", []Try{refused, {Port: 2, Kind: TryOther, Err: errors.New("i/o timeout")}}, false},
		{"another job's agent", []Try{{Port: 2, Kind: TryForeign, Err: errors.New("forbidden")}}, false},
		{"no try", nil, false},
	} {
		err := fmt.Errorf("wrapped: %w", &UnreachableError{Node: "n2", Tries: tc.tries})
		if got := errors.Is(err, syscall.ECONNREFUSED); got != tc.want {
			t.Errorf("%s: errors.Is(ECONNREFUSED) = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestMeshCallRefused: a call to a node where nothing listens on any
// candidate port ends with an error that matches ECONNREFUSED once a
// search has found so, without waiting for ctx (the detector takes it
// for an agent that is gone).
func TestMeshCallRefused(t *testing.T) {
	lo := freeRange(t, testJob, 2)
	a := startAgent(t, topology(2), "n1", lo)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var rep struct{}
	err := a.m.Call(ctx, "n2", peer.TBeat, struct{}{}, &rep)
	if !errors.Is(err, syscall.ECONNREFUSED) || ctx.Err() != nil {
		t.Fatalf("call to n2 without an agent: %v (ctx %v), want a refusal before ctx ends", err, ctx.Err())
	}
}
