package restore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/reft-hpc/reft/agent/event"
	"github.com/reft-hpc/reft/agent/peer"
	"github.com/reft-hpc/reft/agent/sg"
	"github.com/reft-hpc/reft/internal/crc32c"
	"github.com/reft-hpc/reft/tmpfs"
)

// Peers is what an assembly needs of the job's other agents: a
// generation's manifest on a node, a section of it as a fetch source, and
// a fetch of one section from several sources with chunk-level failover.
// agent/mesh's Mesh is one.
//
// Contract: the Assembler calls it from its own goroutines, several at
// once (one per section in flight). Each call may block on the network
// and must return once ctx ends (with ctx's error or one wrapping it).
// Fetch writes only into spec.Dst and calls spec.Progress from any
// goroutine; it reports the chunks that a source failed and another
// delivered in FetchStats.Recovered. No method calls back into the
// Assembler.
type Peers interface {
	Manifest(ctx context.Context, node string, k peer.GenKey) (*peer.GenInfo, error)
	Source(ctx context.Context, node string, k peer.ChunkKey) (peer.Source, error)
	Fetch(ctx context.Context, spec peer.FetchSpec) (peer.FetchStats, error)
}

// Local reads this node's store.
//
// Contract: Read fills dst with section c.Sec of generation c.Loc.Key
// (c.Loc.Node is ""), every chunk verified against its checksum, and
// fails when the generation is gone or marked bad, has no section of
// len(dst) bytes, or a chunk does not verify. It is called from several
// goroutines at once, does not block on anything but the store's memory,
// and does not call back into the Assembler.
type Local interface {
	Read(dst []byte, c Cand) error
}

// StoreLocal is Local over a node's snapshot store.
type StoreLocal struct{ Store *tmpfs.Store }

// Read implements Local.
func (l StoreLocal) Read(dst []byte, c Cand) error {
	k := tmpfs.Key{Rank: c.Loc.Key.Rank, Shard: c.Loc.Key.Shard}
	gens := l.Store.Generations(k)
	i := slices.IndexFunc(gens, func(g tmpfs.Generation) bool {
		return g.Step == c.Loc.Key.Step && g.Seq == c.Loc.Key.Seq && !g.Bad
	})
	if i < 0 {
		return fmt.Errorf("%s is no longer in this node's store", c.Loc.Key)
	}
	r, err := l.Store.Open(gens[i])
	if err != nil {
		return err
	}
	defer r.Close()
	if b := slices.IndexFunc(r.Manifest().Buffers, func(b tmpfs.Buffer) bool { return b.Name == c.Sec }); b < 0 || r.Manifest().Buffers[b].Size != int64(len(dst)) {
		return fmt.Errorf("%s has no section %s of %d bytes: the sharding group's members registered different replicated buffers (is the layout, dp= pp= tp=, the trainer's?)", c.Loc.Key, c.Sec, len(dst))
	}
	var off int64
	for n := 0; off < int64(len(dst)); n++ {
		b, crc, err := r.Chunk(c.Sec, n)
		if err != nil {
			return err
		}
		if crc32c.Checksum(b) != crc {
			return fmt.Errorf("%s section %s chunk %d: %w", c.Loc.Key, c.Sec, n, tmpfs.ErrCorrupt)
		}
		if off+int64(len(b)) > int64(len(dst)) {
			return fmt.Errorf("%s section %s is larger than %d bytes", c.Loc.Key, c.Sec, len(dst))
		}
		copy(dst[off:], b)
		off += int64(len(b))
	}
	return nil
}

// Stats is what an assembly did. The counters are safe for concurrent use.
type Stats struct {
	Local, Peer, Decoded atomic.Int64 // bytes by where they came from
	// Failovers counts the chunks (and local sections) that a copy
	// failed, a checksum mismatch or a lost peer, and another gave.
	Failovers atomic.Int64
	peers     sync.Map // node -> struct{}
}

// Peers are the nodes named as sources of a peer fetch (a fetch may
// take every chunk from the first), sorted.
func (st *Stats) Peers() []string {
	var out []string
	st.peers.Range(func(k, _ any) bool { out = append(out, k.(string)); return true })
	sort.Strings(out)
	return out
}

// Assembler executes restore plans: it fills sections from their
// candidates (a local copy that verifies first, then the peers') and
// decodes lost shards from parity. It is a value to build per restore (or
// per read); its fields are read-only while it runs.
type Assembler struct {
	Local Local
	// Peers returns the job's other agents, waiting for peering to start
	// if it must; nil: peering is off, and copies on other nodes cannot be
	// read. Called once per section that needs a peer, from the
	// assembly's goroutines.
	Peers func(ctx context.Context) Peers
	// AskTimeout bounds each candidate's manifest and source lookup
	// (besides ctx); 0: ctx only.
	AskTimeout time.Duration
	// Log receives chunk_failover lines.
	Log zerolog.Logger
	// Stats, if set, counts what the assembly did.
	Stats *Stats
	// Progress, if set, is told every verified byte count that lands,
	// from several goroutines at once.
	Progress func(n int64)
}

// Section is a replicated buffer's place in the slice.
type Section struct {
	Name      string
	Off, Size int64
}

// Other is an unreplicated buffer to restore whole into Dst.
type Other struct {
	Name string
	Dst  []byte
	// AOR: an AOR optimizer-state buffer, restored from Plan.Opt rather
	// than Plan.Others.
	AOR bool
}

// Decoder rebuilds lost shards from the others and the parity units
// (agent/erasure's Codec.Reconstruct: nil entries are unavailable).
type Decoder interface {
	Reconstruct(lost []int, shards, parities [][]byte) error
}

// Target is where an assembly writes and the geometry it needs.
type Target struct {
	// Rep is the replicated slice: shards by ring position at Shards.
	Rep    []byte
	Shards []sg.Range
	// Whole: the replicated buffers were saved whole (aor without arc or
	// aec): each of Replicated is fetched by its name from Plan.Whole's
	// copies, and the plan's shards are not fetched.
	Whole      bool
	Replicated []Section
	Others     []Other
	// ParitySize is one member's parity section; Decoder decodes. Both
	// are needed only when the plan decodes.
	ParitySize int
	Decoder    Decoder
}

func (a *Assembler) stats() *Stats {
	if a.Stats == nil {
		return &Stats{}
	}
	return a.Stats
}

func (a *Assembler) progress(n int64) {
	if a.Progress != nil {
		a.Progress(n)
	}
}

// Assemble fills t with plan p's state: every section fetched at once
// under one errgroup, so that the first section no copy can give cancels
// the others' fetches and is the error returned; then the lost shards
// decoded. On error t holds partial data.
func (a *Assembler) Assemble(ctx context.Context, p *Plan, t Target) error {
	g, gctx := errgroup.WithContext(ctx)
	fetch := func(dst []byte, cs []Cand, what func() string) {
		g.Go(func() error {
			if err := a.Fetch(gctx, dst, cs); err != nil {
				return fmt.Errorf("%s: %w", what(), err)
			}
			return nil
		})
	}
	for _, b := range t.Replicated {
		if !t.Whole || b.Size == 0 {
			continue
		}
		cs := withSection(p.Whole, b.Name)
		fetch(t.Rep[b.Off:b.Off+b.Size], cs, func() string { return fmt.Sprintf("buffer %q", b.Name) })
	}
	for _, sh := range p.Shards {
		if len(sh.Cands) == 0 || t.Whole {
			continue // decoded below, or fetched whole above
		}
		r := t.Shards[sh.Pos]
		fetch(t.Rep[r.Off:r.End()], sh.Cands, func() string {
			return fmt.Sprintf("shard %d (rank %d, %s)", sh.Pos, sh.Rank, sh.Source)
		})
	}
	for _, b := range t.Others {
		cs := withSection(p.Others, b.Name)
		if b.AOR {
			cs = p.Opt[b.Name]
		}
		fetch(b.Dst, cs, func() string { return fmt.Sprintf("buffer %q", b.Name) })
	}
	if err := g.Wait(); err != nil {
		return err
	}
	if len(p.Decode) > 0 {
		return a.decode(ctx, p, t)
	}
	return nil
}

// withSection is cs's locations, each with section sec.
func withSection(cs []Cand, sec string) []Cand {
	var out []Cand
	for _, c := range cs {
		out = append(out, Cand{Loc: c.Loc, Sec: sec})
	}
	return out
}

// decode rebuilds the plan's lost shards in t.Rep from the other shards
// (already there) and the surviving members' parity. A parity unit that
// cannot be fetched is left out: the decoder says whether the rest do.
func (a *Assembler) decode(ctx context.Context, p *Plan, t Target) error {
	m := len(t.Shards)
	shards := make([][]byte, m)
	for q, r := range t.Shards {
		shards[q] = t.Rep[r.Off:r.End()]
	}
	parities := make([][]byte, m)
	var wg sync.WaitGroup
	for q := range m {
		if slices.Contains(p.Decode, q) || len(p.Parity[q]) == 0 {
			continue
		}
		buf := make([]byte, t.ParitySize)
		wg.Go(func() {
			if err := a.Fetch(ctx, buf, p.Parity[q]); err == nil {
				parities[q] = buf
			}
		})
	}
	wg.Wait()
	if err := t.Decoder.Reconstruct(p.Decode, shards, parities); err != nil {
		return fmt.Errorf("decoding shards %v from parity: %w", p.Decode, err)
	}
	st := a.stats()
	for _, q := range p.Decode {
		st.Decoded.Add(t.Shards[q].Len)
		a.progress(t.Shards[q].Len)
	}
	return nil
}

// Fetch fills dst with a section that each candidate holds whole: from
// this node's store if a local copy verifies, else from the peers, a chunk
// that fails its checksum taken from the next copy. Every copy that failed
// while another delivered is logged (chunk_failover) and counted.
func (a *Assembler) Fetch(ctx context.Context, dst []byte, cands []Cand) error {
	st := a.stats()
	var lastErr error
	var remote []Cand
	var bad []string // copies that failed, with why
	for _, c := range cands {
		if c.Loc.Node != "" {
			remote = append(remote, c)
			continue
		}
		if err := a.Local.Read(dst, c); err != nil {
			lastErr = err
			bad = append(bad, err.Error())
			continue
		}
		st.Local.Add(int64(len(dst)))
		a.progress(int64(len(dst)))
		a.logFailover(c, bad, nil, nil, "this node")
		return nil
	}
	if len(remote) == 0 {
		if lastErr == nil {
			lastErr = errors.New("no copy of it survives")
		}
		return lastErr
	}
	var ps Peers
	if a.Peers != nil {
		ps = a.Peers(ctx)
	}
	if ps == nil {
		return errors.Join(lastErr, errors.New("peering is off: the copies on other nodes cannot be read"))
	}
	spec, nodeOf, bad, err := a.sources(ctx, ps, dst, remote, bad)
	if err != nil {
		return err
	}
	if len(dst) == 0 {
		return nil
	}
	fs, err := ps.Fetch(ctx, spec)
	if err != nil {
		return err
	}
	st.Peer.Add(int64(len(dst)))
	a.logFailover(cands[0], bad, fs.Recovered, nodeOf, "peers")
	return nil
}

// sources asks each remote candidate for its manifest and a fetch source
// of the section, and returns the fetch of dst from those that hold it
// with the first one's chunking; nodeOf maps a source's address to its
// node, and bad gains the candidates that could not serve. The error
// (only when no candidate can) is the last candidate's.
func (a *Assembler) sources(ctx context.Context, ps Peers, dst []byte, remote []Cand, bad []string) (spec peer.FetchSpec, nodeOf map[string]string, _ []string, err error) {
	nodeOf = map[string]string{}
	st := a.stats()
	for _, c := range remote {
		info, src, e := a.ask(ctx, ps, c)
		if e != nil {
			err = e
			bad = append(bad, fmt.Sprintf("%s on %s: %v", c.Sec, c.Loc.Node, e))
			continue
		}
		b := info.Buffer(c.Sec)
		if b == nil || b.Size != int64(len(dst)) {
			err = fmt.Errorf("%s on %s has no section %s of %d bytes", c.Loc.Key, c.Loc.Node, c.Sec, len(dst))
			bad = append(bad, err.Error())
			continue
		}
		if spec.Sources == nil {
			spec = peer.FetchSpec{ChunkSize: info.ChunkSize, Size: int64(len(dst)), CRC: b.CRC32C, Dst: dst, Progress: a.Progress}
		} else if info.ChunkSize != spec.ChunkSize {
			continue // another chunking: its checksums do not compare
		}
		spec.Sources = append(spec.Sources, src)
		nodeOf[src.Addr] = c.Loc.Node
		st.peers.Store(c.Loc.Node, struct{}{})
	}
	if len(spec.Sources) == 0 {
		return spec, nodeOf, bad, err
	}
	return spec, nodeOf, bad, nil
}

// ask is one candidate's manifest and fetch source, within AskTimeout.
func (a *Assembler) ask(ctx context.Context, ps Peers, c Cand) (*peer.GenInfo, peer.Source, error) {
	if a.AskTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, a.AskTimeout)
		defer cancel()
	}
	info, err := ps.Manifest(ctx, c.Loc.Node, c.Loc.Key)
	if err != nil {
		return nil, peer.Source{}, err
	}
	src, err := ps.Source(ctx, c.Loc.Node, peer.ChunkKey{GenKey: c.Loc.Key, Buffer: c.Sec})
	return info, src, err
}

// ChunkFailover is one chunk that a copy failed and another delivered, as
// the chunk_failover event lists it.
type ChunkFailover struct {
	Chunk  int      `json:"chunk"`
	Failed []string `json:"failed"` // "node: why", in the order tried
	From   string   `json:"from"`   // the node that delivered it
}

// logFailover says, once per section, which copies failed (whole: local
// copies and peers that could not serve the section; chunks: the chunks a
// peer failed and another delivered) and counts them.
func (a *Assembler) logFailover(c Cand, whole []string, chunks []peer.ChunkRecovery, nodeOf map[string]string, by string) {
	if len(whole) == 0 && len(chunks) == 0 {
		return
	}
	n := len(whole)
	fo := make([]ChunkFailover, len(chunks))
	for i, rc := range chunks {
		fo[i] = ChunkFailover{Chunk: rc.Chunk, From: nodeOf[rc.From.Addr]}
		for _, at := range rc.Attempts {
			fo[i].Failed = append(fo[i].Failed, fmt.Sprintf("%s: %v", nodeOf[at.Source.Addr], at.Err))
		}
		n += len(rc.Attempts)
	}
	a.stats().Failovers.Add(int64(n))
	a.Log.Warn().Str("event", event.ChunkFailover).Int("owner_rank", c.Loc.Key.Rank).Int64("generation", c.Loc.Key.Step).Str("section", c.Sec).
		Strs("copies_failed", whole).Interface("chunks", fo).Int("failovers", n).
		Msgf("restore: %d read(s) of section %s failed (a checksum mismatch or a copy that could not be read); another copy served them (%s)", n, c.Sec, by)
}
