package restore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/erasure"
	"github.com/reft-hpc/reft/agent/logging/logtest"
	"github.com/reft-hpc/reft/agent/peer"
	"github.com/reft-hpc/reft/agent/sg"
	"github.com/reft-hpc/reft/agent/shard"
	"github.com/reft-hpc/reft/internal/crc32c"
	"github.com/reft-hpc/reft/tmpfs"
)

// The assembly tests' group is the planner tests' (dp=4, rank r on node
// n<r+1>, this node n1 restoring rank 0) with a 4000-byte slice, four
// shards of 1000 bytes, each served in chunks of 256: the Planner plans
// from a view of what the fake nodes hold, and the Assembler executes the
// plan against them.
const (
	slice     = 4000
	chunkSize = 256
	self      = "n1"
)

// world is the job's nodes as the fakes see them: node -> generation ->
// section -> bytes.
type world struct {
	data   []byte // the slice every member saved
	parity int    // a member's parity section, 0 without aec
	secs   map[string]map[peer.GenKey]map[string][]byte
	// corrupt: node -> section -> the chunk a peer serves corrupt (a local
	// copy with any entry fails its checksum).
	corrupt map[string]map[string]int
	// block: fetches from this node wait until their context ends, and
	// then set cancelled.
	block     string
	cancelled atomic.Bool
}

func genKey(r int, shardName string) peer.GenKey {
	return peer.GenKey{Rank: r, Shard: shardName, Step: 7, Seq: 1}
}

func shardRange(q int) sg.Range { return sg.ShardRange(slice, m, q) }

// newWorld saves step 7 of every member under spc on its host (node(r)
// unless hosts says), except lost's.
func newWorld(t *testing.T, spc string, lost []int, hosts map[int]string) (*world, Group, *View) {
	t.Helper()
	g := testGroup(t, spc, 0, false)
	w := &world{data: make([]byte, slice), secs: map[string]map[peer.GenKey]map[string][]byte{}, corrupt: map[string]map[string]int{}}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range w.data {
		w.data[i] = byte(rng.Uint32())
	}
	var codec *erasure.Codec
	if g.Parity {
		var cut []erasure.Range
		for q := range m {
			r := shardRange(q)
			cut = append(cut, erasure.Range{Off: int(r.Off), Len: int(r.Len)})
		}
		el, err := erasure.NewLayout(erasure.Params{Members: m, Parity: max(g.Spec.AECParity, 1), Size: slice, ARC: g.ARC, Shards: cut})
		if err != nil {
			t.Fatal(err)
		}
		if codec, err = erasure.NewCodec(el, 1); err != nil {
			t.Fatal(err)
		}
		w.parity = el.ParitySize()
	}
	v := NewView(testTime)
	for r := range m {
		if slices.Contains(lost, r) {
			continue
		}
		secs := map[string][]byte{shard.Own: w.shard(r)}
		if g.ARC {
			secs[shard.ARC] = w.shard((r + 1) % m)
		}
		if codec != nil {
			secs[shard.Parity] = make([]byte, w.parity)
			if err := codec.Encode(r, w.data, secs[shard.Parity]); err != nil {
				t.Fatal(err)
			}
		}
		n := node(r)
		if h, ok := hosts[r]; ok {
			n = h
		}
		w.put(n, genKey(r, tmpfs.DefaultShard), secs)
		if n == self {
			n = ""
		}
		v.Add(n, peer.Watermark{Rank: r, Shard: tmpfs.DefaultShard, Step: 7, Seq: 1})
	}
	v.SortLocalFirst()
	return w, g, v
}

func (w *world) shard(q int) []byte {
	r := shardRange(q)
	return slices.Clone(w.data[r.Off:r.End()])
}

func (w *world) put(n string, k peer.GenKey, secs map[string][]byte) {
	if w.secs[n] == nil {
		w.secs[n] = map[peer.GenKey]map[string][]byte{}
	}
	w.secs[n][k] = secs
}

// Read is this node's store (Local).
func (w *world) Read(dst []byte, c Cand) error {
	b, ok := w.secs[self][c.Loc.Key][c.Sec]
	switch {
	case !ok:
		return fmt.Errorf("%s is no longer in this node's store", c.Loc.Key)
	case len(b) != len(dst):
		return fmt.Errorf("%s has no section %s of %d bytes", c.Loc.Key, c.Sec, len(dst))
	}
	if _, bad := w.corrupt[self][c.Sec]; bad {
		return fmt.Errorf("%s section %s chunk 0: %w", c.Loc.Key, c.Sec, tmpfs.ErrCorrupt)
	}
	copy(dst, b)
	return nil
}

// fakePeers are the other nodes (Peers): manifests with every chunk's
// checksum, and fetches that take each chunk from the first source whose
// bytes match it, recording the sources that failed it, as peer.Fetch
// does.
type fakePeers struct{ w *world }

func (p fakePeers) Manifest(ctx context.Context, n string, k peer.GenKey) (*peer.GenInfo, error) {
	gen, ok := p.w.secs[n][k]
	if !ok {
		return nil, fmt.Errorf("%s: no generation %s", n, k)
	}
	info := &peer.GenInfo{ChunkSize: chunkSize}
	for name, b := range gen {
		bi := peer.BufferInfo{Name: name, Size: int64(len(b))}
		for lo := 0; lo < len(b); lo += chunkSize {
			bi.CRC32C = append(bi.CRC32C, crc32c.Checksum(b[lo:min(lo+chunkSize, len(b))]))
		}
		info.Buffers = append(info.Buffers, bi)
	}
	return info, nil
}

func (p fakePeers) Source(ctx context.Context, n string, k peer.ChunkKey) (peer.Source, error) {
	return peer.Source{Addr: n + ":7000", Key: k}, nil
}

func (p fakePeers) Fetch(ctx context.Context, spec peer.FetchSpec) (peer.FetchStats, error) {
	var fs peer.FetchStats
	var failed []peer.ChunkFailure
	chunks := int((spec.Size + spec.ChunkSize - 1) / spec.ChunkSize)
	for i := range chunks {
		lo, hi := int64(i)*spec.ChunkSize, min(int64(i+1)*spec.ChunkSize, spec.Size)
		var tries []peer.Attempt
		for _, src := range spec.Sources {
			n := strings.TrimSuffix(src.Addr, ":7000")
			if n == p.w.block {
				<-ctx.Done()
				p.w.cancelled.Store(true)
				return fs, ctx.Err()
			}
			b := slices.Clone(p.w.secs[n][src.Key.GenKey][src.Key.Buffer][lo:hi])
			if c, ok := p.w.corrupt[n][src.Key.Buffer]; ok && c == i {
				b[0] ^= 0xff
			}
			if crc32c.Checksum(b) != spec.CRC[i] {
				tries = append(tries, peer.Attempt{Source: src, Err: errors.New("checksum mismatch")})
				continue
			}
			copy(spec.Dst[lo:], b)
			if spec.Progress != nil {
				spec.Progress(hi - lo)
			}
			if len(tries) > 0 {
				fs.Recovered = append(fs.Recovered, peer.ChunkRecovery{Chunk: i, Attempts: tries, From: src})
			}
			tries = nil
			break
		}
		if tries != nil {
			failed = append(failed, peer.ChunkFailure{Chunk: i, Attempts: tries})
		}
	}
	if failed != nil {
		return fs, &peer.FetchError{Failed: failed, Total: chunks}
	}
	return fs, nil
}

// assembler is an Assembler over w, logging to log.
func (w *world) assembler(st *Stats, log *logtest.Buffer, progress *atomic.Int64) *Assembler {
	return &Assembler{Local: w, Peers: func(context.Context) Peers { return fakePeers{w} }, Log: zerolog.New(log),
		Stats: st, Progress: func(n int64) { progress.Add(n) }}
}

// target is an empty slice of the test group's geometry.
func (w *world) target(g Group) Target {
	t := Target{Rep: make([]byte, slice), ParitySize: w.parity}
	for q := range m {
		t.Shards = append(t.Shards, shardRange(q))
	}
	if g.Parity {
		t.Decoder = w.decoder(g)
	}
	return t
}

func (w *world) decoder(g Group) *erasure.Codec {
	var cut []erasure.Range
	for q := range m {
		r := shardRange(q)
		cut = append(cut, erasure.Range{Off: int(r.Off), Len: int(r.Len)})
	}
	el, err := erasure.NewLayout(erasure.Params{Members: m, Parity: max(g.Spec.AECParity, 1), Size: slice, ARC: g.ARC, Shards: cut})
	if err != nil {
		panic(err)
	}
	c, err := erasure.NewCodec(el, 2)
	if err != nil {
		panic(err)
	}
	return c
}

// persistedPlan is what the agent's persistent-tier fallback builds: every
// member's persisted generation loaded into this node's store.
func persistedPlan(w *world) *Plan {
	p := &Plan{Step: 7, OK: true, Ring: []int{0, 1, 2, 3}, Parity: make([][]Cand, m)}
	for r := range m {
		k := genKey(r, shard.Persisted+"-for-0")
		w.put(self, k, map[string][]byte{shard.Own: w.shard(r)})
		p.Shards = append(p.Shards, ShardSource{Pos: r, Rank: r, Source: sg.SourcePersistent,
			Cands: []Cand{{Loc: Loc{Key: k}, Sec: shard.Own}}})
	}
	return p
}

// TestAssemble: plans from the Planner (or the persistent fallback's)
// executed against fake nodes: the slice comes back bit-exact, and the
// bytes are counted by where they came from.
func TestAssemble(t *testing.T) {
	const sh = 1000 // a shard
	n1host := map[int]string{0: self, 2: self, 3: self}
	cases := []struct {
		name  string
		spec  string
		lost  []int
		hosts map[int]string
		setup func(w *world)
		// persisted: the persistent-tier plan instead of the Planner's.
		persisted bool
		// want, with P a parity section's size
		local, peer, decoded func(P int64) int64
		peers                []string
		failovers            int64
		chunkFailover        []string // chunk_failover events: "section: copies failed, chunks failed>from"
	}{
		{name: "all local (persisted fallback)", spec: "aec", persisted: true,
			local: c(4 * sh), peer: c(0), decoded: c(0)},
		{name: "one peer", spec: "aec", hosts: n1host,
			local: c(3 * sh), peer: c(sh), decoded: c(0), peers: []string{"n2"}},
		{name: "arc, nothing lost", spec: "arc",
			local: c(2 * sh), peer: c(2 * sh), decoded: c(0), peers: []string{"n2", "n3", "n4"}},
		{name: "arc, rank 2 lost: its ARC copy on n2", spec: "arc", lost: []int{2},
			local: c(2 * sh), peer: c(2 * sh), decoded: c(0), peers: []string{"n2", "n4"}},
		{name: "aec, rank 2 lost: decoded", spec: "aec", lost: []int{2},
			local: func(P int64) int64 { return sh + P }, peer: func(P int64) int64 { return 2*sh + 2*P },
			decoded: c(sh), peers: []string{"n2", "n4"}},
		{name: "aec:2, ranks 1 and 2 lost: decoded", spec: "aec:2", lost: []int{1, 2},
			local: func(P int64) int64 { return sh + P }, peer: func(P int64) int64 { return sh + P },
			decoded: c(2 * sh), peers: []string{"n4"}},
		{name: "arc+aec, ranks 1 and 2 lost: an ARC copy and a decode", spec: "arc+aec", lost: []int{1, 2},
			local: func(P int64) int64 { return 2*sh + P }, peer: func(P int64) int64 { return sh + P },
			decoded: c(sh), peers: []string{"n4"}},
		{name: "a corrupt peer chunk: the next copy gives it", spec: "arc",
			setup: func(w *world) { w.corrupt["n3"] = map[string]int{shard.Own: 1} },
			local: c(2 * sh), peer: c(2 * sh), decoded: c(0), peers: []string{"n2", "n3", "n4"}, failovers: 1,
			chunkFailover: []string{"rep@shard: [], [chunk 1: n3: checksum mismatch>n2]"}},
		{name: "a corrupt local copy: a peer's gives it", spec: "arc",
			setup: func(w *world) { w.corrupt[self] = map[string]int{shard.Own: 0} },
			local: c(sh), peer: c(3 * sh), decoded: c(0), peers: []string{"n2", "n3", "n4"}, failovers: 1,
			chunkFailover: []string{"rep@shard: [rank 0 shard state step 7 seq 1 section rep@shard chunk 0: snapshot chunk corrupt], []"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w, g, v := newWorld(t, tc.spec, tc.lost, tc.hosts)
			if tc.setup != nil {
				tc.setup(w)
			}
			p := new(Plan)
			if tc.persisted {
				p = persistedPlan(w)
			} else if *p = (Planner{Node: self}).Plan(g, v, 7); !p.OK {
				t.Fatalf("plan: %v", p.Reasons)
			}
			var st Stats
			var log logtest.Buffer
			log.CheckEvents(t)
			var progress atomic.Int64
			tg := w.target(g)
			if err := w.assembler(&st, &log, &progress).Assemble(t.Context(), p, tg); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(tg.Rep, w.data) {
				t.Fatal("the assembled slice differs from the saved one")
			}
			P := int64(w.parity)
			got := [3]int64{st.Local.Load(), st.Peer.Load(), st.Decoded.Load()}
			if want := [3]int64{tc.local(P), tc.peer(P), tc.decoded(P)}; got != want {
				t.Errorf("bytes local, peer, decoded = %v, want %v (parity section %d)", got, want, P)
			}
			if progress.Load() != got[0]+got[1]+got[2] {
				t.Errorf("progress told %d bytes, the stats count %d", progress.Load(), got[0]+got[1]+got[2])
			}
			if !slices.Equal(st.Peers(), tc.peers) {
				t.Errorf("peers %v, want %v", st.Peers(), tc.peers)
			}
			if st.Failovers.Load() != tc.failovers {
				t.Errorf("failovers %d, want %d", st.Failovers.Load(), tc.failovers)
			}
			var fo []string
			for _, e := range log.Events("chunk_failover") {
				fo = append(fo, describeFailover(e))
			}
			if !slices.Equal(fo, tc.chunkFailover) {
				t.Errorf("chunk_failover events:\n%q\nwant\n%q", fo, tc.chunkFailover)
			}
		})
	}
}

func c(n int64) func(int64) int64 { return func(int64) int64 { return n } }

// describeFailover is a chunk_failover event as a test names it.
func describeFailover(e map[string]any) string {
	var chunks []string
	if cs, ok := e["chunks"].([]any); ok {
		for _, x := range cs {
			ch := x.(map[string]any)
			chunks = append(chunks, fmt.Sprintf("chunk %v: %s>%v", ch["chunk"], strings.Join(toStrings(ch["failed"]), "; "), ch["from"]))
		}
	}
	return fmt.Sprintf("%v: [%s], [%s]", e["section"], strings.Join(toStrings(e["copies_failed"]), "; "), strings.Join(chunks, "; "))
}

func toStrings(x any) []string {
	var out []string
	xs, _ := x.([]any)
	for _, s := range xs {
		out = append(out, fmt.Sprint(s))
	}
	return out
}

// TestAssembleFails: a section no copy can give fails the assembly,
// naming it, and the first such failure cancels the fetches still running
// (errgroup): the fetch from n2, which would wait for ever, sees its
// context end.
func TestAssembleFails(t *testing.T) {
	cases := []struct {
		name, spec string
		setup      func(w *world)
		want       string
		cancelled  bool
	}{
		{name: "a node gone since the view", spec: "aec",
			setup: func(w *world) { delete(w.secs, "n3") },
			want:  "shard 2 (rank 2, local): n3: no generation"},
		{name: "every copy of a chunk corrupt", spec: "arc",
			setup: func(w *world) {
				w.corrupt["n3"] = map[string]int{shard.Own: 2}
				w.corrupt["n2"] = map[string]int{shard.ARC: 2}
			},
			want: "shard 2 (rank 2, local): fetch: 1 of 4 chunks failed from every source; chunk 2: [n3:7000: checksum mismatch] [n2:7000: checksum mismatch]"},
		{name: "peering off", spec: "aec",
			setup: func(w *world) { w.block = "off" },
			want:  "peering is off: the copies on other nodes cannot be read"},
		{name: "the first failure cancels the rest", spec: "aec",
			setup:     func(w *world) { w.block = "n2"; delete(w.secs, "n3") },
			want:      "shard 2 (rank 2, local): n3: no generation",
			cancelled: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w, g, v := newWorld(t, tc.spec, nil, nil)
				p := (Planner{Node: self}).Plan(g, v, 7)
				tc.setup(w)
				var log logtest.Buffer
				var progress atomic.Int64
				a := w.assembler(nil, &log, &progress)
				if w.block == "off" {
					a.Peers = func(context.Context) Peers { return nil }
				}
				err := a.Assemble(t.Context(), &p, w.target(g))
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("err %v, want one containing %q", err, tc.want)
				}
				if w.cancelled.Load() != tc.cancelled {
					t.Errorf("the blocked fetch cancelled: %v, want %v", w.cancelled.Load(), tc.cancelled)
				}
			})
		})
	}
}

// TestAssembleCancel: cancelling the context mid-fetch (the rank went
// away, the agent stops) ends the assembly with the context's error.
func TestAssembleCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, g, v := newWorld(t, "aec", nil, nil)
		w.block = "n3"
		p := (Planner{Node: self}).Plan(g, v, 7)
		ctx, cancel := context.WithCancel(t.Context())
		var log logtest.Buffer
		var progress atomic.Int64
		done := make(chan error)
		go func() { done <- w.assembler(nil, &log, &progress).Assemble(ctx, &p, w.target(g)) }()
		synctest.Wait() // every other fetch done; n3's waiting
		select {
		case err := <-done:
			t.Fatalf("the assembly ended before its fetch from n3 did: %v", err)
		default:
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("err %v, want context.Canceled", err)
		}
		if !w.cancelled.Load() {
			t.Error("the fetch from n3 did not see its context end")
		}
	})
}
