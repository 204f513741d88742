package plan

import (
	"bytes"
	"testing"

	"github.com/reft-hpc/reft/internal/logplan"
)

// FuzzLoggingInput feeds `reft plan logging --input` files to the decoder
// and, for what it accepts, the planner and the report. Properties: an
// input the planner accepts gives groups that cover the stages in order,
// no node's log memory above the cap, and a report that encodes as JSON
// (no NaN or Inf reaches it); one it refuses is refused with an error.
func FuzzLoggingInput(f *testing.F) {
	f.Add([]byte(threeJSON))
	f.Add([]byte(`{"stage_seconds":[1],"bandwidth_bytes_per_second":1,"snapshot_interval_steps":1,"node_cap_bytes":0,"step_seconds":1}`))
	f.Add([]byte(`{"stage_seconds":[1,2],"forward_bytes":[1e308],"backward_bytes":[5],"bandwidth_bytes_per_second":1e-300,"snapshot_interval_steps":9,"node_cap_bytes":"unlimited","step_seconds":1e300,"dp":3}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		in, dp, err := decodeLoggingInput(data)
		if err != nil {
			return
		}
		for _, algo := range []logplan.Algorithm{logplan.Optimal, logplan.Greedy} {
			p, err := logplan.Choose(in, algo)
			if err != nil {
				continue
			}
			next := 0
			for _, g := range p.Groups {
				if g.First != next || g.Last < g.First {
					t.Fatalf("groups %v do not cover the stages in order", p.Groups)
				}
				next = g.Last + 1
			}
			if next != len(in.StageSeconds) {
				t.Fatalf("groups %v end at %d of %d stages", p.Groups, next, len(in.StageSeconds))
			}
			for i, b := range p.NodeLogBytes {
				if b > in.NodeCap {
					t.Fatalf("node %d holds %g bytes, above the cap %g", i, b, in.NodeCap)
				}
			}
			prot, err := logplan.Protect(dp, len(in.StageSeconds), p)
			if err != nil {
				continue
			}
			var out bytes.Buffer
			if err := writeJSON(&out, loggingReport(in, dp, string(algo), p, prot)); err != nil {
				t.Fatalf("the report does not encode: %v", err)
			}
		}
	})
}
