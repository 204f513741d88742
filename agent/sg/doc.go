// Package sg forms sharding groups, places redundancy, and decides which
// shards survive a set of failed nodes and how each comes back. The agent
// uses it to know its peers and what to store for them; `reft explain`
// and the restore planner use the same analysis, so what explain promises is
// what restore does. The package is pure Go: it never imports cgo packages.
//
// # Layout and rank order
//
// World size = DP x PP x TP. An [Order] names the dimensions from the
// fastest-varying to the slowest; Megatron-LM's default "tp-dp-pp" gives
//
//	rank = tp + TP*(dp + DP*pp)
//
// so the TP ranks of one (dp, pp) are consecutive and, with TP ranks per
// node, a node holds one (dp, pp). Any permutation may be given ("dp-tp-pp",
// ...); with Order{a, b, c}, rank = a + A*(b + B*c).
//
// # Sharding groups (REFT 4.1)
//
// One SG per (pp, tp): its members are the DP ranks dp = 0..DP-1 of that
// (pp, tp), which hold the same slice of replicated state. Each slice of W
// bytes is cut into m = DP contiguous shards, one per member ([ShardRange]:
// balanced, the first W mod m shards one byte longer). Members are placed
// on a ring; ring position i owns shard i, and its predecessor (i-1 mod m)
// keeps its ARC copy and AOR replica: member j keeps shard j+1, as in
// agent/erasure. Members that share a node weaken the
// group; [FormGroups] returns a [Warning] naming the ranks and the node.
//
// The ring order spreads members across failure domains (racks), as SCR's
// redset splits ranks "across" failure groups: see spread in spread.go. In
// short, members of the domain with the most members left are placed first,
// never twice in a row while another domain has members left, so ring
// neighbours share a domain only when a domain holds more than half the
// group (then in the fewest pairs possible). Without domains each node is a
// domain, and with every member on its own node the ring is dp order.
//
// # What each mode stores, per buffer kind
//
// A job registers up to three [Kind]s of buffers:
//
//   - Replicated (parameters; with vanilla DP also optimizer state). Every
//     member keeps its own shard. arc adds its ring successor's shard, cut
//     from its own replicated copy: no network. aec adds parity pieces
//     computed from its own replicated copy: no network either. arc
//     survives any 1 failed member per SG, aec any 1, aec:K any K, and
//     together they add up (REFT "collaborative protection"): arc+aec any 2,
//     arc+aec:K any K+1. aor alone (no arc or aec) makes the agent keep
//     the slice whole on every member instead of sharding it, so a failed
//     member's replicated state comes from any surviving member (source
//     peer): any m-1 failed members per SG.
//   - Optimizer (ZeRO-1 optimizer shards, unique per rank). With aor the
//     ring predecessor keeps a replica, updated on the host from the gradients:
//     any 1 failed member per SG, no network. State aor covers gets no
//     network copies, so arc and aec add nothing to it. Without aor it is
//     Sharded state.
//   - Sharded (anything unique to one rank). Only the network can protect
//     it. Each of arc, aec (1) and aec:K (K) adds peer copies: T = [arc] + K
//     copies, placed by GEMINI (section 4, Algorithm 1) over the nodes that
//     host ranks: groups of T+1 nodes that hold each other's state, and a
//     ring for the leftovers when T+1 does not divide the node count
//     ([Place]; nodes are first ordered across domains, [PlaceSpread]). Any
//     T failed nodes leave a copy. reft copies whole buffers rather than
//     encoding them: over the network a parity piece costs as much traffic
//     as a copy, and a copy restores from one peer.
//
// off protects nothing: a shard whose node failed comes from the persistent
// tier.
//
// # AEC layout (the contract for encoders and decoders)
//
// For an SG of m members and K parity pieces per stripe ([EC]): m stripes;
// stripe a keeps parity on ring positions a..a+K-1, and piece j of member
// p's shard lies in stripe p+1+j. Alone, aec:K cuts each shard into m-K
// pieces, so stripe a takes one piece from each of positions a+K..a-1 and
// any K failed members leave every stripe at most K missing pieces. This is
// agent/erasure's rotated layout, REFT's XOR for K=1, W/(m(m-1)) of parity
// per member.
//
// With arc on too, shards are cut into m-K-1 pieces and position a+K, the
// one right after the parity block, sits out of stripe a (parity
// K·W/(m(m-K-1)) per member). Then any K+1 failed members leave every shard
// either a live ARC copy or a decodable stripe: a shard is missing only when
// its owner and its predecessor (the ARC holder) both failed, and a run of
// failed positions can only reach stripe a's parity block, walking back,
// through position a+K, which then is one of the K+1 failures without
// costing the stripe a piece. With the plain layout, a stripe whose parity
// sits on a shard's ARC holder loses that shard to two adjacent failures,
// so arc+aec would survive only 1 failure in the worst case.
//
// Without arc this is exactly agent/erasure's Layout (a test holds them
// together); agent/erasure has no arc variant yet, and until it has, a real
// arc+aec job is guaranteed only 1 failed member per group.
//
// Pieces are the shard ([ShardRange]) cut into balanced parts
// ([EC.PieceRange]); a stripe's parity pieces are as long as its longest
// data piece, shorter ones counting as zero-padded. Which shards survive
// does not depend on the sizes. (agent/erasure cuts aligned shards of
// ceil(W/m) rounded up instead; client, agent and codec must agree on one
// cut before the sharded layout ships.)
//
// # Failure analysis
//
// [Model.Plan] takes failed nodes (everything on them is gone) and gives
// every shard a [Source]: local if its node lives; else arc, aec, aor or
// peer if that redundancy survives; else persistent, with a reason naming
// the SG, the lost ranks and nodes and what the mode tolerates. The analysis
// is exact for the layout above, not only the guarantee: arc alone survives
// two failed members of a group of four when they are not ring neighbours,
// and explain says so. [Model.Tolerance] is the guarantee in failed nodes,
// whichever nodes fail.
package sg
