package agent

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/reft-hpc/reft/agent/aor"
	"github.com/reft-hpc/reft/agent/proto"
	reftclient "github.com/reft-hpc/reft/client"
)

// AOR over the multi-agent harness: DP = 4 ranks, one per node, each with
// a replicated parameter buffer, the step's reduced gradient (replicated)
// and its ZeRO-1 shard of Adam's m and v. The test computes every owner's
// m and v with agent/aor's kernels, as a trainer does; the agents keep
// the replicas. A lost node's rank gets back its m and v from its ring
// predecessor's replica, bit for bit.

const aorElems = 40_003 // gradient elements

var (
	aorCut = [][2]int64{{0, 10_001}, {10_001, 10_001}, {20_002, 10_001}, {30_003, 10_000}}
	aorOpt = aor.Optimizer{Kind: aor.Adam, Beta1: 0.9, Beta2: 0.999}
)

// aorGrad is the step's reduced gradient (the same on every rank).
func aorGrad(step int64) []float32 {
	r := rand.New(rand.NewPCG(uint64(step), 4242))
	g := make([]float32, aorElems)
	for i := range g {
		g[i] = float32(r.NormFloat64() * 1e-2)
	}
	return g
}

// aorMV is rank dp's m and v after steps 1..step (from zero), or, with
// skip, the state a trainer has at step whatever it saved.
func aorMV(step int64, dp int) (m, v []float32) {
	sh := aorCut[dp]
	m, v = make([]float32, sh[1]), make([]float32, sh[1])
	for s := int64(1); s <= step; s++ {
		g := aorGrad(s)[sh[0] : sh[0]+sh[1]]
		aorOpt.Moments(m, v, g)
	}
	return m, v
}

// aorRankBufs are a rank's buffers at step (zeros at step 0).
func aorRankBufs(t testing.TB, step int64, rank int) map[string][]byte {
	out := map[string][]byte{}
	w := make([]byte, 30_011)
	if step > 0 {
		r := rand.New(rand.NewPCG(uint64(step), 7))
		for i := range w {
			w[i] = byte(r.Uint32())
		}
	}
	out["layer0.weight"] = w
	put := func(name string, f []float32) {
		b := make([]byte, 4*len(f))
		dst, err := aor.Float32s(b)
		if err != nil {
			t.Fatal(err)
		}
		copy(dst, f)
		out[name] = b
	}
	if step > 0 {
		put("grads", aorGrad(step))
	} else {
		put("grads", make([]float32, aorElems))
	}
	m, v := aorMV(step, rank)
	put("m", m)
	put("v", v)
	return out
}

func aorInfo(state string, rank int) reftclient.AOR {
	return reftclient.AOR{Optimizer: aorOpt.Kind, State: state, Beta1: aorOpt.Beta1, Beta2: aorOpt.Beta2,
		Grad: "grads", Shards: aorCut, Index: rank}
}

// aorOpen registers a rank's buffers as reft-train does under --zero1.
func aorOpen(t testing.TB, j *shJobRun, rank int, bufs map[string][]byte) *reftclient.Client {
	t.Helper()
	c, err := reftclient.Open(context.Background(), reftclient.Options{Socket: j.nodes[rank].sock, Rank: rank, World: len(j.nodes),
		Layout: "dp=" + strconv.Itoa(len(j.nodes)), ChunkSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if !c.AOR() {
		t.Fatalf("the client does not see aor in the SPEC %q", j.spec)
	}
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(c.Register("layer0.weight", bufs["layer0.weight"], reftclient.Replicated))
	must(c.Register("grads", bufs["grads"], reftclient.Replicated))
	must(c.RegisterOptimizerState("m", bufs["m"], aorInfo("m", rank)))
	must(c.RegisterOptimizerState("v", bufs["v"], aorInfo("v", rank)))
	return c
}

// aorSave has client c of rank save steps (bufs updated to each first).
func aorSave(t testing.TB, c *reftclient.Client, rank int, bufs map[string][]byte, steps ...int64) error {
	for _, st := range steps {
		for k, v := range aorRankBufs(t, st, rank) {
			copy(bufs[k], v)
		}
		if err := c.Save(st).Wait(context.Background()); err != nil {
			return fmt.Errorf("rank %d save %d: %w", rank, st, err)
		}
	}
	return nil
}

// aorRelaunch stops the job and starts it again with the failed ranks'
// nodes replaced by fresh ones (stores gone), named with prefix.
func aorRelaunch(t *testing.T, j *shJobRun, roots map[string]string, failed []int, prefix string) *shJobRun {
	j.stop()
	names := make([]string, len(j.nodes))
	for r, n := range j.nodes {
		names[r] = n.name
	}
	for _, r := range failed {
		os.RemoveAll(roots[names[r]])
		names[r] = prefix + strconv.Itoa(r)
	}
	return startJob(t, j.spec, names, roots, j.pdir)
}

// aorRestore opens every rank with zeroed buffers, agrees on the newest
// common step, restores it and checks every rank's buffers against that
// step; it returns the clients (still open) and their buffers.
func aorRestore(t *testing.T, j *shJobRun, want int64) ([]*reftclient.Client, []map[string][]byte) {
	t.Helper()
	w := len(j.nodes)
	cs := make([]*reftclient.Client, w)
	bufs := make([]map[string][]byte, w)
	gens := make([][]int64, w)
	errs := make([]error, w)
	var wg sync.WaitGroup
	for r := range w {
		bufs[r] = aorRankBufs(t, 0, r)
		cs[r] = aorOpen(t, j, r, bufs[r])
		t.Cleanup(func() { cs[r].Close() })
		wg.Add(1)
		go func() {
			defer wg.Done()
			gens[r], errs[r] = cs[r].Generations(context.Background())
		}()
	}
	wg.Wait()
	for r := range w {
		if errs[r] != nil || !slices.Contains(gens[r], want) {
			t.Fatalf("rank %d: generations %v (%v), want step %d among them", r, gens[r], errs[r], want)
		}
	}
	for r := range w {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = cs[r].RestoreStep(context.Background(), want)
		}()
	}
	wg.Wait()
	for r := range w {
		if errs[r] != nil {
			t.Fatalf("rank %d: restore of step %d: %v", r, want, errs[r])
		}
		exp := aorRankBufs(t, want, r)
		for _, name := range []string{"layer0.weight", "m", "v"} {
			if !slices.Equal(bufs[r][name], exp[name]) {
				t.Fatalf("rank %d buffer %s differs from step %d", r, name, want)
			}
		}
	}
	return cs, bufs
}

// restoreEvent is the single restore event a node logged.
func restoreEvent(t *testing.T, n *shNode) (string, map[string]any) {
	t.Helper()
	var name string
	var ev map[string]any
	for _, e := range []string{"restore_local", "restore_peer", "decode", "restore_persistent"} {
		if evs := n.log.Events(e); len(evs) > 0 {
			if name != "" || len(evs) != 1 {
				t.Fatalf("node %s logged restore events %s and %s (%d)", n.name, name, e, len(evs))
			}
			name, ev = e, evs[0]
		}
	}
	return name, ev
}

// TestAORRestoreEveryNode: with aor (replicated buffers whole on every
// member) and arc+aor (sharded slice with ARC copies), losing any one node
// restores every rank's m and v bit for bit from the predecessor's
// replica; the ranks then go on saving from the seeded replicas, and
// losing the next node restores again.
func TestAORRestoreEveryNode(t *testing.T) {
	for _, spc := range []string{"aor", "arc+aor"} {
		for lost := range 4 {
			t.Run(fmt.Sprintf("%s/lost=%d", spc, lost), func(t *testing.T) {
				roots := map[string]string{}
				j := startJob(t, spc, []string{"n1", "n2", "n3", "n4"}, roots, "")
				var wg sync.WaitGroup
				for r := range 4 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						bufs := aorRankBufs(t, 0, r)
						c := aorOpen(t, j, r, bufs)
						defer c.Close()
						if err := aorSave(t, c, r, bufs, 1, 2, 3); err != nil {
							t.Error(err)
						}
					}()
				}
				wg.Wait()
				if t.Failed() {
					return
				}
				for r, n := range j.nodes {
					if evs := n.log.Events("aor_invalid"); len(evs) > 0 {
						t.Fatalf("rank %d: replica invalid without a gap: %v", r, evs)
					}
				}
				j = aorRelaunch(t, j, roots, []int{lost}, "a")
				cs, bufs := aorRestore(t, j, 3)
				ev, fields := restoreEvent(t, j.nodes[lost])
				src, _ := fields["sources"].(string)
				if ev != "restore_peer" || !strings.Contains(src, "m:aor@") || !strings.Contains(src, "v:aor@") {
					t.Fatalf("replacement of rank %d logged %s with sources %q, want restore_peer with m and v from aor", lost, ev, src)
				}
				// Go on: step 4 from the replicas the restore seeded.
				for r := range 4 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						if err := aorSave(t, cs[r], r, bufs[r], 4); err != nil {
							t.Error(err)
						}
					}()
				}
				wg.Wait()
				for r, n := range j.nodes {
					if evs := n.log.Events("aor_invalid"); len(evs) > 0 {
						t.Fatalf("rank %d: replica invalid after the restore: %v", r, evs)
					}
				}
				// Lose the node whose replica the replacement keeps (seeded
				// from that rank's own state) and the one before it in
				// turn: every replica after a restore must be right.
				next := (lost + 1) % 4
				j = aorRelaunch(t, j, roots, []int{next}, "b")
				aorRestore(t, j, 4)
				if ev, _ := restoreEvent(t, j.nodes[next]); ev != "restore_peer" {
					t.Fatalf("replacement of rank %d logged %s", next, ev)
				}
			})
		}
	}
}

// TestAORGap: rank 0 skips step 2, so its replica of rank 1 cannot be
// brought forward at step 3 (logged); losing rank 1's node then leaves its
// optimizer state of step 3 to the persistent tier, and without one the
// restore says why.
func TestAORGap(t *testing.T) {
	roots := map[string]string{}
	j := startJob(t, "aor", []string{"n1", "n2", "n3", "n4"}, roots, "")
	var wg sync.WaitGroup
	for r := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bufs := aorRankBufs(t, 0, r)
			c := aorOpen(t, j, r, bufs)
			defer c.Close()
			steps := []int64{1, 2, 3}
			if r == 0 {
				steps = []int64{1, 3}
			}
			if err := aorSave(t, c, r, bufs, steps...); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	evs := j.nodes[0].log.Events("aor_invalid")
	if len(evs) != 1 || !strings.Contains(fmt.Sprint(evs[0]["reason"]), "no generation of step 2") {
		t.Fatalf("rank 0 logged aor_invalid %v, want one naming the missing step 2", evs)
	}
	j = aorRelaunch(t, j, roots, []int{1}, "a")
	c := aorOpen(t, j, 1, aorRankBufs(t, 0, 1))
	defer c.Close()
	err := c.RestoreStep(context.Background(), 3)
	if err == nil || !strings.Contains(err.Error(), "the AOR replica rank 0 keeps is not valid for that step") {
		t.Fatalf("restore of rank 1 at step 3: %v; want the invalid replica named", err)
	}
	t.Logf("error: %v", err)
}

// TestAORBadRegistration: an aor registration that breaks proto.CheckAOR,
// or whose index is not the rank's DP index, is refused with invalid.
func TestAORBadRegistration(t *testing.T) {
	roots := map[string]string{}
	j := startJob(t, "aor", []string{"n1", "n2", "n3", "n4"}, roots, "")
	a := func(state string, idx int) *proto.AOR {
		x := aorInfo(state, idx)
		return &x
	}
	bufs := func(m, v *proto.AOR, gradRep bool) []proto.BufferSpec {
		return []proto.BufferSpec{{Name: "grads", Size: 4 * aorElems, Replicated: gradRep},
			{Name: "m", Size: 4 * aorCut[1][1], AOR: m}, {Name: "v", Size: 4 * aorCut[1][1], AOR: v}}
	}
	for _, tc := range []struct {
		name string
		bufs []proto.BufferSpec
		want string
	}{
		{"grad not replicated", bufs(a("m", 1), a("v", 1), false), `grad "grads" is not replicated`},
		{"v missing", bufs(a("m", 1), nil, true), `adam state v of gradient "grads" is not registered with aor`},
		{"size of another shard", bufs(a("m", 3), a("v", 3), true), `buffer "m" has 40004 bytes`},
	} {
		cl := newClient(t, j.nodes[1].sock)
		var perr *proto.Error
		req := proto.Register{Rank: 1, World: 4, Layout: "dp=4", Buffers: tc.bufs}
		cl.id++
		err := proto.Call(cl.c, proto.TRegister, cl.id, req, nil)
		if !errors.As(err, &perr) || perr.Code != proto.CodeInvalid || !strings.Contains(perr.Message, tc.want) {
			t.Errorf("%s: %v, want invalid with %q", tc.name, err, tc.want)
		}
	}
	// The index is in range and the size matches, but it is not rank 1's.
	req := proto.Register{Rank: 1, World: 4, Layout: "dp=4", Buffers: []proto.BufferSpec{{Name: "grads", Size: 4 * aorElems, Replicated: true},
		{Name: "m", Size: 4 * aorCut[2][1], AOR: a("m", 2)}, {Name: "v", Size: 4 * aorCut[2][1], AOR: a("v", 2)}}}
	cl := newClient(t, j.nodes[1].sock)
	var perr *proto.Error
	err := proto.Call(cl.c, proto.TRegister, 1, req, nil)
	if !errors.As(err, &perr) || perr.Code != proto.CodeInvalid || !strings.Contains(perr.Message, "aor.index = 2, but this rank is DP index 1") {
		t.Errorf("index of another rank: %v", err)
	}
}

// TestAORGapPersistent: the gap of TestAORGap with a persistent tier: rank
// 1's state of step 3 comes from it (the others' from memory), every rank
// gets step 3 bit for bit, and the replicas seeded by the restores carry
// the job on: step 4 saved, rank 2's node lost, restored from memory.
func TestAORGapPersistent(t *testing.T) {
	roots := map[string]string{}
	j := startJob(t, "aor,persist=1", []string{"n1", "n2", "n3", "n4"}, roots, t.TempDir())
	var wg sync.WaitGroup
	for r := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bufs := aorRankBufs(t, 0, r)
			c := aorOpen(t, j, r, bufs)
			defer c.Close()
			steps := []int64{1, 2, 3}
			if r == 0 {
				steps = []int64{1, 3}
			}
			for _, st := range steps {
				if err := aorSave(t, c, r, bufs, st); err != nil {
					t.Error(err)
					return
				}
				j.nodes[r].per.Wait()
			}
		}()
	}
	wg.Wait()
	j = aorRelaunch(t, j, roots, []int{1}, "a")
	cs, bufs := aorRestore(t, j, 3)
	if ev, fields := restoreEvent(t, j.nodes[1]); ev != "restore_persistent" {
		t.Fatalf("replacement of rank 1 logged %s %v, want restore_persistent", ev, fields)
	}
	for r := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := aorSave(t, cs[r], r, bufs[r], 4); err != nil {
				t.Error(err)
			}
			j.nodes[r].per.Wait()
		}()
	}
	wg.Wait()
	for r, n := range j.nodes {
		if evs := n.log.Events("aor_invalid"); len(evs) > 0 {
			t.Fatalf("rank %d: replica invalid after the restore: %v", r, evs)
		}
	}
	j = aorRelaunch(t, j, roots, []int{2}, "b")
	aorRestore(t, j, 4)
	if ev, _ := restoreEvent(t, j.nodes[2]); ev != "restore_peer" {
		t.Fatalf("replacement of rank 2 logged %s, want restore_peer (from rank 1's seeded replica)", ev)
	}
}
