package agent

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/agent/detect"
	"github.com/reft-hpc/reft/agent/logging/logtest"
	"github.com/reft-hpc/reft/agent/mesh"
	"github.com/reft-hpc/reft/agent/peer"
	"github.com/reft-hpc/reft/agent/persist"
	reftclient "github.com/reft-hpc/reft/client"
	"github.com/reft-hpc/reft/hostmem"
	"github.com/reft-hpc/reft/spank/spec"
	"github.com/reft-hpc/reft/tmpfs"
)

// Several agents with real stores, meshes and loopback sockets, one rank
// per node, DP = 4: ranks snapshot sharded, nodes are lost (their agents
// stopped and their stores deleted), every agent restarts as a relaunched
// step's would, spares take the lost ranks, and every rank must get back
// exactly the bytes of the newest step.

const shJob = "7700"

var shKey = bytes.Repeat([]byte("reft-shard-secret"), 2)

type shNode struct {
	name, root string
	srv        *Server
	st         *tmpfs.Store
	m          *mesh.Mesh
	per        *persist.Persister
	sock       string
	log        *syncBuf
	stop       func()
	ctr        peer.Counters       // its frames and connections
	det        *detect.Detector    // with shOpts.detect, once started
	failures   chan detect.Failure // its detector's published verdicts, with shOpts.detect
	// startDetect starts the agent's detector (shOpts.detect), from the
	// test's goroutine, before stop.
	startDetect func()
}

// syncBuf is an agent's log.
type syncBuf = logtest.Buffer

// shPorts finds a port range whose candidates for n nodes are free now.
func shPorts(t testing.TB, n, span int) int {
	t.Helper()
	for range 100 {
		// Below Linux's default ephemeral range (32768 up), where the
		// harness's own outgoing connections take their ports.
		lo := 10000 + rand.IntN(32768-10000-span)
		ok := true
		for i := 0; i < n && ok; i++ {
			for _, p := range mesh.Candidates(shJob, lo, lo+span-1, i, n) {
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
	t.Fatal("no free port range")
	return 0
}

// shStart starts node name's agent over the store under root.
func shStart(t testing.TB, name, root, spc string, topo mesh.Fixed, lo int, persistDir string, o shOpts) *shNode {
	chunk := o.chunk
	t.Helper()
	n := &shNode{name: name, root: root, log: &syncBuf{}}
	n.log.CheckEvents(t)
	log := zerolog.New(n.log).With().Str("node", name).Logger()
	alloc, err := hostmem.NewAllocator(hostmem.Config{NoPin: true})
	if err != nil {
		t.Fatal(err)
	}
	if n.st, err = tmpfs.Open(tmpfs.Options{Root: root, JobID: shJob, ChunkSize: chunk, Keep: 1, Alloc: alloc}); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "reft-shard-")
	if err != nil {
		t.Fatal(err)
	}
	n.sock = filepath.Join(dir, "agent.sock")
	sp, err := spec.Parse(spc)
	if err != nil {
		t.Fatal(err)
	}
	if n.srv, err = Listen(n.sock, Info{Job: shJob, Node: name, Spec: sp.String(), Version: "test", UID: os.Getuid()}, log); err != nil {
		t.Fatal(err)
	}
	n.srv.AttachStore(n.st)
	n.srv.AttachTopology(o.topo)
	n.srv.rings.wait = o.ringWait
	if persistDir != "" {
		if n.per, err = persist.New(persist.Options{Dir: persistDir, Job: shJob, Node: name, UID: os.Getuid(), Policy: sp.Persist,
			Store: n.st, Log: log}); err != nil {
			t.Fatal(err)
		}
		n.srv.AttachPersist(n.per)
	}
	auth, err := peer.NewSecret(shKey, os.Getuid())
	if err != nil {
		t.Fatal(err)
	}
	hb := o.heartbeat
	if hb == 0 {
		hb = 200 * time.Millisecond
	}
	pc := peer.Config{Job: shJob, UID: os.Getuid(), Node: name, Auth: auth, Bind: "127.0.0.1", PortRange: [2]int{lo, lo + o.portSpan - 1},
		Heartbeat: hb, Timeout: 2 * time.Second, Log: log, Status: func() any { return n.srv.Status() }, Counters: &n.ctr}
	n.srv.PeerHooks(&pc)
	mc := mesh.Config{Peer: pc, Hosted: n.srv.rings.Hosted}
	if o.detect {
		mc.PeerFound = n.srv.seen.found
	}
	if n.m, err = mesh.Start(context.Background(), mc, topo, n.st, log); err != nil {
		t.Fatal(err)
	}
	n.srv.AttachMesh(func() *mesh.Mesh { return n.m })
	n.srv.AttachPeering((&peering{m: n.m}).status)
	ctx, cancel := context.WithCancel(context.Background())
	if o.detect {
		// The agent's own detector over the mesh, with reft.toml's
		// defaults; stop cancels it without a goodbye (Leave), as a
		// killed agent would.
		n.failures = make(chan detect.Failure, 16)
		n.srv.notes.OnPeerFailure(func(f detect.Failure) {
			select {
			case n.failures <- f:
			default:
			}
		})
		n.startDetect = func() {
			t.Helper()
			if n.det, err = startDetector(ctx, config.Default(), n.m, n.srv, log); err != nil {
				t.Fatal(err)
			}
		}
	}
	done := make(chan error, 1)
	go func() { done <- n.srv.Serve(ctx) }()
	var once sync.Once
	n.stop = func() {
		once.Do(func() {
			cancel()
			<-done
			if n.det != nil {
				n.det.Close()
			}
			n.srv.Close()
			n.m.Close()
			if n.per != nil {
				n.per.Close()
			}
			n.st.Close()
			os.RemoveAll(dir)
		})
	}
	t.Cleanup(n.stop)
	return n
}

// shJobRun is a job: its nodes by rank.
type shJobRun struct {
	t      testing.TB
	spec   string
	nodes  []*shNode // by rank
	spares []*shNode // the allocation's nodes without ranks
	pdir   string
	lo     int // the port range's low end
	opt    shOpts
	took   []time.Duration // each rank's RestoreStep in the last restoreAll
}

// shOpts change the harness's defaults (benchmarks).
type shOpts struct {
	chunk int64                                                        // store and client chunk size; 0: 64 KiB
	bufs  func(step int64, rank int, withLocal bool) map[string][]byte // nil: shBuffers
	// layout is the clients' layout string; "": dp = world.
	layout string
	// topo is every agent's [topology]; ringWait its bound on the wait for
	// a group's members (0: the default).
	topo     config.Topology
	ringWait time.Duration
	// alloc is the allocation's node order; its nodes that no rank runs
	// on are spares, with agents of their own (nil: the ranks' nodes).
	alloc []string
	// detect prepares every agent's failure detector (reft.toml's
	// defaults), started by shNode.startDetect; heartbeat is the peer connections' ping interval (0:
	// 200 ms); portSpan the port range's size (0: 64; it needs 8 per node).
	detect    bool
	heartbeat time.Duration
	portSpan  int
}

// startJob starts one agent per distinct name (rank i on names[i], so a
// name given twice is a node with two ranks); roots gives each node's
// store root (kept across restarts for surviving nodes).
func startJob(t testing.TB, spc string, names []string, roots map[string]string, pdir string, opt ...shOpts) *shJobRun {
	t.Helper()
	var o shOpts
	if len(opt) > 0 {
		o = opt[0]
	}
	if o.chunk == 0 {
		o.chunk = 64 << 10
	}
	if o.bufs == nil {
		o.bufs = shBuffers
	}
	if o.portSpan == 0 {
		o.portSpan = 64
	}
	topo := mesh.Topology{}
	for _, nm := range append(slices.Clone(o.alloc), names...) {
		if !slices.ContainsFunc(topo.Nodes, func(n mesh.Node) bool { return n.Name == nm }) {
			topo.Nodes = append(topo.Nodes, mesh.Node{Index: len(topo.Nodes), Name: nm, Addr: "127.0.0.1"})
		}
	}
	lo := shPorts(t, len(topo.Nodes), o.portSpan)
	j := &shJobRun{t: t, spec: spc, pdir: pdir, lo: lo, opt: o}
	started := map[string]*shNode{}
	for _, n := range topo.Nodes {
		nm := n.Name
		if roots[nm] == "" {
			roots[nm] = filepath.Join(t.TempDir(), "shm")
		}
		started[nm] = shStart(t, nm, roots[nm], spc, mesh.Fixed(topo), lo, pdir, o)
		if !slices.Contains(names, nm) {
			j.spares = append(j.spares, started[nm])
		}
	}
	for _, nm := range names {
		j.nodes = append(j.nodes, started[nm])
	}
	return j
}

func (j *shJobRun) stop() {
	for _, n := range append(slices.Clone(j.nodes), j.spares...) {
		n.stop()
	}
}

// alloc is the job's node order (spares included).
func (j *shJobRun) alloc() []string {
	out := slices.Clone(j.opt.alloc)
	for _, n := range j.nodes {
		if !slices.Contains(out, n.name) {
			out = append(out, n.name)
		}
	}
	return out
}

// shBuffers are a rank's registered buffers at step: replicated ones are
// the same on every rank (a function of the step only), of odd sizes.
func shBuffers(step int64, rank int, withLocal bool) map[string][]byte {
	out := map[string][]byte{}
	for _, b := range []struct {
		name string
		size int
	}{{"layer0.weight", 300_007}, {"layer0.bias", 1_001}, {"trainer.state", 16}, {"opt.m", 77_777}} {
		r := rand.New(rand.NewPCG(uint64(step), uint64(len(b.name))))
		p := make([]byte, b.size)
		for i := range p {
			p[i] = byte(r.Uint32())
		}
		out[b.name] = p
	}
	if withLocal {
		out["rng"] = []byte(fmt.Sprintf("rank %d step %d", rank, step))
	}
	return out
}

var shOrder = []string{"layer0.weight", "layer0.bias", "trainer.state", "opt.m", "rng"}

func (j *shJobRun) open(rank int, bufs map[string][]byte) *reftclient.Client {
	j.t.Helper()
	layout := j.opt.layout
	if layout == "" {
		layout = "dp=" + strconv.Itoa(len(j.nodes))
	}
	c, err := reftclient.Open(context.Background(), reftclient.Options{Socket: j.nodes[rank].sock, Rank: rank, World: len(j.nodes),
		Layout: layout, ChunkSize: j.opt.chunk})
	if err != nil {
		j.t.Fatal(err)
	}
	for _, name := range shOrder {
		b, ok := bufs[name]
		if !ok {
			continue
		}
		kind := reftclient.Replicated
		if name == "rng" {
			kind = reftclient.Sharded
		}
		if err := c.Register(name, b, kind); err != nil {
			j.t.Fatal(err)
		}
	}
	return c
}

// saveSteps has every rank save steps 1..n.
func (j *shJobRun) saveSteps(n int64, withLocal bool) { j.t.Helper(); j.saveRange(1, n, withLocal) }

// saveRange has every rank save steps from..to.
func (j *shJobRun) saveRange(from, to int64, withLocal bool) {
	j.t.Helper()
	var wg sync.WaitGroup
	for r := range j.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bufs := j.opt.bufs(0, r, withLocal)
			c := j.open(r, bufs)
			defer c.Close()
			for st := from; st <= to; st++ {
				for k, v := range j.opt.bufs(st, r, withLocal) {
					copy(bufs[k], v)
				}
				if err := c.Save(st).Wait(context.Background()); err != nil {
					j.t.Errorf("rank %d save %d: %v", r, st, err)
					return
				}
				if p := j.nodes[r].per; p != nil {
					p.Wait() // every due step written, none skipped
				}
			}
		}()
	}
	wg.Wait()
	for _, n := range j.nodes {
		if n.per != nil {
			n.per.Wait()
		}
	}
}

// restoreAll has every rank agree on the newest common step and restore
// it; it returns the step and each rank's error.
func (j *shJobRun) restoreAll(withLocal bool) (int64, []error, []map[string][]byte) {
	j.t.Helper()
	w := len(j.nodes)
	cs := make([]*reftclient.Client, w)
	bufs := make([]map[string][]byte, w)
	gens := make([][]int64, w)
	errs := make([]error, w)
	var wg sync.WaitGroup
	for r := range w {
		bufs[r] = j.opt.bufs(0, r, withLocal)
		cs[r] = j.open(r, bufs[r])
		defer cs[r].Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			gens[r], errs[r] = cs[r].Generations(context.Background())
		}()
	}
	wg.Wait()
	step := int64(-1)
	if gens[0] != nil {
		for _, s := range gens[0] {
			if !slices.ContainsFunc(gens, func(g []int64) bool { return !slices.Contains(g, s) }) && s > step {
				step = s
			}
		}
	}
	if step < 0 {
		return step, errs, bufs
	}
	j.took = make([]time.Duration, w)
	for r := range w {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			errs[r] = cs[r].RestoreStep(context.Background(), step)
			j.took[r] = time.Since(t0)
		}()
	}
	wg.Wait()
	return step, errs, bufs
}

// relaunch stops the job and starts it again with the failed nodes' stores
// gone and spares s1, s2, ... in their places.
func (j *shJobRun) relaunch(roots map[string]string, failed []int) *shJobRun {
	j.t.Helper()
	j.stop()
	names := make([]string, len(j.nodes))
	for r, n := range j.nodes {
		names[r] = n.name
	}
	o := j.opt
	o.alloc = slices.Clone(o.alloc)
	for i, r := range failed {
		os.RemoveAll(roots[names[r]]) // the node's tmpfs is gone
		// The lost node leaves the allocation; spare s<i+1> takes its
		// ranks (an allocation's spare if it has one).
		o.alloc = slices.DeleteFunc(o.alloc, func(n string) bool { return n == names[r] })
		names[r] = "s" + strconv.Itoa(i+1)
	}
	return startJob(j.t, j.spec, names, roots, j.pdir, o)
}

func subsets(m, k int) [][]int {
	var out [][]int
	var rec func(start int, cur []int)
	rec = func(start int, cur []int) {
		if len(cur) == k {
			out = append(out, slices.Clone(cur))
			return
		}
		for i := start; i < m; i++ {
			rec(i+1, append(cur, i))
		}
	}
	rec(0, nil)
	return out
}

func checkRestored(t *testing.T, step int64, errs []error, bufs []map[string][]byte, withLocal bool) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		for name, got := range bufs[r] {
			if want := shBuffers(step, r, withLocal)[name]; !bytes.Equal(got, want) {
				t.Fatalf("rank %d buffer %s differs from step %d", r, name, step)
			}
		}
	}
}

// upTo is every subset of 0..m-1 with 1 to k members.
func upTo(m, k int) [][]int {
	var out [][]int
	for i := 1; i <= k; i++ {
		out = append(out, subsets(m, i)...)
	}
	return out
}

// TestShardedRestoreEveryFailureSet: for each mode and combination, every
// set of failed members up to its tolerance (and arc's non-adjacent pair,
// which it also survives) restores step 3 bit for bit. (aor's combinations
// need optimizer state: TestAORRestoreEveryNode.)
func TestShardedRestoreEveryFailureSet(t *testing.T) {
	cases := []struct {
		spec string
		sets [][]int
		want []string // restore events the replacement ranks may log
	}{
		{"arc", upTo(4, 1), []string{"restore_peer"}},
		{"arc", [][]int{{0, 2}, {1, 3}}, []string{"restore_peer"}},
		{"aec", upTo(4, 1), []string{"decode"}},
		{"aec:2", upTo(4, 2), []string{"decode"}},
		{"aec:3", upTo(4, 3), []string{"decode"}},
		{"arc+aec", upTo(4, 2), []string{"restore_peer", "decode"}},
		{"arc+aec:2", upTo(4, 3), []string{"restore_peer", "decode"}},
	}
	for _, tc := range cases {
		for _, failed := range tc.sets {
			t.Run(fmt.Sprintf("%s/lost=%v", tc.spec, failed), func(t *testing.T) {
				roots := map[string]string{}
				j := startJob(t, tc.spec, []string{"n1", "n2", "n3", "n4"}, roots, "")
				j.saveSteps(3, false)
				j = j.relaunch(roots, failed)
				for _, n := range j.nodes {
					n.srv.rs.progressEvery = 0 // a progress event at every arrival
				}
				step, errs, bufs := j.restoreAll(false)
				if step != 3 {
					t.Fatalf("agreed on step %d, want 3 (errors %v)", step, errs)
				}
				checkRestored(t, step, errs, bufs, false)
				for _, r := range failed {
					checkProgress(t, r, j.nodes[r].log.Events("restore_progress"))
					var got []string
					for _, ev := range []string{"restore_local", "restore_peer", "decode", "restore_persistent"} {
						if len(j.nodes[r].log.Events(ev)) > 0 {
							got = append(got, ev)
						}
					}
					if len(got) != 1 || !slices.Contains(tc.want, got[0]) {
						t.Errorf("replacement of rank %d logged %v, want one of %v", r, got, tc.want)
					}
				}
			})
		}
	}
}

// TestShardedRestoreBeyondTolerance: failures beyond a mode's tolerance.
// With a persistent tier the job restores from it; every rank's
// restore_fallback and restore_persistent events say why (the group and
// exactly the lost ranks) and list every shard memory lost, each with its
// reason (lost_shards), however many (the human reason names two and
// counts the rest). Without one, restore fails naming the lost shard and
// the fix.
func TestShardedRestoreBeyondTolerance(t *testing.T) {
	// The agreed persisted step may still be in the survivors' memory
	// (persist=1) or long released from it (persist=3, two steps later):
	// either way the reason is why memory could not give the newest step,
	// and it names exactly the lost ranks, not a survivor.
	for _, tc := range []struct {
		spec        string
		saved, want int64
		failed      []int
		group       string // the reason's start
		lostRanks   []int  // whose shards lost_shards lists
		shardReason string // in each lost shard's reason
	}{
		{"arc,persist=1", 3, 3, []int{1, 2}, "SG (pp=0,tp=0) lost ranks 1 and 2", []int{2}, "its ARC copy on rank 1"},
		{"arc,persist=3", 5, 3, []int{1, 2}, "SG (pp=0,tp=0) lost ranks 1 and 2", []int{2}, "its ARC copy on rank 1"},
		{"aec,persist=1", 3, 3, []int{1, 2}, "SG (pp=0,tp=0) lost ranks 1 and 2", []int{1, 2}, "AEC stripe"},
		{"aec,persist=1", 3, 3, []int{0, 1, 2}, "SG (pp=0,tp=0) lost ranks 0, 1 and 2", []int{0, 1, 2}, "AEC stripe"},
	} {
		t.Run(fmt.Sprintf("persistent %s/lost=%v", tc.spec, tc.failed), func(t *testing.T) {
			roots := map[string]string{}
			j := startJob(t, tc.spec, []string{"n1", "n2", "n3", "n4"}, roots, t.TempDir())
			j.saveSteps(tc.saved, false)
			j = j.relaunch(roots, tc.failed)
			step, errs, bufs := j.restoreAll(false)
			if step != tc.want {
				t.Fatalf("agreed on step %d, want the persisted step %d (errors %v)", step, tc.want, errs)
			}
			checkRestored(t, step, errs, bufs, false)
			for r, n := range j.nodes {
				evs := n.log.Events("restore_persistent")
				if len(evs) != 1 {
					t.Fatalf("rank %d logged %d restore_persistent events", r, len(evs))
				}
				fb := n.log.Events("restore_fallback")
				if len(fb) != 1 {
					t.Fatalf("rank %d logged %d restore_fallback events", r, len(fb))
				}
				reason, _ := evs[0]["reason"].(string)
				if !strings.Contains(reason, tc.group) {
					t.Errorf("rank %d: reason %q does not name the group and exactly the lost ranks %v", r, reason, tc.failed)
				}
				for _, e := range []map[string]any{fb[0], evs[0]} {
					lost, _ := e["lost_shards"].([]any)
					var ranks []int
					for _, l := range lost {
						ls, _ := l.(map[string]any)
						rk, _ := ls["rank"].(float64)
						ranks = append(ranks, int(rk))
						why, _ := ls["reason"].(string)
						if ls["kind"] != "replicated" || ls["group"] != "(pp=0,tp=0)" || !strings.Contains(why, fmt.Sprintf("rank %d's shard was on", int(rk))) ||
							!strings.Contains(why, tc.shardReason) || ls["position"] != rk {
							t.Errorf("rank %d's %s: lost shard %v, want rank %d's replicated shard of (pp=0,tp=0) at its position with %q in its reason", r, e["event"], ls, int(rk), tc.shardReason)
						}
					}
					if !slices.Equal(ranks, tc.lostRanks) {
						t.Errorf("rank %d's %s lists lost shards of ranks %v, want %v", r, e["event"], ranks, tc.lostRanks)
					}
				}
				if r == 0 {
					t.Logf("reason: %s", reason)
					t.Logf("lost_shards: %v", evs[0]["lost_shards"])
				}
			}
		})
	}
	t.Run("no persistent tier", func(t *testing.T) {
		roots := map[string]string{}
		j := startJob(t, "arc", []string{"n1", "n2", "n3", "n4"}, roots, "")
		j.saveSteps(2, false)
		j = j.relaunch(roots, []int{1, 2})
		step, _, _ := j.restoreAll(false)
		if step >= 0 {
			t.Fatalf("agreed on step %d after losing two ring neighbours under arc", step)
		}
		c := j.open(0, shBuffers(0, 0, false))
		defer c.Close()
		err := c.RestoreStep(context.Background(), 2)
		if err == nil || !strings.Contains(err.Error(), "persistent checkpoints are off") || !strings.Contains(err.Error(), "SG (pp=0,tp=0)") {
			t.Fatalf("restore error %v: want the lost shards and that persistent checkpoints are off", err)
		}
		t.Logf("error: %v", err)
	})
}

// TestShardedRestoreCorruptPeerChunk: rank 1's own shard of step 3 is
// corrupted at rest on n2 (one byte in the middle). Every rank that reads
// it finds the chunk's checksum wrong and takes it from rank 0's ARC copy
// on n1 instead, says so (chunk_failover: the chunk, n2's checksum error,
// n1) and counts it in its restore event; every rank gets the exact bytes.
// Rank 0 reads its own ARC copy, so it never touches the corrupt chunk.
// With n4 lost, the replacement of rank 3 does the same while it fetches
// everything from peers.
func TestShardedRestoreCorruptPeerChunk(t *testing.T) {
	for _, tc := range []struct {
		name   string
		failed []int
		peer   []int // ranks that fetch the corrupt chunk from n2 over the network
	}{
		{"survivors", nil, []int{2, 3}},
		{"replacement of n4", []int{3}, []int{2, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			roots := map[string]string{}
			j := startJob(t, "arc", []string{"n1", "n2", "n3", "n4"}, roots, "")
			j.saveSteps(3, false)
			// Flip a byte of rank 1's own shard of step 3 on n2.
			st := j.nodes[1].st
			g := st.Generations(tmpfs.Key{Rank: 1, Shard: tmpfs.DefaultShard})[0]
			var off, chunk int64 = -1, -1
			for _, b := range g.Manifest.Buffers {
				if b.Name == secShard {
					off = b.Offset + b.Size/2
					chunk = (b.Size / 2) / g.Manifest.ChunkSize
				}
			}
			if g.Step != 3 || off < 0 {
				t.Fatalf("generation %d has no %s", g.Step, secShard)
			}
			f, err := os.OpenFile(g.ArenaPath, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			var b [1]byte
			f.ReadAt(b[:], off)
			b[0] ^= 0xff
			f.WriteAt(b[:], off)
			f.Close()
			j = j.relaunch(roots, tc.failed)
			step, errs, bufs := j.restoreAll(false)
			if step != 3 {
				t.Fatalf("agreed on step %d, want 3 (%v)", step, errs)
			}
			checkRestored(t, step, errs, bufs, false)
			for r, n := range j.nodes {
				fo := n.log.Events("chunk_failover")
				_, ev := restoreEvent(t, n)
				got, _ := ev["failovers"].(float64)
				switch {
				case r == 0:
					if len(fo) != 0 || got != 0 {
						t.Errorf("rank 0 (own ARC copy of shard 1) logged failovers %v: %v", got, fo)
					}
				case r == 1:
					// Its own copy fails locally: the ARC copy on n1 serves it.
					if len(fo) != 1 || !strings.Contains(fmt.Sprint(fo[0]["copies_failed"]), "snapshot chunk corrupt") || got < 1 {
						t.Errorf("rank 1 logged chunk_failover %v and %v failovers, want its own corrupt copy named", fo, got)
					}
				case slices.Contains(tc.peer, r):
					want := fmt.Sprintf("map[chunk:%d failed:[n2: chunk %d from ", chunk, chunk)
					if len(fo) != 1 || fo[0]["section"] != secShard || fo[0]["owner_rank"] != 1.0 || !strings.Contains(fmt.Sprint(fo[0]["chunks"]), want) ||
						!strings.Contains(fmt.Sprint(fo[0]["chunks"]), "source's stored") || !strings.Contains(fmt.Sprint(fo[0]["chunks"]), "from:n1") || got != 1 {
						t.Errorf("%s (rank %d) logged chunk_failover %v and %v failovers; want chunk %d of rank 1's shard failing on n2 with a checksum mismatch and taken from n1", n.name, r, fo, got, chunk)
					}
				}
				if len(fo) > 0 && r == 3 {
					t.Logf("%s: %v", n.name, fo[0])
				}
			}
		})
	}
}

// checkProgress: a restore's progress events never go backwards and end
// with every byte it planned landed.
func checkProgress(t *testing.T, rank int, evs []map[string]any) {
	t.Helper()
	if len(evs) == 0 {
		t.Errorf("rank %d's restore logged no restore_progress event", rank)
		return
	}
	var last float64
	for _, e := range evs {
		done, _ := e["bytes_done"].(float64)
		if done < last {
			t.Errorf("rank %d: restore_progress went back from %v to %v bytes", rank, last, done)
		}
		last = done
	}
	end := evs[len(evs)-1]
	if end["bytes_done"] != end["bytes_total"] || end["percent"] != 100.0 {
		t.Errorf("rank %d: the last restore_progress is %v of %v bytes (%v%%), want all of them", rank, end["bytes_done"], end["bytes_total"], end["percent"])
	}
}
