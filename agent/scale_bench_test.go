package agent

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/reft-hpc/reft/agent/event"
	"github.com/reft-hpc/reft/agent/mesh"
	"github.com/reft-hpc/reft/agent/peer"
	reftclient "github.com/reft-hpc/reft/client"
)

// BenchmarkAgentScale: what one agent costs as the job grows
// (docs/BENCHMARKS.md, "Many agents"; docs/SCALE.md reads it).
//
// N agents of the sharded harness (sharded_test.go) in this process, one
// rank each, and one spare agent (GEMINI's standby): the real Server,
// mesh and peer transport on loopback, stores under /dev/shm, every
// agent's failure detector with reft.toml's defaults and the peer
// connections' default heartbeat (500 ms). Layout dp=4,pp=N/4: N/4
// sharding groups of four; SPEC REFT_SCALE_SPEC (default arc); a tiny
// replicated state (6 KiB per rank, 4 KiB chunks), so the numbers are the
// protocol's, not the bytes'. The phases, in order:
//
//	start    every agent up, until every mesh has found every peer; then
//	         the detectors start (see below why not sooner)
//	idle     two seconds of nothing, reported per second
//	save     every rank registers and commits steps 1 and 2
//	detect   rank N/2's agent stops without a goodbye (its rank's client
//	         first); until every other agent's detector published the loss
//	restore  rank N/2 registers on the spare's agent, lists its steps and
//	         restores step 2 from its group's peers (restore_peer, or
//	         decode under aec), bytes checked
//
// Per agent and phase, from each agent's peer.Counters: the phase's work
// (frames sent plus received, max and median over the agents) and, apart
// from it, the background: frames exchanged at a steady rate whatever
// happens (connection pings, the detector's beats and their replies), per
// second; the connections open at the phase's end, and those opened
// during it (beyond the start's, a reconnect after a connection fell
// silent under load). Memory: one process cannot split it between agents,
// so it is a share: the heap in use after a GC and the RSS, each less its
// value before the first agent started, divided by the agents running
// (the clients' few buffers and the agents' in-memory logs included),
// and the goroutines likewise. The agents of a phase are those running at
// its end (the stopped one is left out of detect and restore). For the
// whole job: suspicions (peer_suspected, every agent's) and verdicts
// (failure_detected, the coordinator's); detect has one verdict, any
// other would be a false positive. The table and each quantity's growth
// per 4x of N are printed at the end.
//
// REFT_SCALE_N lists the job sizes (default "16,64"). All-to-all peer
// connections need 2N(N+1) descriptors in this process: the benchmark
// raises RLIMIT_NOFILE when it may and fails a size it cannot fit (N = 128
// needs 33,000; a hard limit of 20,000 fits N = 96). Run it under nice: it
// is CPU-heavy and shares the machine, and a starved run shows it as
// suspicions (every one asks every agent) and reconnects.
func BenchmarkAgentScale(b *testing.B) {
	sizes := []int{16, 64}
	if v := os.Getenv("REFT_SCALE_N"); v != "" {
		sizes = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 8 || n%4 != 0 {
				b.Fatalf("REFT_SCALE_N=%q: want job sizes, multiples of 4 from 8, comma-separated", v)
			}
			sizes = append(sizes, n)
		}
	}
	spc := os.Getenv("REFT_SCALE_SPEC")
	if spc == "" {
		spc = "arc"
	}
	var runs []scaleRun
	for _, n := range sizes {
		b.Run("agents="+strconv.Itoa(n), func(b *testing.B) {
			raiseNoFile(b, 2*n*(n+1)+4096)
			var r scaleRun
			for range b.N {
				r = runScale(b, n, spc)
			}
			b.ReportMetric(r.detectS, "detect_s")
			for _, p := range r.phases {
				b.ReportMetric(p.ctrl.max, p.name+"_frames_max")
				b.ReportMetric(p.conns.max, p.name+"_conns_max")
			}
			runs = append(runs, r)
		})
	}
	if len(runs) > 0 {
		fmt.Print(scaleTable(spc, runs))
	}
}

// scaleRun is one job size's measures.
type scaleRun struct {
	n       int
	phases  []scalePhase
	detectS float64 // stop to the last survivor's published verdict
	class   string  // the verdict's class
}

// scalePhase is one phase's per-agent quantities.
type scalePhase struct {
	name                string
	ctrl, pings, conns  stat    // per agent
	opened              stat    // connections opened in the phase, per agent (dials and accepts)
	heap, rss, routines float64 // per agent share
	secs                float64
	top                 string // the frame types of the busiest agent
	// suspicions and verdicts are the job's, not per agent: peer_suspected
	// events of every agent, failure_detected events (the coordinator's).
	suspicions, verdicts int
}

type stat struct{ max, med float64 }

func statOf(v []float64) stat {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return stat{}
	}
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return stat{max: s[len(s)-1], med: med}
}

// scaleState is the tiny replicated state of step (6 KiB and a counter).
func scaleState(step int64, _ int, _ bool) map[string][]byte {
	w := make([]byte, 6000)
	for i := range w {
		w[i] = byte(int64(i)*31 + step*7)
	}
	return map[string][]byte{"layer0.weight": w, "trainer.state": []byte(fmt.Sprintf("step %011d", step))}
}

// memNow is the process's heap in use after a GC and its RSS, in bytes,
// and its goroutines.
func memNow(b *testing.B) (heap, rss float64, routines int) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	st, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range strings.Split(string(st), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			rss = kb * 1024
		}
	}
	return float64(ms.HeapInuse), rss, runtime.NumGoroutine()
}

func runScale(b *testing.B, n int, spc string) scaleRun {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("n%03d", i+1)
	}
	shm, err := os.MkdirTemp("/dev/shm", "reft-bench-scale-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(shm) })
	roots := map[string]string{}
	for _, nm := range append(slices.Clone(names), "s1") {
		roots[nm] = filepath.Join(shm, nm)
	}
	layout := fmt.Sprintf("dp=4,pp=%d", n/4)
	opt := shOpts{chunk: 4 << 10, bufs: scaleState, layout: layout, alloc: append(slices.Clone(names), "s1"),
		detect: true, heartbeat: 500 * time.Millisecond, portSpan: 8 * (n + 1)}
	run := scaleRun{n: n}
	heap0, rss0, gr0 := memNow(b)
	var all []*shNode
	var prev []peer.CountersSnapshot
	var prevSusp, prevVerd int
	t0 := time.Now()
	phase := func(name string, live []*shNode, per float64) {
		secs := time.Since(t0).Seconds()
		heap, rss, gr := memNow(b)
		p := scalePhase{name: name, secs: secs, heap: (heap - heap0) / float64(len(live)),
			rss: (rss - rss0) / float64(len(live)), routines: float64(gr-gr0) / float64(len(live))}
		var ctrl, pings, conns, opened []float64
		busiest, most := -1, -1.0
		for i, nd := range all {
			now := nd.ctr.Snapshot()
			if !slices.Contains(live, nd) {
				prev[i] = now
				continue
			}
			d := now.Sub(prev[i])
			prev[i] = now
			s, r := d.Frames(func(t peer.Type) bool { return !background(t) })
			ps, pr := d.Frames(background)
			ctrl = append(ctrl, float64(s+r)/per)
			pings = append(pings, float64(ps+pr)/secs)
			conns = append(conns, float64(now.Open))
			opened = append(opened, float64(d.Opened))
			if float64(s+r) > most {
				busiest, most = i, float64(s+r)
			}
			if busiest == i {
				p.top = nd.name + ": " + topTypes(d)
			}
		}
		p.ctrl, p.pings, p.conns, p.opened = statOf(ctrl), statOf(pings), statOf(conns), statOf(opened)
		susp, verd := 0, 0
		for _, nd := range all {
			susp += len(nd.log.Events("peer_suspected"))
			verd += len(nd.log.Events(event.FailureDetected))
		}
		p.suspicions, p.verdicts = susp-prevSusp, verd-prevVerd
		prevSusp, prevVerd = susp, verd
		run.phases = append(run.phases, p)
		t0 = time.Now()
	}

	j := startJob(b, spc, names, roots, "", opt)
	defer j.stop()
	all = append(slices.Clone(j.nodes), j.spares...)
	prev = make([]peer.CountersSnapshot, len(all))
	for connected := false; !connected; time.Sleep(50 * time.Millisecond) {
		if time.Since(t0) > 10*time.Minute {
			b.Fatal("the meshes did not find every peer in 10 minutes")
		}
		connected = !slices.ContainsFunc(all, func(nd *shNode) bool {
			return slices.ContainsFunc(nd.m.Peers(), func(p mesh.PeerStatus) bool { return !p.Connected })
		})
	}
	// The detectors start once every mesh is connected: a real job's
	// agents start on nodes of their own, these share two cores, and
	// beats starved by the start's handshakes raise suspicions, each of
	// which asks every agent (docs/SCALE.md has the run that showed it).
	for _, nd := range all {
		nd.startDetect()
	}
	phase("start", all, 1)

	time.Sleep(2 * time.Second) // idle: what the job costs while nothing happens
	phase("idle", all, time.Since(t0).Seconds())

	clients := make([]*reftclient.Client, n)
	errs := make(chan error, n)
	for r := range n {
		go func() {
			bufs := scaleState(0, r, false)
			c := j.open(r, bufs)
			clients[r] = c
			for st := int64(1); st <= 2; st++ {
				for k, v := range scaleState(st, r, false) {
					copy(bufs[k], v)
				}
				if err := c.Save(st).Wait(context.Background()); err != nil {
					errs <- fmt.Errorf("rank %d save %d: %w", r, st, err)
					return
				}
			}
			errs <- nil
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	defer func() {
		for _, c := range clients {
			if c != nil {
				c.Close()
			}
		}
	}()
	phase("save", all, 1)

	lost := n / 2
	victim := j.nodes[lost]
	clients[lost].Close()
	clients[lost] = nil
	stopped := time.Now()
	victim.stop()
	live := slices.DeleteFunc(slices.Clone(all), func(nd *shNode) bool { return nd == victim })
	deadline := time.After(2 * time.Minute)
	for _, nd := range live {
		for got := false; !got; {
			select {
			case f := <-nd.failures:
				if f.Node == victim.name {
					got, run.class = true, f.Class
				}
			case <-deadline:
				b.Fatalf("agent %s: no verdict on %s within 2 minutes; the job's detection events: %s",
					nd.name, victim.name, detectionEvents(live, victim.name))
			}
		}
	}
	run.detectS = time.Since(stopped).Seconds()
	phase("detect", live, 1)

	spare := j.spares[0]
	bufs := scaleState(0, lost, false)
	c, err := reftclient.Open(context.Background(), reftclient.Options{Socket: spare.sock, Rank: lost, World: n, Layout: layout, ChunkSize: opt.chunk})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	for _, name := range shOrder {
		if buf, ok := bufs[name]; ok {
			if err := c.Register(name, buf, reftclient.Replicated); err != nil {
				b.Fatal(err)
			}
		}
	}
	gens, err := c.Generations(context.Background())
	if err != nil || !slices.Contains(gens, 2) {
		b.Fatalf("the replacement of rank %d on the spare lists steps %v (%v), want step 2", lost, gens, err)
	}
	if err := c.RestoreStep(context.Background(), 2); err != nil {
		b.Fatalf("the replacement of rank %d restores step 2: %v", lost, err)
	}
	for k, want := range scaleState(2, lost, false) {
		if !bytes.Equal(bufs[k], want) {
			b.Fatalf("the replacement of rank %d: buffer %s differs from step 2", lost, k)
		}
	}
	// From its peers: their copies (arc) or decoded from parity (aec).
	if ev, _ := restoreEvent(b, spare); ev != "restore_peer" && ev != "decode" {
		b.Fatalf("the replacement's restore was %q, want restore_peer or decode", ev)
	}
	phase("restore", live, 1)
	return run
}

// detectionEvents counts the detector's events of every agent in live
// (those naming victim, and every fencing), for a detection that did not
// end: which step it stopped at.
func detectionEvents(live []*shNode, victim string) string {
	count := map[string]int{}
	for _, nd := range live {
		for _, ev := range []string{"peer_suspected", "peer_confirmed", "peer_suspect_cleared", "peer_suspect_unconfirmed",
			"failure_reported", "failure_unpublished", "coordinator_unreachable", event.FailureDetected, "failure_published"} {
			for _, e := range nd.log.Events(ev) {
				if e["peer_node"] == victim || e["failed_node"] == victim || e["node"] == victim {
					count[ev]++
				}
			}
		}
		for _, ev := range []string{"detect_fenced", "detect_unfenced"} {
			count[ev] += len(nd.log.Events(ev))
		}
	}
	keys := slices.Sorted(maps.Keys(count))
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, count[k]))
	}
	return strings.Join(parts, ", ")
}

// background: the frames a job exchanges whatever it does, at a steady
// rate: the connections' pings and the detector's beats.
func background(t peer.Type) bool { return t == peer.TPing || t == peer.TBeat || t == peer.TBeatReply }

// topTypes names the frame types of d by count, most first (pings left
// out), for the table's notes.
func topTypes(d peer.CountersSnapshot) string {
	type tc struct {
		t peer.Type
		n uint64
	}
	var ts []tc
	for i := range d.Sent {
		if t := peer.Type(i); !background(t) && d.Sent[i]+d.Recv[i] > 0 {
			ts = append(ts, tc{t, d.Sent[i] + d.Recv[i]})
		}
	}
	slices.SortFunc(ts, func(a, b tc) int { return int(b.n) - int(a.n) })
	var parts []string
	for _, x := range ts[:min(len(ts), 4)] {
		parts = append(parts, fmt.Sprintf("%s %d", x.t, x.n))
	}
	return strings.Join(parts, ", ")
}

// scaleTable is the printed result: per phase and job size, then each
// quantity's growth per 4x of N between the smallest and largest size.
func scaleTable(spc string, runs []scaleRun) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nBenchmarkAgentScale: --reft=%s, dp=4 (N/4 groups), one spare; per agent: the phase's frames sent+received (max, median),\n"+
		"background frames per second (pings, beats), connections open at the phase's end, memory share (heap after GC, RSS, goroutines)\n", spc)
	fmt.Fprintf(&sb, "%-8s %5s %8s | %9s %9s | %8s %8s | %6s %6s %6s | %9s %9s %7s | %5s %4s | %s\n",
		"phase", "N", "secs", "frames", "(median)", "bg/s", "(median)", "conns", "(med)", "opened", "heap KiB", "RSS KiB", "gorout", "susp", "verd", "busiest agent's frames")
	for pi := range runs[0].phases {
		for _, r := range runs {
			p := r.phases[pi]
			unit := ""
			if p.name == "idle" {
				unit = " (per s)"
			}
			if p.top == "" {
				p.top = "none"
			}
			bg := fmt.Sprintf("%8.1f %8.1f", p.pings.max, p.pings.med)
			if p.secs < 0.5 { // too short for a rate
				bg = fmt.Sprintf("%8s %8s", "-", "-")
			}
			fmt.Fprintf(&sb, "%-8s %5d %8.2f | %9.1f %9.1f | %s | %6.0f %6.0f %6.0f | %9.0f %9.0f %7.1f | %5d %4d | %s%s\n",
				p.name, r.n, p.secs, p.ctrl.max, p.ctrl.med, bg, p.conns.max, p.conns.med, p.opened.max,
				p.heap/1024, p.rss/1024, p.routines, p.suspicions, p.verdicts, p.top, unit)
		}
	}
	for _, r := range runs {
		fmt.Fprintf(&sb, "detect   %5d: stop to the last survivor's verdict %.2f s (class %s)\n", r.n, r.detectS, r.class)
	}
	if len(runs) < 2 {
		return sb.String()
	}
	lo, hi := runs[0], runs[len(runs)-1]
	k := math.Log(4) / math.Log(float64(hi.n)/float64(lo.n))
	g := func(a, b float64) string {
		if a <= 0 || math.IsInf(a, 0) || math.IsInf(b, 0) {
			return "-"
		}
		return fmt.Sprintf("%.2f", math.Pow(b/a, k))
	}
	fmt.Fprintf(&sb, "growth per 4x of N (N=%d to N=%d; 1.00: constant, 4.00: linear)\n", lo.n, hi.n)
	fmt.Fprintf(&sb, "%-8s | %6s %6s | %6s %6s | %6s %6s | %6s %6s\n", "phase", "frames", "(med)", "bg/s", "(med)", "conns", "(med)", "heap", "RSS")
	for pi := range lo.phases {
		a, c := lo.phases[pi], hi.phases[pi]
		if a.secs < 0.5 || c.secs < 0.5 { // too short for a rate
			a.pings, c.pings = stat{}, stat{}
		}
		fmt.Fprintf(&sb, "%-8s | %6s %6s | %6s %6s | %6s %6s | %6s %6s\n", a.name, g(a.ctrl.max, c.ctrl.max), g(a.ctrl.med, c.ctrl.med),
			g(a.pings.max, c.pings.max), g(a.pings.med, c.pings.med), g(a.conns.max, c.conns.max), g(a.conns.med, c.conns.med),
			g(a.heap, c.heap), g(a.rss, c.rss))
	}
	return sb.String()
}

// raiseNoFile lifts this process's open-files limit to at least want, or
// fails the size at once, naming the limit: the meshes could never connect
// every peer.
func raiseNoFile(b *testing.B, want int) {
	if err := setNoFile(uint64(want)); err != nil {
		b.Fatalf("open-files limit: %v. The all-to-all mesh needs 2N(N+1) descriptors for N agents in one process: "+
			"raise the hard limit (ulimit -Hn, or run with CAP_SYS_RESOURCE) or pick a smaller REFT_SCALE_N", err)
	}
}

func setNoFile(want uint64) error {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return err
	}
	if l.Cur >= want {
		return nil
	}
	n := l
	n.Cur = want
	n.Max = max(l.Max, want)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &n); err != nil {
		return fmt.Errorf("raising it from %d (hard %d) to %d: %w", l.Cur, l.Max, want, err)
	}
	return nil
}
