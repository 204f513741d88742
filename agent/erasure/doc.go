// Package erasure implements the redundancy codes that protect the
// snapshot of one sharding group (SG, REFT 4.1-4.2) across its m members.
//
// The SG's slice of W bytes is replicated on every member (vanilla DP or
// ZeRO-1 parameters); member j snapshots only shard j of it. What each
// member keeps besides its own shard:
//
//   - ARC (arc, arc:R): whole copies of the next R members' shards, cut from
//     its own replicated copy: member j holds shards j+1 .. j+R (mod m).
//     See [ARCShards], [ARCHolders], [ARCSources].
//
//   - AEC (aec): REFT's rotated XOR parity. Each shard is cut into m-1
//     pieces; stripe s takes one piece from every member except s, and
//     member s stores the XOR of that stripe. Every member computes its
//     parity from its own replicated copy of the slice (no network) and
//     stores W/(m(m-1)) bytes. A stripe never holds a piece of the shard of
//     the member that stores its parity, so losing any one member loses at
//     most one unit of every stripe, and XOR rebuilds it.
//
//   - AEC with K parities (aec:K): the same rotation generalised to a
//     Reed-Solomon code. Each shard is cut into m-K pieces; stripe s has
//     m-K data pieces (from members s+K .. s+m-1) and K parity units, held
//     by members s .. s+K-1. Member j stores K units, K·W/(m(m-K)) bytes,
//     again computed only from its own copy of the slice. Any K member
//     losses leave at least m-K of the m units of every stripe, which the
//     Cauchy matrix (MDS) decodes. For K = 1 this is exactly the XOR layout.
//     [Layout] and [Codec] implement both.
//
//   - arc+aec (Params.ARC): each stripe also leaves out member s+K, the one
//     after its parity block, and shards are cut into m-K-1 pieces. Then
//     any K+1 lost members leave every lost shard a surviving ARC copy or
//     decodable stripes (REFT "collaborative protection"); agent/sg's
//     failure analysis holds the same layout (its contract test).
//
// Cost of aec:K: member j's K units belong to K different stripes, so it
// computes them as K single-row encodes over disjoint pieces, each of its
// K·D input pieces read once (klauspost's kernels, one parity row each).
// Over the group that is K·W bytes read, where one encoder holding every
// data piece would read W once and emit all K rows of a stripe: the price
// of parity computed from each member's own copy, with nothing sent over
// the network (docs/BENCHMARKS.md, "aec:K encode as the agent runs it").
//
// Sharded snapshots: a member need not hold the whole slice to compute its
// parity. [Layout.Inputs] lists the data pieces member j's K parity units
// read (K·D pieces of other members' shards, none of its own; about K·W/m
// bytes, [Layout.InputSize]); the client copies exactly those bytes,
// concatenated in that order, into a scratch section, and
// [Codec.EncodeInputs] computes from it the same parity [Codec.Encode]
// computes from the slice.
//
// With m = 2 the XOR layout degenerates to ARC: each shard is one piece, the
// stripe of member s holds only the other member's shard, so the "parity" is
// a plain copy of the peer's shard (W/2 bytes, the same as arc).
//
// Uneven sizes: shards and pieces are cut at multiples of an alignment, and
// the last ones are short or empty; or the store's own shard cut is given
// (Params.Shards) and only pieces are cut here. Bytes past the end of a
// shard are logical zeros: they are never read, written or stored, only
// assumed in the parity arithmetic.
package erasure
