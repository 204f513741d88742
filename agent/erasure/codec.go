package erasure

import (
	"fmt"
	"strings"

	"github.com/klauspost/reedsolomon"
)

// Codec encodes and decodes one [Layout]: XOR for K = 1, a Cauchy
// Reed-Solomon code (klauspost/reedsolomon kernels) for K >= 2. It keeps no
// state between calls, so one Codec serves concurrent calls.
type Codec struct {
	l       Layout
	workers int
	// K >= 2 only: row[t] computes parity row t alone (a member computes only
	// its own units, not all K of the stripe), full decodes a stripe.
	row  []reedsolomon.Encoder
	full reedsolomon.Encoder
}

// NewCodec prepares the codec of l. workers bounds the goroutines one call
// uses (values below 1 mean 1): the agent passes what it can spare beside
// the training job, which owns the node's cores.
func NewCodec(l Layout, workers int) (*Codec, error) {
	if l.m == 0 {
		return nil, fmt.Errorf("%w: zero Layout; build it with NewLayout", ErrParams)
	}
	c := &Codec{l: l, workers: max(1, workers)}
	if l.k == 1 {
		return c, nil
	}
	d := l.DataPieces()
	rows := cauchyRows(d, l.k)
	opts := []reedsolomon.Option{reedsolomon.WithMaxGoroutines(c.workers)}
	for t := range l.k {
		e, err := reedsolomon.New(d, 1, append(opts, reedsolomon.WithCustomMatrix(rows[t:t+1]))...)
		if err != nil {
			return nil, fmt.Errorf("erasure: building the encoder of parity row %d for %v: %w", t, l, err)
		}
		c.row = append(c.row, e)
	}
	e, err := reedsolomon.New(d, l.k, append(opts, reedsolomon.WithCustomMatrix(rows))...)
	if err != nil {
		return nil, fmt.Errorf("erasure: building the decoder for %v: %w", l, err)
	}
	c.full = e
	return c, nil
}

// Layout is the geometry this codec encodes.
func (c *Codec) Layout() Layout { return c.l }

// Encode writes member j's parity (Layout.ParitySize bytes) computed from
// the whole replicated slice (Layout.Size bytes). It reads only the pieces
// of other members' shards, never member j's own, and never past the slice.
func (c *Codec) Encode(j int, slice, parity []byte) error {
	l := c.l
	if err := checkMember(l.m, j, "member"); err != nil {
		return err
	}
	if len(slice) != l.w {
		return fmt.Errorf("%w: member %d: the slice has %d bytes but the layout (%v) was built for %d; rebuild the layout from the registered buffer sizes", ErrSize, j, len(slice), l, l.w)
	}
	if len(parity) != l.ParitySize() {
		return fmt.Errorf("%w: member %d: the parity buffer has %d bytes, the layout (%v) needs exactly %d", ErrSize, j, len(parity), l, l.ParitySize())
	}
	for t := range l.k {
		s := l.UnitStripe(j, t)
		out := parity[t*l.piece : (t+1)*l.piece]
		data := l.StripeData(s)
		srcs := make([][]byte, len(data))
		for col, i := range data {
			r := l.Piece(i, l.PieceIn(i, s))
			srcs[col] = slice[r.Off:r.End()]
		}
		if err := c.encodeUnit(j, t, srcs, out); err != nil {
			return err
		}
	}
	return nil
}

// encodeUnit computes parity unit t of member j (out, P bytes) from the data
// pieces of its stripe, in StripeData order: XOR for K = 1, parity row t of
// the Cauchy code otherwise. Short pieces count as zero-padded.
func (c *Codec) encodeUnit(j, t int, srcs [][]byte, out []byte) error {
	if c.l.k == 1 {
		XOR(out, srcs, c.workers)
		return nil
	}
	if err := c.rsRow(t, srcs, out); err != nil {
		return fmt.Errorf("erasure: member %d, parity unit %d (stripe %d): %w", j, t, c.l.UnitStripe(j, t), err)
	}
	return nil
}

// rsRow computes one parity row from D pieces. Pieces shorter than the
// longest (only the tail of a shard or of the slice has them) count as
// zero-padded. The code is bytewise, so the row is encoded in two spans:
// up to the shortest piece's end every piece is read in place, and only
// the rest (typically a few KiB: the shard cut's remainder) is encoded
// from zero-padded copies. Padding whole pieces cost an allocation and a
// copy of the piece in every commit.
func (c *Codec) rsRow(t int, srcs [][]byte, out []byte) error {
	n, short := 0, -1
	for _, s := range srcs {
		n = max(n, len(s))
		if short < 0 || len(s) < short {
			short = len(s)
		}
	}
	clear(out[n:]) // all inputs are zero past n
	if n == 0 {
		return nil
	}
	shards := make([][]byte, len(srcs)+1)
	if short > 0 {
		for i, s := range srcs {
			shards[i] = s[:short]
		}
		shards[len(srcs)] = out[:short]
		if err := c.row[t].Encode(shards); err != nil {
			return err
		}
	}
	if short == n {
		return nil
	}
	for i, s := range srcs {
		shards[i] = padTo(s[short:], n-short)
	}
	shards[len(srcs)] = out[short:n]
	return c.row[t].Encode(shards)
}

// padTo returns s if it has n bytes, else a zero-padded copy.
func padTo(s []byte, n int) []byte {
	if len(s) == n {
		return s
	}
	p := make([]byte, n)
	copy(p, s)
	return p
}

// Reconstruct rebuilds the shards of the members in lost from what the
// others hold. shards[i] and parities[i] are member i's shard
// (Layout.Shard(i).Len bytes) and parity (Layout.ParitySize bytes); nil
// marks one that is unavailable. For a lost member, shards[i] is either nil,
// and a new buffer is allocated, or a buffer of exactly the shard's length
// that receives it (an arena); its parity is never read.
//
// With the arc+aec layout, pass a surviving ARC copy of a lost member's
// shard as that shard (and leave the member out of lost): the codec then
// rebuilds only the shards whose copy is gone too.
//
// Every length is checked before anything is read. When some stripe keeps
// fewer than D of its D+K units, nothing is written and the error
// (ErrTooManyLosses) names the missing shards and parities and the
// tolerance K.
func (c *Codec) Reconstruct(lost []int, shards, parities [][]byte) error {
	l := c.l
	isLost, err := c.checkReconstruct(lost, shards, parities)
	if err != nil {
		return err
	}
	av := units{l: l, isLost: isLost, shards: shards, parities: parities}
	// Plan every stripe before writing anything.
	if short := c.shortStripes(av); len(short) > 0 {
		return c.tooManyLosses(lost, short, av)
	}
	for i := range l.m {
		if isLost[i] && shards[i] == nil {
			shards[i] = make([]byte, l.Shard(i).Len)
		}
	}
	// piece returns the bytes of piece p of member i's shard, clipped.
	piece := func(i, p int) []byte {
		r := l.Piece(i, p)
		off := r.Off - l.Shard(i).Off
		return shards[i][off : off+r.Len]
	}
	for s := range l.m {
		if !c.stripeNeeded(s, isLost) {
			continue
		}
		var err error
		if l.k == 1 {
			c.xorStripe(s, isLost, piece, parities)
		} else {
			err = c.rsStripe(s, isLost, av.haveShard, av.haveParity, piece, parities)
		}
		if err != nil {
			return fmt.Errorf("erasure: decoding stripe %d of %v: %w", s, l, err)
		}
	}
	return nil
}

// checkReconstruct checks Reconstruct's arguments, every length before
// anything is read, and returns which members are lost.
func (c *Codec) checkReconstruct(lost []int, shards, parities [][]byte) ([]bool, error) {
	l := c.l
	if len(shards) != l.m || len(parities) != l.m {
		return nil, fmt.Errorf("%w: got %d shards and %d parities for a group of %d members; pass one entry per member, nil where it is unavailable", ErrSize, len(shards), len(parities), l.m)
	}
	isLost := make([]bool, l.m)
	for _, i := range lost {
		if err := checkMember(l.m, i, "lost member"); err != nil {
			return nil, err
		}
		isLost[i] = true
	}
	for i := range l.m {
		want := l.Shard(i).Len
		if shards[i] != nil && len(shards[i]) != want {
			what := "shard"
			if isLost[i] {
				what = "output buffer for lost shard"
			}
			return nil, fmt.Errorf("%w: %s %d has %d bytes, the layout (%v) says %d; pass the shard exactly as committed, or nil if it is unavailable", ErrSize, what, i, len(shards[i]), l, want)
		}
		if !isLost[i] && parities[i] != nil && len(parities[i]) != l.ParitySize() {
			return nil, fmt.Errorf("%w: parity of member %d has %d bytes, the layout (%v) says %d; pass it exactly as committed, or nil if it is unavailable", ErrSize, i, len(parities[i]), l, l.ParitySize())
		}
	}
	return isLost, nil
}

// units says which of a Reconstruct's shards and parities are at hand.
type units struct {
	l        Layout
	isLost   []bool
	shards   [][]byte
	parities [][]byte
}

// haveShard: member i's shard is passed, or empty (the tail of a small
// slice is all logical zeros: known without being passed).
func (u units) haveShard(i int) bool {
	return !u.isLost[i] && (u.shards[i] != nil || u.l.Shard(i).Len == 0)
}

func (u units) haveParity(i int) bool { return !u.isLost[i] && u.parities[i] != nil }

// shortStripes names the stripes a lost shard needs that keep fewer than
// D of their D+K units.
func (c *Codec) shortStripes(u units) []string {
	l := c.l
	var short []string
	for s := range l.m {
		if !c.stripeNeeded(s, u.isLost) {
			continue
		}
		have := 0
		for _, i := range l.StripeData(s) {
			if u.haveShard(i) {
				have++
			}
		}
		for _, h := range l.StripeParity(s) {
			if u.haveParity(h) {
				have++
			}
		}
		if have < l.DataPieces() {
			short = append(short, fmt.Sprintf("stripe %d has %d of the %d units it needs", s, have, l.DataPieces()))
		}
	}
	return short
}

// tooManyLosses is the ErrTooManyLosses of a Reconstruct whose short
// stripes cannot be rebuilt: the missing shards and parities, and the
// layout's tolerance.
func (c *Codec) tooManyLosses(lost []int, short []string, u units) error {
	l := c.l
	var noShard, noParity []int
	for i := range l.m {
		if !u.haveShard(i) {
			noShard = append(noShard, i)
		}
		if !u.haveParity(i) {
			noParity = append(noParity, i)
		}
	}
	tol := fmt.Sprintf("this layout (K=%d) tolerates %d lost member(s)", l.k, l.k)
	if l.gap == 1 {
		tol += fmt.Sprintf(", %d with the surviving ARC copies passed as shards", l.k+1)
	}
	return fmt.Errorf("%w: cannot rebuild lost shard(s) %v of a group of %d: shards %v and parities %v are missing, and %s; %s: restore from the persistent checkpoint",
		ErrTooManyLosses, sortedCopy(lost), l.m, noShard, noParity, strings.Join(short, ", "), tol)
}

// stripeNeeded: stripe s holds a non-empty piece of a lost shard.
func (c *Codec) stripeNeeded(s int, isLost []bool) bool {
	for _, i := range c.l.StripeData(s) {
		if isLost[i] && c.l.Piece(i, c.l.PieceIn(i, s)).Len > 0 {
			return true
		}
	}
	return false
}

// xorStripe: exactly one lost piece (the plan checked), rebuilt as the
// stripe's parity XOR the other pieces.
func (c *Codec) xorStripe(s int, isLost []bool, piece func(i, p int) []byte, parities [][]byte) {
	var dst []byte
	srcs := [][]byte{parities[s]}
	for _, i := range c.l.StripeData(s) {
		p := piece(i, c.l.PieceIn(i, s))
		if isLost[i] {
			dst = p
		} else {
			srcs = append(srcs, p)
		}
	}
	XOR(dst, srcs, c.workers)
}

// rsStripe decodes the lost pieces of stripe s straight into their shards
// (a zero-length slice with the piece as capacity tells klauspost where to
// write). Every unit is cut or padded to n, the longest lost piece: the code
// is bytewise, so the bytes past n are not needed.
func (c *Codec) rsStripe(s int, isLost []bool, haveShard, haveParity func(int) bool, piece func(i, p int) []byte, parities [][]byte) error {
	l := c.l
	data := l.StripeData(s)
	n := 0
	for _, i := range data {
		if isLost[i] {
			n = max(n, len(piece(i, l.PieceIn(i, s))))
		}
	}
	d := l.DataPieces()
	units := make([][]byte, d+l.k)
	var copyBack [][2][]byte // lost pieces shorter than n: decoded in scratch
	for col, i := range data {
		if !isLost[i] && !haveShard(i) {
			continue // unavailable: one more unit for the code to rebuild
		}
		p := piece(i, l.PieceIn(i, s))
		switch {
		case isLost[i] && len(p) == n:
			units[col] = p[:0:n]
		case isLost[i]:
			tmp := make([]byte, 0, n)
			units[col] = tmp
			copyBack = append(copyBack, [2][]byte{p, tmp[:n]})
		case len(p) >= n:
			units[col] = p[:n]
		default:
			units[col] = padTo(p, n)
		}
	}
	for t, h := range l.StripeParity(s) {
		if haveParity(h) {
			units[d+t] = parities[h][t*l.piece : t*l.piece+n]
		}
	}
	if err := c.full.ReconstructData(units); err != nil {
		return err
	}
	for _, cb := range copyBack {
		copy(cb[0], cb[1])
	}
	return nil
}
