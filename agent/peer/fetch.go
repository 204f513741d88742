package peer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// Source is one place a chunk can be fetched from: a peer agent and the
// buffer of a generation there.
type Source struct {
	Addr string // host:port of the peer's listener
	Key  ChunkKey
}

// FetchSpec describes one buffer (or some of its chunks) to fetch.
type FetchSpec struct {
	// ChunkSize and Size lay out the buffer as the sources store it: chunk
	// i is bytes [i*ChunkSize, min((i+1)*ChunkSize, Size)). A source with
	// another layout answers `mismatch` and the next one is tried.
	ChunkSize int64
	Size      int64
	// Chunks to fetch; nil: all of them.
	Chunks []int
	// CRC, if set, is the CRC-32C of every chunk (a manifest's list);
	// chunks are then verified against it as well as against each
	// source's stored checksum.
	CRC []uint32
	// Sources are the candidates for every chunk, in order of preference.
	// SourcesFor, if set, gives each chunk its own list instead.
	Sources    []Source
	SourcesFor func(chunk int) []Source

	// Exactly one of Dst and Deliver. Dst (len Size) receives every chunk
	// in place, straight from the socket. Deliver gets each verified chunk
	// once, possibly from several goroutines at once; data is valid only
	// during the call. Deliver's memory is bounded by the window per
	// request.
	Dst     []byte
	Deliver func(chunk int, data []byte) error

	// Progress, if set, is told the length of every chunk as it lands
	// verified (from several goroutines at once): a long fetch's progress.
	Progress func(n int64)

	// Window is the bytes one request may have in flight; 0: Config.Window.
	Window int64
	// Background marks replication traffic: rate-limited by
	// Config.Background on both agents. Restores leave it false.
	Background bool
}

func (s *FetchSpec) chunkLen(i int) int64 {
	lo := int64(i) * s.ChunkSize
	return min(s.ChunkSize, s.Size-lo)
}

func (s *FetchSpec) sources(i int) []Source {
	if s.SourcesFor != nil {
		return s.SourcesFor(i)
	}
	return s.Sources
}

// FetchStats says how a fetch went.
type FetchStats struct {
	Chunks    int           // chunks landed and verified
	Bytes     int64         // their bytes
	Requests  int           // fetch requests sent
	Failovers int           // chunk attempts that failed and moved on
	Duration  time.Duration // wall time
	// Recovered are the chunks delivered after failed attempts (a
	// checksum mismatch, a source without them, a dead peer): which
	// sources failed them and why, and which delivered them.
	Recovered []ChunkRecovery
	// Buffered is the most receive-buffer bytes one request of a Deliver
	// fetch held at once: at most max(Window, ChunkSize), whatever the
	// peer sends (a fetch holds that per request in flight). 0 for Dst.
	Buffered int64
}

// ChunkRecovery is a chunk that a later source delivered.
type ChunkRecovery struct {
	Chunk    int
	Attempts []Attempt
	From     Source
}

// Attempt is one failed try of a chunk.
type Attempt struct {
	Source Source
	Err    error
}

// ChunkFailure is a chunk that no source could deliver.
type ChunkFailure struct {
	Chunk    int
	Attempts []Attempt
}

// FetchError lists the chunks that failed from every source. Every other
// chunk was delivered.
type FetchError struct {
	Failed []ChunkFailure
	Total  int
}

func (e *FetchError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "fetch: %d of %d chunks failed from every source", len(e.Failed), e.Total)
	for i, f := range e.Failed {
		if i == 3 {
			fmt.Fprintf(&b, "; ... (%d more)", len(e.Failed)-i)
			break
		}
		fmt.Fprintf(&b, "; chunk %d:", f.Chunk)
		if len(f.Attempts) == 0 {
			b.WriteString(" no source given")
		}
		for _, a := range f.Attempts {
			if errors.As(a.Err, new(*ConnError)) {
				fmt.Fprintf(&b, " [%v]", a.Err) // names the peer already
			} else {
				fmt.Fprintf(&b, " [%s: %v]", a.Source.Addr, a.Err)
			}
		}
	}
	return b.String()
}

// Retry policy for errors that are about the moment, not the source.
const (
	maxBusyRetries = 5
	busyBackoff    = 50 * time.Millisecond
	maxSameSource  = 3 // re-asks of one source after it failed another chunk
)

type chunkState struct {
	cands    []Source
	cur      int
	attempts []Attempt
	busy     int
	again    int
}

// Fetch gets chunks from their candidate sources, verifying each against
// the checksum the source recorded (and spec.CRC when given). A chunk that
// fails (checksum mismatch, source without it, dead or silent peer) is
// asked from its next candidate while the other requests go on; a peer
// whose connection failed is skipped for the rest of this fetch. It
// returns a *FetchError naming each chunk that every candidate failed.
func (cl *Client) Fetch(ctx context.Context, spec FetchSpec) (FetchStats, error) {
	start := time.Now()
	if err := spec.check(); err != nil {
		return FetchStats{}, err
	}
	chunks, state, err := chunkStates(&spec)
	if err != nil {
		return FetchStats{}, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	f := &fetcher{cl: cl, ctx: ctx, cancel: cancel, spec: spec, state: state, results: make(chan runResult), dead: map[string]error{}}
	f.launch(chunks)
	var fatal error
	for f.inflight > 0 {
		r := <-f.results
		f.inflight--
		if fatal == nil { // else draining
			fatal = f.settle(r)
		}
	}
	f.stats.Duration = time.Since(start)
	f.stats.Buffered = f.peak.Load()
	if fatal != nil {
		return f.stats, fatal
	}
	err = f.outcome(chunks)
	return f.stats, err
}

// chunkStates lists the chunks spec asks for (all when it names none),
// each once and inside the buffer, with its candidate sources.
func chunkStates(spec *FetchSpec) ([]int, map[int]*chunkState, error) {
	n := int(numChunks(spec.Size, spec.ChunkSize))
	chunks := spec.Chunks
	if chunks == nil {
		chunks = make([]int, n)
		for i := range chunks {
			chunks[i] = i
		}
	}
	state := make(map[int]*chunkState, len(chunks))
	for _, c := range chunks {
		if c < 0 || c >= n {
			return nil, nil, fmt.Errorf("fetch: chunk %d outside the buffer's %d chunks", c, n)
		}
		if state[c] != nil {
			return nil, nil, fmt.Errorf("fetch: chunk %d listed twice", c)
		}
		state[c] = &chunkState{cands: spec.sources(c)}
	}
	return chunks, state, nil
}

// fetcher is one Fetch call: its chunks' states, the requests in flight,
// the peers found dead and the stats. It lives on Fetch's goroutine; the
// requests' goroutines only read ctx, spec and cl and send on results,
// which Fetch drains until nothing is in flight.
type fetcher struct {
	cl       *Client
	ctx      context.Context
	cancel   context.CancelFunc
	spec     FetchSpec
	state    map[int]*chunkState
	results  chan runResult
	inflight int
	dead     map[string]error // peers whose connection failed: skipped
	failed   []int            // chunks every candidate failed
	stats    FetchStats
	peak     atomic.Int64
}

// launch asks each chunk of list from its current candidate, skipping
// dead peers, one request per contiguous run (spread over the peer's
// connections); a chunk out of candidates has failed.
func (f *fetcher) launch(list []int) {
	groups := map[Source][]int{}
	for _, c := range list {
		s := f.state[c]
		for s.cur < len(s.cands) && f.dead[s.cands[s.cur].Addr] != nil {
			s.attempts = append(s.attempts, Attempt{s.cands[s.cur], fmt.Errorf("skipped, failed earlier in this fetch: %w", f.dead[s.cands[s.cur].Addr])})
			s.cur++
		}
		if s.cur >= len(s.cands) {
			f.failed = append(f.failed, c)
			continue
		}
		groups[s.cands[s.cur]] = append(groups[s.cands[s.cur]], c)
	}
	for src, list := range groups {
		for i, run := range splitRuns(list, f.cl.cfg.ConnsPerPeer) {
			f.inflight++
			f.stats.Requests++
			go func() { f.results <- f.cl.run(f.ctx, &f.spec, src, run, i, &f.peak) }()
		}
	}
}

// later launches list again after d.
func (f *fetcher) later(list []int, d time.Duration) {
	f.inflight++
	// Fetch drains until inflight is 0, so this send is always
	// received, cancelled or not.
	time.AfterFunc(d, func() { f.results <- runResult{list: list, retry: true} })
}

// settle takes one request's result: a delayed retry is launched, a
// fatal end (Deliver failed, ctx done) cancels the rest and is returned;
// otherwise the good chunks count, and the others are asked again, from
// the next candidate or, when busy, from the same one after a backoff.
func (f *fetcher) settle(r runResult) error {
	if r.retry {
		if f.ctx.Err() == nil {
			f.launch(r.list)
		}
		return nil
	}
	if r.fatal != nil || f.ctx.Err() != nil {
		fatal := r.fatal
		if fatal == nil {
			fatal = f.ctx.Err()
		}
		f.cancel()
		return fatal
	}
	for _, c := range r.ok {
		f.stats.Chunks++
		f.stats.Bytes += f.spec.chunkLen(c)
	}
	var next, busy []int
	for c, err := range r.bad {
		next = append(next, f.moveOn(c, r.src, err))
	}
	if r.end != nil {
		n, b := f.ended(r)
		next, busy = append(next, n...), b
	}
	if len(busy) > 0 {
		f.later(busy, busyBackoff<<min(f.state[busy[0]].busy-1, 4))
	}
	if len(next) > 0 {
		f.launch(next)
	}
	return nil
}

// moveOn records chunk c's failed attempt at src and moves it to its next
// candidate.
func (f *fetcher) moveOn(c int, src Source, err error) int {
	s := f.state[c]
	s.attempts = append(s.attempts, Attempt{src, err})
	s.cur++
	f.stats.Failovers++
	return c
}

// ended sorts the chunks of a request that ended early: busy ones wait
// and ask the same source again (a few times), those the source did not
// fail itself (another chunk failed there) ask it again, the others move
// on. A connection that failed marks its peer dead for this fetch.
func (f *fetcher) ended(r runResult) (next, busy []int) {
	var e *Error
	isErr := errors.As(r.end, &e)
	var ce *ConnError
	if errors.As(r.end, &ce) {
		f.dead[r.src.Addr] = r.end
	}
	for _, c := range r.list {
		if slices.Contains(r.ok, c) || r.bad[c] != nil {
			continue
		}
		s := f.state[c]
		switch {
		case isErr && e.Code == CodeBusy && s.busy < maxBusyRetries:
			s.busy++
			busy = append(busy, c)
		case isErr && e.Chunk != nil && *e.Chunk != c && s.again < maxSameSource:
			s.again++ // another chunk failed there; this one may be fine
			next = append(next, c)
		default:
			next = append(next, f.moveOn(c, r.src, r.end))
		}
	}
	return next, busy
}

// outcome lists the chunks recovered from another candidate in the stats,
// and returns a *FetchError naming the chunks every candidate failed.
func (f *fetcher) outcome(chunks []int) error {
	for _, c := range chunks {
		if st := f.state[c]; len(st.attempts) > 0 && st.cur < len(st.cands) && !slices.Contains(f.failed, c) {
			f.stats.Recovered = append(f.stats.Recovered, ChunkRecovery{Chunk: c, Attempts: st.attempts, From: st.cands[st.cur]})
		}
	}
	slices.SortFunc(f.stats.Recovered, func(a, b ChunkRecovery) int { return a.Chunk - b.Chunk })
	if len(f.failed) == 0 {
		return nil
	}
	slices.Sort(f.failed)
	fe := &FetchError{Total: len(chunks)}
	for _, c := range f.failed {
		fe.Failed = append(fe.Failed, ChunkFailure{Chunk: c, Attempts: f.state[c].attempts})
	}
	return fe
}

// splitRuns cuts sorted chunk indexes into contiguous runs, then splits
// the longest runs until there are up to parts of them, so a large fetch
// spreads over the connections to one peer.
func splitRuns(list []int, parts int) [][]int {
	slices.Sort(list)
	var runs [][]int
	for i := 0; i < len(list); {
		j := i + 1
		for j < len(list) && list[j] == list[j-1]+1 {
			j++
		}
		runs = append(runs, list[i:j])
		i = j
	}
	for len(runs) < parts {
		k := 0
		for i := range runs {
			if len(runs[i]) > len(runs[k]) {
				k = i
			}
		}
		if len(runs[k]) < 2 {
			break
		}
		h := len(runs[k]) / 2
		a, b := runs[k][:h], runs[k][h:]
		runs = append(runs[:k], append([][]int{a, b}, runs[k+1:]...)...)
	}
	return runs
}

func (s *FetchSpec) check() error {
	switch {
	case s.ChunkSize <= 0 || s.ChunkSize > MaxPayload:
		return fmt.Errorf("fetch: chunk size %d outside (0, %d]", s.ChunkSize, MaxPayload)
	case s.Size < 0:
		return fmt.Errorf("fetch: negative size %d", s.Size)
	case (s.Dst == nil) == (s.Deliver == nil):
		return fmt.Errorf("fetch: give exactly one of Dst and Deliver")
	case s.Dst != nil && int64(len(s.Dst)) != s.Size:
		return fmt.Errorf("fetch: Dst is %d bytes, Size %d", len(s.Dst), s.Size)
	case s.CRC != nil && int64(len(s.CRC)) != numChunks(s.Size, s.ChunkSize):
		return fmt.Errorf("fetch: %d checksums for %d chunks", len(s.CRC), numChunks(s.Size, s.ChunkSize))
	case s.Sources == nil && s.SourcesFor == nil:
		return fmt.Errorf("fetch: no sources")
	}
	return nil
}
