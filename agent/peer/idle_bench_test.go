package peer

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// BenchmarkIdleConns: the heap an authenticated connection holds while it
// carries only control frames (most of an agent's connections: the mesh
// keeps one to every other agent of the job, docs/SCALE.md), with the
// large read buffer given at the first chunk (now) against given at
// authentication (before, eagerBulk), in the same run. Each op opens
// idleConns connections from as many clients to one listener, asks
// watermarks once on each, and measures the heap in use after a GC,
// before and after, per connection (both of its ends, which in a job are
// two agents' halves of one link). ratio: now / before.
func BenchmarkIdleConns(b *testing.B) {
	const idleConns = 200
	src := newMemSource()
	src.add(key1, 4096, map[string][]byte{"b": pattern(4096, "b")})
	per := map[bool]float64{}
	for i := range b.N {
		for _, eager := range []bool{i%2 == 0, i%2 != 0} { // alternate which goes first
			per[eager] += idleHeap(b, eager, src, idleConns) / float64(b.N)
		}
	}
	b.ReportMetric(per[false]/1024, "now_KiB/conn")
	b.ReportMetric(per[true]/1024, "before_KiB/conn")
	b.ReportMetric(per[false]/per[true], "ratio")
}

// idleHeap is the heap growth per connection of n idle connections.
func idleHeap(b *testing.B, eager bool, src ChunkSource, n int) float64 {
	eagerBulk = eager
	defer func() { eagerBulk = false }()
	heap := func() float64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return float64(ms.HeapInuse)
	}
	quiet := func(node string) Config {
		c := baseConfig(b, node)
		c.Log = zerolog.Nop() // the test writer holds every line
		return c
	}
	srv := startServer(b, quiet("n1"), src)
	defer srv.Close()
	addr := srv.Addr().String()
	clients := make([]*Client, n)
	h0 := heap()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range clients {
		cl, err := NewClient(quiet("n2"))
		if err != nil {
			b.Fatal(err)
		}
		defer cl.Close()
		if _, err := cl.Watermarks(ctx, addr, nil); err != nil {
			b.Fatal(err)
		}
		clients[i] = cl
	}
	return (heap() - h0) / float64(n)
}
