package client_test

import (
	"errors"
	"os"
	"slices"
	"testing"

	"github.com/reft-hpc/reft/client"
	"github.com/reft-hpc/reft/tests/conformance-agent/agenttest"
	"github.com/reft-hpc/reft/tmpfs"
)

// TestRestoreCorruptNamesBadChunks: a restore of a generation with a
// flipped byte fails with CodeCorrupt and the byte ranges of the caller's
// buffers that the bad chunk held, under the agent's own layout and under
// one whose sections mix buffers; Restore then falls back to the step before.
func TestRestoreCorruptNamesBadChunks(t *testing.T) {
	tests := []struct {
		layout string
		flip   func(m tmpfs.Manifest) int64 // arena offset of the byte to flip
		want   []client.BadChunk
	}{
		{"", func(m tmpfs.Manifest) int64 { return m.Buffers[1].Offset + 4096 + 7 }, // chunk 1 of v
			[]client.BadChunk{{Buffer: "v", Section: "v", Chunk: 1, Offset: 4096, Length: 904}}},
		// scatter-0 holds v[1667:3333] at 0 and w[6667:10000] at 1666
		// (agent/layout.go's scatterLayout): its chunk 0 mixes both.
		{"scatter", func(m tmpfs.Manifest) int64 { return m.Buffers[0].Offset + 3 },
			[]client.BadChunk{{Buffer: "v", Section: "scatter-0", Chunk: 0, Offset: 1667, Length: 1666}, {Buffer: "w", Section: "scatter-0", Chunk: 0, Offset: 6667, Length: 2430}}},
	}
	for _, tc := range tests {
		t.Run("layout="+tc.layout, func(t *testing.T) {
			a := startAgentWith(t, agenttest.Options{Layout: tc.layout})
			c := open(t, a, client.Options{ChunkSize: 4096})
			w, v := patterned(10000, 1), patterned(5000, 2)
			if err := c.Register("w", w, client.Replicated); err != nil {
				t.Fatal(err)
			}
			if err := c.Register("v", v, client.Sharded); err != nil {
				t.Fatal(err)
			}
			for step := int64(1); step <= 2; step++ {
				if err := c.Save(step).Wait(ctxT(t)); err != nil {
					t.Fatal(err)
				}
			}
			g, ok := a.Store.Latest(tmpfs.Key{Shard: tmpfs.DefaultShard})
			if !ok || g.Step != 2 {
				t.Fatalf("newest generation %d, %v; want step 2", g.Step, ok)
			}
			off := tc.flip(g.Manifest)
			f, err := os.OpenFile(g.ArenaPath, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			var b [1]byte
			if _, err := f.ReadAt(b[:], off); err != nil {
				t.Fatal(err)
			}
			b[0] ^= 0xFF
			if _, err := f.WriteAt(b[:], off); err != nil {
				t.Fatal(err)
			}
			f.Close()

			err = c.RestoreStep(ctxT(t), 2)
			var ae *client.Error
			if !errors.As(err, &ae) || ae.Code != client.CodeCorrupt {
				t.Fatalf("restore of the corrupt step: %v, want a client.Error with CodeCorrupt", err)
			}
			if !slices.Equal(ae.BadChunks, tc.want) {
				t.Fatalf("BadChunks = %+v, want %+v", ae.BadChunks, tc.want)
			}
			if step, ok, err := c.Restore(ctxT(t)); err != nil || !ok || step != 1 {
				t.Fatalf("Restore after the corrupt step: %d, %v, %v; want step 1", step, ok, err)
			}
		})
	}
}
