package agent

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/reedsolomon"

	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/agent/shard"
	"github.com/reft-hpc/reft/spank/spec"
)

// BenchmarkAECEncode: the agent's aec:K parity encode, as its commits run
// it, against klauspost/reedsolomon encoding the same stripes
// (docs/BENCHMARKS.md, "Redundancy codes").
//
//   - agent: every member's shard.Geometry built by shard.NewGeometry from a registration
//     of one replicated buffer of W bytes (so its layout, shard cut and
//     codec, EncodeWorkers included, are the agent's), and every member's
//     Codec.EncodeInputs from its gathered rep@in scratch, as Geometry.Encode
//     calls it at commit: m·K parity units, each one Reed-Solomon row over
//     D = m-K pieces of one stripe. A member's K units belong to K different
//     stripes (rotated parity), so the members read K·W bytes in all.
//     With arc+aec:K, D = m-K-1 (each stripe also skips a member).
//   - klauspost: reedsolomon.New(D, K) with the same Cauchy matrix and the
//     same goroutines, Encode of each of the m stripes' D pieces in place
//     in the slice: the same m·K parity units from W bytes read once, what
//     one encoder holding every data piece would do. The parity bytes are
//     checked equal before timing.
//   - x_klauspost: the median over pairs of klauspost's time over the
//     agent's for the same parity bytes (>= 1: the agent is as fast);
//     x_klauspost_read compares the rates over the bytes each side reads
//     (K·W against W). Pairs alternate which side runs first.
func BenchmarkAECEncode(b *testing.B) {
	for _, w := range []int{64 << 20, 256 << 20} {
		for _, cc := range []struct {
			spec string
			m, k int
		}{{"aec:2", 4, 2}, {"aec:2", 8, 2}, {"aec:3", 8, 3}, {"arc+aec:2", 8, 2}} {
			name := strings.ReplaceAll(strings.ReplaceAll(cc.spec, ":", ""), "+", "_")
			b.Run(fmt.Sprintf("%s/m=%d/W=%dMiB", name, cc.m, w>>20), func(b *testing.B) {
				benchAECEncode(b, cc.spec, cc.m, cc.k, w)
			})
		}
	}
}

func benchAECEncode(b *testing.B, spc string, m, k, w int) {
	sp, err := spec.Parse(spc)
	if err != nil {
		b.Fatal(err)
	}
	slice := make([]byte, w)
	rand.NewChaCha8([32]byte{byte(m), byte(k)}).Read(slice)
	type member struct {
		si              *shard.Geometry
		scratch, parity []byte
	}
	ms := make([]member, m)
	for j := range ms {
		si, err := shard.NewGeometry(sp, proto.Register{Rank: j, World: m, Layout: fmt.Sprintf("dp=%d", m),
			Buffers: []proto.BufferSpec{{Name: "params", Size: int64(w), Replicated: true}}})
		if err != nil || si == nil || si.Codec == nil {
			b.Fatalf("member %d: no aec codec (%v)", j, err)
		}
		var scratch []byte
		for _, in := range si.EL.Inputs(si.Pos) { // what the client copies to rep@in
			scratch = append(scratch, slice[in.Range.Off:in.Range.End()]...)
		}
		ms[j] = member{si, scratch, make([]byte, si.EL.ParitySize())}
	}
	el := *ms[0].si.EL
	d, p := el.DataPieces(), el.PieceSize()
	enc, err := reedsolomon.New(d, k, reedsolomon.WithCauchyMatrix(), reedsolomon.WithMaxGoroutines(shard.EncodeWorkers))
	if err != nil {
		b.Fatal(err)
	}
	// Each stripe's pieces, in place in the slice (zero-padded copies only
	// for pieces shorter than P, at the slice's tail), and K parity units.
	stripes := make([][][]byte, m)
	for s := range stripes {
		for _, i := range el.StripeData(s) {
			r := el.Piece(i, el.PieceIn(i, s))
			piece := slice[r.Off:r.End()]
			if len(piece) < p {
				piece = append(slices.Clone(piece), make([]byte, p-len(piece))...)
			}
			stripes[s] = append(stripes[s], piece)
		}
		for range k {
			stripes[s] = append(stripes[s], make([]byte, p))
		}
	}
	agent := func() {
		for _, mb := range ms {
			if err := mb.si.Codec.EncodeInputs(mb.si.Pos, mb.scratch, mb.parity); err != nil {
				b.Fatal(err)
			}
		}
	}
	direct := func() {
		for _, st := range stripes {
			if err := enc.Encode(st); err != nil {
				b.Fatal(err)
			}
		}
	}
	agent()
	direct()
	for j, mb := range ms {
		for t := range k {
			s := el.UnitStripe(mb.si.Pos, t)
			if !bytes.Equal(mb.parity[t*p:(t+1)*p], stripes[s][d+t]) {
				b.Fatalf("member %d's parity unit %d differs from klauspost's row %d of stripe %d", j, t, t, s)
			}
		}
	}
	var agentT, directT, ratios []float64
	timeIt := func(f func(), into *[]float64) {
		t := time.Now()
		f()
		*into = append(*into, time.Since(t).Seconds())
	}
	const pairs = 5
	b.SetBytes(int64(w * pairs))
	for i := 0; b.Loop(); {
		for range pairs {
			if i%2 == 0 {
				timeIt(direct, &directT)
				timeIt(agent, &agentT)
			} else {
				timeIt(agent, &agentT)
				timeIt(direct, &directT)
			}
			ratios = append(ratios, directT[len(directT)-1]/agentT[len(agentT)-1])
			i++
		}
	}
	med := func(xs []float64) float64 {
		s := slices.Clone(xs)
		slices.Sort(s)
		return s[len(s)/2]
	}
	b.ReportMetric(float64(k*w)/med(agentT)/1e9, "agent_read_GB/s")
	b.ReportMetric(float64(w)/med(directT)/1e9, "klauspost_read_GB/s")
	b.ReportMetric(med(ratios), "x_klauspost")
	b.ReportMetric(med(ratios)*float64(k), "x_klauspost_read")
	b.ReportMetric(float64(shard.EncodeWorkers), "workers")
}
