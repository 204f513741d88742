package peer

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/tmpfs"
)

// BenchmarkFetch: one shard fetched between two agents on loopback against
// a plain TCP copy of the same bytes between the same endpoints, paired
// round by round (alternating which goes first) so that load from other
// work on the machine hits both. x_tcp is the median per-pair ratio.
//
//	go test -run '^$' -bench Fetch -benchtime 5x ./agent/peer/
//
// Sources: "mem" serves from a Go slice; "store" from a tmpfs.Store arena
// under /dev/shm (the agent's real path: mmap'ed arena, pinned generation).
func BenchmarkFetch(b *testing.B) {
	for _, size := range []int64{256 << 20, 1 << 30} {
		for _, source := range []string{"mem", "store"} {
			b.Run(fmt.Sprintf("%s/%dMiB", source, size>>20), func(b *testing.B) {
				benchFetch(b, source, size)
			})
		}
	}
}

func benchFetch(b *testing.B, source string, size int64) {
	const cs = tmpfs.DefaultChunkSize
	if avail := memAvailable(); avail > 0 && avail < 3*size+(1<<30) {
		b.Skipf("needs %d MiB of available memory, %d MiB available", (3*size+(1<<30))>>20, avail>>20)
	}
	data := make([]byte, size)
	fill(data, "bench")
	var src ChunkSource
	key := GenKey{Rank: 0, Shard: "state", Step: 1}
	switch source {
	case "mem":
		m := newMemSource()
		m.add(key, cs, map[string][]byte{"w": data})
		src = m
	case "store":
		if st, err := os.Stat("/dev/shm"); err != nil || !st.IsDir() {
			b.Skip("no /dev/shm")
		}
		root, err := os.MkdirTemp("/dev/shm", "reft-peer-bench-")
		if err != nil {
			b.Skip(err)
		}
		b.Cleanup(func() { os.RemoveAll(root) })
		s, err := tmpfs.Open(tmpfs.Options{Root: filepath.Join(root, "reft"), JobID: "1", ChunkSize: cs, Log: zerolog.Nop()})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		o, err := s.Begin(tmpfs.Key{Rank: 0, Shard: "state"}, tmpfs.Spec{Step: 1, Buffers: []tmpfs.BufferSpec{{Name: "w", Size: size}}})
		if err != nil {
			b.Skipf("store: %v", err)
		}
		if err := o.CopyIn(map[string][]byte{"w": data}); err != nil {
			b.Fatal(err)
		}
		g, err := o.Commit()
		if err != nil {
			b.Fatal(err)
		}
		key.Seq = g.Seq
		src = StoreSource{s}
	}
	cfg := baseConfig(b, "bench")
	cfg.Log = zerolog.Nop()
	cfg.Timeout, cfg.Heartbeat = 5*time.Second, time.Second
	srv := startServer(b, cfg, src)
	cl := newClient(b, cfg)
	dst := make([]byte, size)
	for i := range dst { // fault in, so neither side pays for it
		dst[i] = 1
	}
	spec := FetchSpec{ChunkSize: cs, Size: size, Dst: dst, Sources: []Source{{srv.Addr().String(), ChunkKey{key, "w"}}}}
	fetch := func() time.Duration {
		start := time.Now()
		if _, err := cl.Fetch(context.Background(), spec); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	tcp := newPlainCopy(b, data, dst)
	fetch() // dial, handshake, warm caches
	tcp.copy()
	if !bytes.Equal(dst, data) {
		b.Fatal("bytes differ")
	}

	var ratios []float64
	var tf, tt time.Duration
	b.SetBytes(size)
	b.ResetTimer()
	for i := range b.N {
		var f, t time.Duration
		if i%2 == 0 {
			f, t = fetch(), tcp.copy()
		} else {
			t, f = tcp.copy(), fetch()
		}
		tf += f
		tt += t
		ratios = append(ratios, t.Seconds()/f.Seconds())
	}
	b.StopTimer()
	slices.Sort(ratios)
	b.ReportMetric(float64(size)*float64(b.N)/tf.Seconds()/1e9, "fetch_GB/s")
	b.ReportMetric(float64(size)*float64(b.N)/tt.Seconds()/1e9, "tcp_GB/s")
	b.ReportMetric(ratios[len(ratios)/2], "x_tcp")
}

// plainCopy is the baseline: one TCP connection on loopback, the sender
// io.Copy-ing the bytes, the receiver reading them into dst.
type plainCopy struct {
	b        testing.TB
	data     []byte
	dst      []byte
	send     net.Conn
	recv     net.Conn
	received chan error
}

func newPlainCopy(b testing.TB, data, dst []byte) *plainCopy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	send, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	p := &plainCopy{b: b, data: data, dst: dst, send: send, recv: <-acc}
	b.Cleanup(func() { p.send.Close(); p.recv.Close() })
	return p
}

func (p *plainCopy) copy() time.Duration {
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := io.ReadFull(p.recv, p.dst)
		done <- err
	}()
	if _, err := io.Copy(p.send, bytes.NewReader(p.data)); err != nil {
		p.b.Fatal(err)
	}
	if err := <-done; err != nil {
		p.b.Fatal(err)
	}
	return time.Since(start)
}

func memAvailable() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
