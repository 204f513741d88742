package plan

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Memory sizes the host memory that reft's snapshots take on one node. The
// state of one (pp, tp) slice is shared by its DP ranks, which form one
// sharding group of m = DP members; each member snapshots 1/m of it (REFT
// 4.1) plus the redundancy its mode adds, for every generation it keeps.
type Memory struct {
	Params      float64 // model parameters
	Optimizer   string  // adam or sgd
	DP, PP, TP  int
	GPUsPerNode int
	Mode        Mode
	ParamBytes  float64 // bytes per parameter of the model weights (2 for bf16/fp16)
	Generations int     // completed + ongoing = 2 (REFT snapshot management)
	NodeRAMGiB  float64 // host memory of one node
	ZeRO1       bool    // optimizer state already sharded across DP on the GPUs
}

// optimizerBytes per parameter under mixed precision: an fp32 master copy
// plus Adam's two moments, or SGD's one momentum buffer.
func optimizerBytes(name string) (float64, error) {
	switch name {
	case "adam", "adamw":
		return 12, nil
	case "sgd":
		return 8, nil
	}
	return 0, fmt.Errorf("--optimizer must be adam or sgd; got %q", name)
}

func (mm Memory) validate() error {
	if _, err := optimizerBytes(mm.Optimizer); err != nil {
		return err
	}
	switch {
	case !(mm.Params > 0) || math.IsInf(mm.Params, 0):
		return fmt.Errorf("--params must be > 0, as in 7e9 or 7B; got %g", mm.Params)
	case mm.DP < 1 || mm.PP < 1 || mm.TP < 1:
		return fmt.Errorf("--dp, --pp and --tp must each be >= 1; got %d, %d, %d", mm.DP, mm.PP, mm.TP)
	case mm.GPUsPerNode < 1:
		return fmt.Errorf("--gpus-per-node must be >= 1; got %d", mm.GPUsPerNode)
	case (mm.DP*mm.PP*mm.TP)%mm.GPUsPerNode != 0:
		return fmt.Errorf("world size dp*pp*tp = %d is not a multiple of --gpus-per-node %d; whole nodes are allocated", mm.DP*mm.PP*mm.TP, mm.GPUsPerNode)
	case !(mm.ParamBytes > 0):
		return fmt.Errorf("--param-bytes must be > 0 (2 for bf16 weights); got %g", mm.ParamBytes)
	case mm.Generations < 1:
		return fmt.Errorf("--generations must be >= 1 (reft keeps 2: one completed, one ongoing); got %d", mm.Generations)
	case !(mm.NodeRAMGiB > 0):
		return fmt.Errorf("--node-ram-gib must be > 0; got %g", mm.NodeRAMGiB)
	}
	if mm.Mode.Tolerance() > 0 {
		if err := mm.Mode.checkTolerance(mm.DP); err != nil {
			return fmt.Errorf("%w (here the sharding group is the DP group, --dp %d)", err, mm.DP)
		}
	}
	return nil
}

// MemoryResult is per node unless named otherwise; sizes are bytes.
type MemoryResult struct {
	Nodes        int     `json:"nodes"`
	SGSize       int     `json:"sg_size"`
	OwnPerRank   float64 `json:"own_bytes_per_rank"`
	RedunPerRank float64 `json:"redundancy_bytes_per_rank"`
	PerRank      float64 `json:"per_rank_bytes"`
	Node         float64 `json:"node_bytes"`
	State        float64 `json:"state_bytes"`
	Bound        float64 `json:"bound_bytes"`
	Ratio        float64 `json:"ratio_to_state"`
	WithinBound  bool    `json:"within_bound"`
	RAMShare     float64 `json:"ram_share"`
}

// Plan computes the snapshot footprint. Redundancy per member, with S the
// slice state and m the SG size: arc:R holds R peer shards, R·S/m; aec:K
// holds K/(m-K) of a shard in parity, K·S/(m(m-K)), which for K = 1 is
// REFT's S/(m(m-1)); aor holds one peer's optimizer shard.
func (mm Memory) Plan() MemoryResult {
	ob, _ := optimizerBytes(mm.Optimizer)
	m := float64(mm.DP)
	slice := mm.Params / float64(mm.PP*mm.TP)
	state := slice * (mm.ParamBytes + ob)
	own := state / m
	red := 0.0
	for _, c := range mm.Mode.Components {
		k := float64(c.K)
		switch c.Name {
		case "arc":
			red += k * state / m
		case "aec":
			red += k * state / (m * (m - k))
		case "aor":
			red += slice * ob / m
		}
	}
	perRank := float64(mm.Generations) * (own + red)
	g := float64(mm.GPUsPerNode)
	devOpt := ob
	if mm.ZeRO1 {
		devOpt = ob / m
	}
	// The bound compares with the model and optimizer state the node's GPUs
	// hold, which is what REFT's "storage of the optimizer and model
	// parameters" refers to.
	devState := g * slice * (mm.ParamBytes + devOpt)
	r := MemoryResult{
		Nodes:        mm.DP * mm.PP * mm.TP / mm.GPUsPerNode,
		SGSize:       mm.DP,
		OwnPerRank:   own,
		RedunPerRank: red,
		PerRank:      perRank,
		Node:         g * perRank,
		State:        devState,
		Bound:        3 * devState,
	}
	r.Ratio = r.Node / r.State
	r.WithinBound = r.Node <= r.Bound*(1+1e-12)
	r.RAMShare = r.Node / (mm.NodeRAMGiB * (1 << 30))
	return r
}

// parseCount reads 7e9, 7B, 175b, 1.3T, 350M, 7,000,000,000.
func parseCount(s string) (float64, error) {
	t := strings.ReplaceAll(strings.TrimSpace(s), ",", "")
	mult := 1.0
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'k', 'K':
			mult, t = 1e3, t[:n-1]
		case 'm', 'M':
			mult, t = 1e6, t[:n-1]
		case 'b', 'B', 'g', 'G':
			mult, t = 1e9, t[:n-1]
		case 't', 'T':
			mult, t = 1e12, t[:n-1]
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || !(v > 0) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("--params %q is not a positive count; write it as 7e9, 7B, 350M or 1.3T", s)
	}
	return v * mult, nil
}
