package peer

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"github.com/reft-hpc/reft/internal/crc32c"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reft-hpc/reft/agent/logging/logtest"
	"github.com/rs/zerolog"
)

// fill writes bytes determined by seed into p.
func fill(p []byte, seed string) {
	h := fnv.New64a()
	h.Write([]byte(seed))
	x := h.Sum64() | 1
	for i := 0; i+8 <= len(p); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(p[i:], x)
	}
	for i := len(p) &^ 7; i < len(p); i++ {
		p[i] = byte(x >> (8 * (i & 7)))
	}
}

func pattern(n int64, seed string) []byte {
	p := make([]byte, n)
	fill(p, seed)
	return p
}

// memSource is a ChunkSource over byte slices, with hooks to corrupt,
// slow down or kill a stream.
type memSource struct {
	mu   sync.Mutex
	gens map[GenKey]*memGen
	// beforeChunk, if set (setBefore), runs before each chunk is handed
	// out; an error fails that chunk.
	beforeChunk func(k GenKey, buffer string, i int) error
	pins        atomic.Int64
}

type memGen struct {
	info GenInfo
	data map[string][]byte
}

func newMemSource() *memSource { return &memSource{gens: map[GenKey]*memGen{}} }

// add stores a generation of buffers (name -> bytes) with chunk size cs.
func (m *memSource) add(k GenKey, cs int64, bufs map[string][]byte) {
	g := &memGen{info: GenInfo{ChunkSize: cs}, data: map[string][]byte{}}
	for name, b := range bufs {
		bi := BufferInfo{Name: name, Size: int64(len(b))}
		for lo := int64(0); lo < int64(len(b)); lo += cs {
			bi.CRC32C = append(bi.CRC32C, crc32c.Checksum(b[lo:min(lo+cs, int64(len(b)))]))
		}
		g.info.Buffers = append(g.info.Buffers, bi)
		g.data[name] = b
	}
	m.mu.Lock()
	m.gens[k] = g
	m.mu.Unlock()
}

// corrupt flips a byte of chunk i at rest, leaving its recorded CRC.
func (m *memSource) corrupt(k GenKey, buffer string, i int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	g := m.gens[k]
	b := bytes.Clone(g.data[buffer])
	b[int64(i)*g.info.ChunkSize] ^= 0x40
	g.data[buffer] = b
}

func (m *memSource) setBefore(f func(k GenKey, buffer string, i int) error) {
	m.mu.Lock()
	m.beforeChunk = f
	m.mu.Unlock()
}

func (m *memSource) Watermarks(ranks []int) []Watermark {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Watermark
	for k, g := range m.gens {
		if ranks != nil && !containsInt(ranks, k.Rank) {
			continue
		}
		var n int64
		for _, b := range g.info.Buffers {
			n += b.Size
		}
		out = append(out, Watermark{Rank: k.Rank, Shard: k.Shard, Step: k.Step, Seq: k.Seq, Bytes: n})
	}
	return out
}

func (m *memSource) Open(k GenKey) (SourceGeneration, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	g := m.gens[k]
	if g == nil {
		return nil, fmt.Errorf("%s: %w", k, ErrNotFound)
	}
	m.pins.Add(1)
	return &memPin{m: m, k: k, g: g}, nil
}

type memPin struct {
	m *memSource
	k GenKey
	g *memGen
}

func (p *memPin) Info() *GenInfo { return &p.g.info }

func (p *memPin) Chunk(buffer string, i int) ([]byte, uint32, error) {
	p.m.mu.Lock()
	f := p.m.beforeChunk
	p.m.mu.Unlock()
	if f != nil {
		if err := f(p.k, buffer, i); err != nil {
			return nil, 0, err
		}
	}
	b := p.g.info.Buffer(buffer)
	if b == nil || i < 0 || i >= len(b.CRC32C) {
		return nil, 0, fmt.Errorf("no chunk %d of %q: %w", i, buffer, ErrNotFound)
	}
	cs := p.g.info.ChunkSize
	lo := int64(i) * cs
	p.m.mu.Lock()
	d := p.g.data[buffer]
	p.m.mu.Unlock()
	return d[lo:min(lo+cs, b.Size)], b.CRC32C[i], nil
}

func (p *memPin) Close() { p.m.pins.Add(-1) }

// testSecret is one job's shared key.
var testSecret = bytes.Repeat([]byte("reft-test-secret"), 2)

func secretAuth(t testing.TB, key []byte, uid int) *Secret {
	t.Helper()
	s, err := NewSecret(key, uid)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// baseConfig is a loopback config with the secret method, job "77" and
// uid 4242. Its liveness timers are the defaults', so that a loaded machine
// running -race does not look like a dead peer; tests of liveness shorten
// them.
func baseConfig(t testing.TB, node string) Config {
	return Config{Job: "77", UID: 4242, Node: node, Auth: secretAuth(t, testSecret, 4242),
		Bind: "127.0.0.1", Heartbeat: 200 * time.Millisecond, Timeout: 2 * time.Second,
		Log: zerolog.New(zerolog.NewTestWriter(t))}
}

func startServer(t testing.TB, cfg Config, src ChunkSource) *Server {
	t.Helper()
	s, err := Listen(cfg, src)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newClient(t testing.TB, cfg Config) *Client {
	t.Helper()
	c, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// syncBuffer is a log sink tests can read while servers write.
type syncBuffer = logtest.Buffer

// waitFor polls cond until it holds or d passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// readFrame reads a whole control frame of any type.
func (c *conn) readFrame() (Frame, error) {
	h, err := c.readHeader()
	if err != nil {
		return Frame{Header: h}, err
	}
	return c.readPayload(h)
}
