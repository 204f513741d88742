package erasure

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzReconstruct feeds Reconstruct lengths and availability it must not
// trust: each tweak truncates, extends, drops or substitutes one shard or
// parity. Reconstruct must never panic; with a wrong length it must answer
// ErrSize, otherwise rebuild bit-exactly or answer ErrTooManyLosses.
func FuzzReconstruct(f *testing.F) {
	f.Add(uint8(4), uint8(1), uint16(1000), uint8(2), uint8(0b0001), []byte{}, uint64(1))
	f.Add(uint8(2), uint8(1), uint16(3), uint8(0), uint8(0b10), []byte{3, 1}, uint64(2))
	f.Add(uint8(6), uint8(3), uint16(5000), uint8(1), uint8(0b101010), []byte{0, 0, 7, 200}, uint64(3))
	f.Add(uint8(5), uint8(2), uint16(777), uint8(2), uint8(0b111), []byte{}, uint64(4))
	f.Fuzz(func(t *testing.T, mb, kb uint8, wb uint16, ab, lostMask uint8, tweaks []byte, seed uint64) {
		m := 2 + int(mb)%7
		k := 1 + int(kb)%(m-1)
		w := int(wb) % 20000
		p := Params{Members: m, Parity: k, Size: w, Align: []int{1, 8, 64}[int(ab)%3], ARC: ab&4 != 0 && k+1 < m}
		if ab&8 != 0 {
			p.Shards = balancedCut(w, m, 1+int(ab>>4))
		}
		g := newGroup(t, p, seed, 1+int(ab)%3)
		var lost []int
		for i := range m {
			if lostMask&(1<<i) != 0 {
				lost = append(lost, i)
			}
		}
		shards, parities := g.survivors(lost)
		touched := len(tweaks) >= 2
		// Truncating and then extending a buffer can restore its length with
		// zeros in place of data: no code without checksums sees that (the
		// store's CRCs do), so such runs check only errors and panics.
		corrupted := false
		for len(tweaks) >= 2 {
			target, delta := int(tweaks[0]), int(tweaks[1])
			tweaks = tweaks[2:]
			bufs := shards
			if target&1 == 1 {
				bufs = parities
			}
			i := (target >> 1) % m
			switch b := bufs[i]; {
			case delta == 0:
				bufs[i] = nil
			case b == nil:
				bufs[i] = make([]byte, delta)
			case delta < 128:
				bufs[i] = b[:len(b)-min(len(b), delta)]
				corrupted = true
			default:
				bufs[i] = append(b, make([]byte, delta-127)...)
				corrupted = true
			}
		}
		isLost := make([]bool, m)
		for _, i := range lost {
			isLost[i] = true
		}
		sizeBad := false
		for i := range m {
			sizeBad = sizeBad || shards[i] != nil && len(shards[i]) != g.l.Shard(i).Len
			sizeBad = sizeBad || !isLost[i] && parities[i] != nil && len(parities[i]) != g.l.ParitySize()
		}
		err := g.c.Reconstruct(lost, shards, parities)
		switch {
		case sizeBad:
			if !errors.Is(err, ErrSize) {
				t.Fatalf("%v lost %v: wrong lengths gave err = %v, want ErrSize", g.l, lost, err)
			}
		case err == nil && corrupted:
		case err == nil:
			for _, i := range lost {
				if !bytes.Equal(shards[i], g.shards[i]) {
					t.Fatalf("%v lost %v: shard %d differs", g.l, lost, i)
				}
			}
		case !errors.Is(err, ErrTooManyLosses) || !touched && len(lost) <= g.l.Parity():
			t.Fatalf("%v lost %v (K=%d): err = %v", g.l, lost, k, err)
		}
	})
}
