package erasure

import "fmt"

// Input is one data piece that a member's parity reads: piece Piece of
// shard Shard, the data of parity unit Unit, at Range of the slice (clipped
// to the shard, so short or empty at the end of a shard or of the slice).
type Input struct {
	Unit         int // parity unit t of the member, 0..K-1
	Shard, Piece int // member whose shard holds the piece, and its index in the shard
	Range        Range
}

// Inputs lists the data pieces member j's parity is computed from: for each
// parity unit t = 0..K-1 (stripe UnitStripe(j, t)), the pieces of that
// stripe in StripeData order, the column order of the code. Empty pieces
// are included, so the list always has K·D entries and entry t·D+c is
// column c of unit t; they take no bytes.
//
// This is what a sharded snapshot copies for parity: the scratch section
// that [Codec.EncodeInputs] reads is the concatenation, in this order, of
// the slice bytes at every Range (InputSize(j) bytes in all). No piece is
// listed twice, and none lies in member j's own shard. It panics if j is
// not a member, like an index out of range.
func (l Layout) Inputs(j int) []Input {
	l.mustMember(j)
	d := l.DataPieces()
	out := make([]Input, 0, l.k*d)
	for t := range l.k {
		s := l.UnitStripe(j, t)
		for _, i := range l.StripeData(s) {
			p := l.PieceIn(i, s)
			out = append(out, Input{Unit: t, Shard: i, Piece: p, Range: l.Piece(i, p)})
		}
	}
	return out
}

// InputSize is the length of member j's scratch section, the sum of the
// lengths of Inputs(j). Bounds, with D = DataPieces, P = PieceSize and
// S = ShardSize:
//
//	InputSize(j) <= D·ParitySize() = K·D·P <= K·(S + D·Align - 1)
//
// (D·P = S with the default cut, as S is a multiple of D·Align). With the
// balanced cut of agent/sg, S = ceil(W/m): a member copies at most
// K·(ceil(W/m) + D·Align - 1) bytes, about K/m of the slice. Over the group
// every piece is in one stripe, read by its K parity holders, so the
// InputSize of all members sum to exactly K·W.
func (l Layout) InputSize(j int) int {
	n := 0
	for _, in := range l.Inputs(j) {
		n += in.Range.Len
	}
	return n
}

// EncodeInputs writes member j's parity (ParitySize bytes) computed from
// scratch, the concatenation of the slice bytes at Layout.Inputs(j) in
// order (InputSize(j) bytes), instead of from the whole slice: the result
// is byte for byte what Encode(j, slice, parity) writes. Short pieces count
// as zero-padded, as in Encode. It uses the same kernels and workers as
// Encode, and reads the pieces in place (scratch is not written).
func (c *Codec) EncodeInputs(j int, scratch, parity []byte) error {
	l := c.l
	if err := checkMember(l.m, j, "member"); err != nil {
		return err
	}
	ins := l.Inputs(j)
	want := 0
	for _, in := range ins {
		want += in.Range.Len
	}
	if len(scratch) != want {
		return fmt.Errorf("%w: member %d: the parity scratch has %d bytes but the layout (%v) needs exactly %d (the %d pieces of Layout.Inputs(%d), concatenated); copy the inputs of this layout, built from the same sizes and shard cut", ErrSize, j, len(scratch), l, want, len(ins), j)
	}
	if len(parity) != l.ParitySize() {
		return fmt.Errorf("%w: member %d: the parity buffer has %d bytes, the layout (%v) needs exactly %d", ErrSize, j, len(parity), l, l.ParitySize())
	}
	d := l.DataPieces()
	srcs := make([][]byte, d)
	off := 0
	for t := range l.k {
		for col, in := range ins[t*d : (t+1)*d] {
			srcs[col] = scratch[off : off+in.Range.Len : off+in.Range.Len]
			off += in.Range.Len
		}
		if err := c.encodeUnit(j, t, srcs, parity[t*l.piece:(t+1)*l.piece]); err != nil {
			return err
		}
	}
	return nil
}
