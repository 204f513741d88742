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
// and its ZeRO-1 shard of the optimizer's state (m and v for Adam and
// AdamW, m for momentum, none for SGD). The test computes every owner's
// state with agent/aor's kernels, as a trainer does; the agents keep the
// replicas. A lost node's rank gets back its state from its ring
// predecessor's replica, bit for bit.

const aorElems = 40_003 // gradient elements

var (
	aorCut  = [][2]int64{{0, 10_001}, {10_001, 10_001}, {20_002, 10_001}, {30_003, 10_000}}
	aorAdam = aor.Optimizer{Kind: aor.Adam, Beta1: 0.9, Beta2: 0.999}
	// aorOptimizers are the optimizers AOR supports, PyTorch's defaults
	// (momentum's factor as commonly set).
	aorOptimizers = []aor.Optimizer{
		{Kind: aor.SGD},
		{Kind: aor.Momentum, Momentum: 0.9},
		aorAdam,
		{Kind: aor.AdamW, Beta1: 0.9, Beta2: 0.999},
	}
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

// aorOptState is rank dp's optimizer state after steps 1..step (from zero),
// by state buffer name (m, v; none for sgd).
func aorOptState(opt aor.Optimizer, step int64, dp int) map[string][]float32 {
	sh := aorCut[dp]
	out := map[string][]float32{}
	for _, name := range opt.StateBuffers() {
		out[name] = make([]float32, sh[1])
	}
	for s := int64(1); s <= step; s++ {
		g := aorGrad(s)[sh[0] : sh[0]+sh[1]]
		opt.Moments(out[aor.StateM], out[aor.StateV], g)
	}
	return out
}

// aorRankBufs are a rank's buffers at step (zeros at step 0).
func aorRankBufs(t testing.TB, opt aor.Optimizer, step int64, rank int) map[string][]byte {
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
	for name, f := range aorOptState(opt, step, rank) {
		put(name, f)
	}
	return out
}

func aorInfo(opt aor.Optimizer, state string, rank int) reftclient.AOR {
	return reftclient.AOR{Optimizer: opt.Kind, State: state, Beta1: opt.Beta1, Beta2: opt.Beta2, Momentum: opt.Momentum,
		Grad: "grads", Shards: aorCut, Index: rank}
}

// aorOpen registers a rank's buffers as reft-train does under --zero1: the
// gradient and the state buffers with aor objects; without state (sgd)
// the gradient is a replicated buffer like any other.
func aorOpen(t testing.TB, j *shJobRun, opt aor.Optimizer, rank int, bufs map[string][]byte) *reftclient.Client {
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
	for _, st := range opt.StateBuffers() {
		must(c.RegisterOptimizerState(st, bufs[st], aorInfo(opt, st, rank)))
	}
	return c
}

// aorSave has client c of rank save steps (bufs updated to each first).
func aorSave(t testing.TB, c *reftclient.Client, opt aor.Optimizer, rank int, bufs map[string][]byte, steps ...int64) error {
	for _, st := range steps {
		for k, v := range aorRankBufs(t, opt, st, rank) {
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
// step, bit for bit; it returns the clients (still open) and their buffers.
func aorRestore(t *testing.T, j *shJobRun, opt aor.Optimizer, want int64) ([]*reftclient.Client, []map[string][]byte) {
	t.Helper()
	w := len(j.nodes)
	cs := make([]*reftclient.Client, w)
	bufs := make([]map[string][]byte, w)
	gens := make([][]int64, w)
	errs := make([]error, w)
	var wg sync.WaitGroup
	for r := range w {
		bufs[r] = aorRankBufs(t, opt, 0, r)
		cs[r] = aorOpen(t, j, opt, r, bufs[r])
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
		exp := aorRankBufs(t, opt, want, r)
		for _, name := range append([]string{"layer0.weight"}, opt.StateBuffers()...) {
			if !slices.Equal(bufs[r][name], exp[name]) {
				t.Fatalf("rank %d buffer %s differs from step %d", r, name, want)
			}
		}
	}
	return cs, bufs
}

// restoreEvent is the single restore event a node logged.
func restoreEvent(t testing.TB, n *shNode) (string, map[string]any) {
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

// TestAORRestoreEveryNode: for SGD, momentum, Adam and AdamW, with aor
// (replicated buffers whole on every member), arc+aor (sharded slice with
// ARC copies) and aec+aor (sharded slice with XOR parity), losing any one
// node restores every rank's parameters and optimizer state bit for bit,
// the lost rank's state from its predecessor's AOR replica; the ranks
// then go on saving from the seeded replicas, and losing the next node
// restores again. SGD keeps no state, so AOR has nothing to replicate and
// its registration is an ordinary one: aor alone gives it no protection
// across nodes (the agent says so), arc or aec do.
func TestAORRestoreEveryNode(t *testing.T) {
	type tcase struct {
		opt  aor.Optimizer
		spec string
	}
	var cases []tcase
	for _, o := range aorOptimizers {
		for _, spc := range []string{"aor", "arc+aor", "aec+aor"} {
			cases = append(cases, tcase{o, spc})
		}
	}
	for _, tc := range cases {
		states := tc.opt.StateBuffers()
		for lost := range 4 {
			t.Run(fmt.Sprintf("%s/%s/lost=%d", tc.opt.Kind, tc.spec, lost), func(t *testing.T) {
				roots := map[string]string{}
				j := startJob(t, tc.spec, []string{"n1", "n2", "n3", "n4"}, roots, "")
				var wg sync.WaitGroup
				for r := range 4 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						bufs := aorRankBufs(t, tc.opt, 0, r)
						c := aorOpen(t, j, tc.opt, r, bufs)
						defer c.Close()
						if err := aorSave(t, c, tc.opt, r, bufs, 1, 2, 3); err != nil {
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
				if len(states) == 0 && tc.spec == "aor" {
					// Nothing to replicate: the ranks' registrations are not
					// sharded, so the lost rank's state is nowhere else.
					j = aorRelaunch(t, j, roots, []int{lost}, "a")
					c := aorOpen(t, j, tc.opt, lost, aorRankBufs(t, tc.opt, 0, lost))
					defer c.Close()
					if g, err := c.Generations(context.Background()); err != nil || len(g) != 0 {
						t.Fatalf("rank %d's replacement lists steps %v (%v) under aor with SGD, which has no state to replicate", lost, g, err)
					}
					evs := j.nodes[lost].log.Events("protection_local")
					if len(evs) != 1 || !strings.Contains(fmt.Sprint(evs[0]["reason"]), "add arc or aec") {
						t.Fatalf("rank %d's agent logged protection_local %v, want one saying aor has nothing to replicate", lost, evs)
					}
					return
				}
				j = aorRelaunch(t, j, roots, []int{lost}, "a")
				cs, bufs := aorRestore(t, j, tc.opt, 3)
				ev, fields := restoreEvent(t, j.nodes[lost])
				src, _ := fields["sources"].(string)
				if ev != "restore_peer" && ev != "decode" {
					t.Fatalf("replacement of rank %d logged %s, want restore_peer or decode", lost, ev)
				}
				for _, st := range states {
					if !strings.Contains(src, st+":aor@") {
						t.Fatalf("replacement of rank %d logged sources %q, want %s from the AOR replica", lost, src, st)
					}
				}
				// Go on: step 4 from the replicas the restore seeded.
				for r := range 4 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						if err := aorSave(t, cs[r], tc.opt, r, bufs[r], 4); err != nil {
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
				aorRestore(t, j, tc.opt, 4)
				if ev, _ := restoreEvent(t, j.nodes[next]); ev != "restore_peer" && ev != "decode" {
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
			bufs := aorRankBufs(t, aorAdam, 0, r)
			c := aorOpen(t, j, aorAdam, r, bufs)
			defer c.Close()
			steps := []int64{1, 2, 3}
			if r == 0 {
				steps = []int64{1, 3}
			}
			if err := aorSave(t, c, aorAdam, r, bufs, steps...); err != nil {
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
	c := aorOpen(t, j, aorAdam, 1, aorRankBufs(t, aorAdam, 0, 1))
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
		x := aorInfo(aorAdam, state, idx)
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
			bufs := aorRankBufs(t, aorAdam, 0, r)
			c := aorOpen(t, j, aorAdam, r, bufs)
			defer c.Close()
			steps := []int64{1, 2, 3}
			if r == 0 {
				steps = []int64{1, 3}
			}
			for _, st := range steps {
				if err := aorSave(t, c, aorAdam, r, bufs, st); err != nil {
					t.Error(err)
					return
				}
				j.nodes[r].per.Wait()
			}
		}()
	}
	wg.Wait()
	j = aorRelaunch(t, j, roots, []int{1}, "a")
	cs, bufs := aorRestore(t, j, aorAdam, 3)
	if ev, fields := restoreEvent(t, j.nodes[1]); ev != "restore_persistent" {
		t.Fatalf("replacement of rank 1 logged %s %v, want restore_persistent", ev, fields)
	}
	for r := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := aorSave(t, cs[r], aorAdam, r, bufs[r], 4); err != nil {
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
	aorRestore(t, j, aorAdam, 4)
	if ev, _ := restoreEvent(t, j.nodes[2]); ev != "restore_peer" {
		t.Fatalf("replacement of rank 2 logged %s, want restore_peer (from rank 1's seeded replica)", ev)
	}
}
