//go:build e2e

package e2e

import (
	"strings"
	"testing"
)

// TestProtectGeminiZero1NodeLoss: --reft=arc (no aor) with ZeRO-1 AdamW,
// DP=4 on n1-n4, n2 dies at step 10. The optimizer moments are Sharded
// buffers, unique to each rank: arc protects only the replicated
// parameters, so rank 1's moments come back from the replica that its
// GEMINI placement peer copied in the background (agent/replicate.go).
// The relaunch on the spare n5 must end exactly as the uninterrupted run,
// and rank 1's restore must name the peer source of its unreplicated
// buffers.
func TestProtectGeminiZero1NodeLoss(t *testing.T) {
	r := nodeLoss(t, nodeLossCase{spec: "arc,spares=1", dp: 4, kill: []string{"n2"}, killAt: 10, steps: 60,
		flags: []string{"--zero1", "--optimizer", "adamw"}})
	all, anyRank := r.doneBefore()
	from, ok := checkResumed(t, r.job, r.resumed, r.what, all, anyRank, 1)
	if !ok {
		r.logRestores(t)
		t.FailNow()
	}
	if from < r.lastLogged-2 {
		t.Errorf("resumed from step %d, but every rank had committed step %d (rank 0 logged step %d)", from, r.lastLogged-1, r.lastLogged)
	}
	for rank, evs := range r.checkRestores(t, from, []string{"restore_peer", "decode"}, "") {
		for _, e := range evs {
			sources, _ := e.fields["sources"].(string)
			t.Logf("rank %d on %s: %s of step %d, sources %q", rank, e.node, e.event, e.generation, sources)
			if !strings.Contains(sources, "unreplicated:peer@") {
				t.Errorf("rank %d's restore on %s took its unreplicated buffers from %q, want a placement peer's replica (unreplicated:peer@<node>)", rank, e.node, sources)
			}
		}
	}
}
