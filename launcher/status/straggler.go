package status

import (
	"fmt"
	"slices"
	"time"
)

// Straggler is a rank whose own work per step (proto.RankProgress's
// ComputeS: outside its communication phases) is well above the job's
// median: in synchronous training every other rank waits for it in each
// collective, so it sets the job's pace. NVIDIA's resiliency extension
// reports such ranks the same way, without acting: a straggler is slow,
// not failed, and restarting the job would not make its node faster.
type Straggler struct {
	Rank     int     `json:"rank"`
	Node     string  `json:"node"`
	ComputeS float64 `json:"compute_s"` // the rank's median
	MedianS  float64 `json:"median_s"`  // the job's median over every rank measured
	Ratio    float64 `json:"ratio"`
}

func (s Straggler) String() string {
	return fmt.Sprintf("straggler: rank %d on %s works %s per step outside its collectives, %.1fx the job's median %s; "+
		"the other ranks wait for it in every collective (reported, not acted on: check the node's GPU clocks, thermals, other jobs)",
		s.Rank, s.Node, seconds(s.ComputeS), s.Ratio, seconds(s.MedianS))
}

func seconds(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(time.Millisecond).String()
}

// Straggler thresholds: a rank is one when its median work per step is
// StragglerRatio times the job's median and at least StragglerMin more,
// among at least StragglerRanks ranks measured (a median of two says
// nothing about which is slow). The margin keeps millisecond steps'
// jitter out.
const (
	StragglerRatio = 1.5
	StragglerMin   = 20 * time.Millisecond
	StragglerRanks = 3
)

// FindStragglers finds the stragglers among the ranks the agents measured
// (those whose trainers report communication phases), slowest first.
func FindStragglers(nodes []NodeReport) []Straggler {
	type measured struct {
		rank    int
		node    string
		compute float64
	}
	var ms []measured
	for _, n := range nodes {
		if n.Status == nil {
			continue
		}
		for _, rk := range n.Status.Ranks {
			if p := rk.Progress; p != nil && p.ComputeS > 0 {
				ms = append(ms, measured{rk.Rank, n.Node, p.ComputeS})
			}
		}
	}
	if len(ms) < StragglerRanks {
		return nil
	}
	cs := make([]float64, len(ms))
	for i, m := range ms {
		cs[i] = m.compute
	}
	slices.Sort(cs)
	med := cs[len(cs)/2]
	if len(cs)%2 == 0 {
		med = (cs[len(cs)/2-1] + cs[len(cs)/2]) / 2
	}
	var out []Straggler
	for _, m := range ms {
		if m.compute >= StragglerRatio*med && m.compute-med >= StragglerMin.Seconds() {
			out = append(out, Straggler{Rank: m.rank, Node: m.node, ComputeS: m.compute, MedianS: med, Ratio: m.compute / med})
		}
	}
	slices.SortFunc(out, func(a, b Straggler) int {
		if a.Ratio != b.Ratio {
			if a.Ratio > b.Ratio {
				return -1
			}
			return 1
		}
		return a.Rank - b.Rank
	})
	return out
}
