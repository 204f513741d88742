package mesh

import (
	"bytes"
	"context"
	"math/rand/v2"
	"net"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/logging/logtest"
	"github.com/reft-hpc/reft/agent/peer"
	"github.com/reft-hpc/reft/tmpfs"
)

const (
	testJob  = "7001"
	testUID  = 4242
	testSpan = 64
)

var testKey = bytes.Repeat([]byte("reft-mesh-secret"), 2)

// freeRange finds a port range of testSpan whose candidates for job (n
// nodes) are all free on loopback now, so tests can tell which candidate
// each agent took.
func freeRange(t *testing.T, job string, n int) int {
	t.Helper()
	for range 100 {
		lo := 20000 + rand.IntN(30000)
		ok := true
		for i := 0; i < n && ok; i++ {
			for _, p := range Candidates(job, lo, lo+testSpan-1, i, n) {
				ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
				if err != nil {
					ok = false
					break
				}
				ln.Close()
			}
		}
		if ok {
			return lo
		}
	}
	t.Fatal("no port range with free candidates")
	return 0
}

func topology(n int) Fixed {
	t := Topology{}
	for i := range n {
		t.Nodes = append(t.Nodes, Node{Index: i, Name: "n" + strconv.Itoa(i+1), Addr: "127.0.0.1"})
	}
	return Fixed(t)
}

// logBuf collects an agent's JSON log lines.
type logBuf = logtest.Buffer

func peerConfig(t *testing.T, job, node string, lo int, log zerolog.Logger) peer.Config {
	t.Helper()
	auth, err := peer.NewSecret(testKey, testUID)
	if err != nil {
		t.Fatal(err)
	}
	// Liveness timers as in agent/peer's tests: loose enough for -race on a
	// loaded machine.
	return peer.Config{Job: job, UID: testUID, Node: node, Auth: auth, Bind: "127.0.0.1",
		PortRange: [2]int{lo, lo + testSpan - 1}, Heartbeat: 200 * time.Millisecond, Timeout: 2 * time.Second, Log: log}
}

// agent is one node's mesh and store in a test.
type agent struct {
	m     *Mesh
	store *tmpfs.Store
	log   *logBuf
}

func openStore(t *testing.T, job string) *tmpfs.Store {
	t.Helper()
	s, err := tmpfs.Open(tmpfs.Options{Root: filepath.Join(t.TempDir(), "reft"), JobID: job, ChunkSize: 64 << 10, Keep: 1,
		Log: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// startAgent starts node's mesh over a fresh store. Each agent's log is
// both collected and passed to the test log.
func startAgent(t *testing.T, topo TopologySource, node string, lo int, tweak ...func(*Config)) *agent {
	t.Helper()
	a := &agent{store: openStore(t, testJob), log: &logBuf{}}
	a.log.CheckEvents(t)
	log := zerolog.New(zerolog.MultiLevelWriter(a.log, zerolog.NewTestWriter(t))).With().Str("node", node).Logger()
	cfg := Config{Peer: peerConfig(t, testJob, node, lo, log)}
	for _, f := range tweak {
		f(&cfg)
	}
	m, err := Start(context.Background(), cfg, topo, a.store, log)
	if err != nil {
		t.Fatal(err)
	}
	a.m = m
	t.Cleanup(func() { m.Close() })
	return a
}

// waitConnected waits until a's mesh sees every other node connected.
func waitConnected(t *testing.T, a *agent, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for _, nd := range a.m.Nodes() {
		if _, err := a.m.Resolve(ctx, nd.Name); err != nil {
			t.Fatalf("%s: %v\npeers: %+v", a.m.Self().Name, err, a.m.Peers())
		}
	}
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
