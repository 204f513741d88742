package train

import (
	"fmt"
	"strings"
	"testing"

	"github.com/reft-hpc/reft/agent/aor"
	"github.com/reft-hpc/reft/agent/logging/logtest"
	"github.com/reft-hpc/reft/agent/proto"
)

// TestOptimizerMatchesAOR: the trainer's optimizer on a shard and
// aor.Moments (and aor.Update per state) on a replica, fed the same
// gradients, hold the same bits after every step, for every kind.
func TestOptimizerMatchesAOR(t *testing.T) {
	for _, kind := range []string{SGD, Momentum, Adam, AdamW} {
		t.Run(kind, func(t *testing.T) {
			c := small()
			c.Optimizer = kind
			const n = 999
			o := newOptimizer(&c, n)
			p := make([]float32, n)
			rm, rv := make([]float32, n), make([]float32, n)
			um, uv := make([]float32, n), make([]float32, n)
			g := make([]float32, n)
			for step := int64(1); step <= 40; step++ {
				for i := range g {
					g[i] = float32(splitmix(uint64(step)<<20|uint64(i))%2001-1000) * 1e-4
				}
				o.prepare(step)
				parallelFor(n, 3, 1<<15, func(a, b int) { o.update(p, g, a, b) })
				o.st.Moments(rm, rv, g)
				for _, st := range o.st.StateBuffers() {
					if err := o.st.Update(st, map[string][]float32{aor.StateM: um, aor.StateV: uv}[st], g); err != nil {
						t.Fatal(err)
					}
				}
				switch kind {
				case SGD:
					if o.m != nil || o.v != nil || len(o.st.StateBuffers()) != 0 {
						t.Fatal("sgd keeps state")
					}
				case Momentum:
					if !aor.Equal(o.m, rm) || !aor.Equal(o.m, um) || o.v != nil {
						t.Fatalf("step %d: momentum replica differs", step)
					}
				default:
					if !aor.Equal(o.m, rm) || !aor.Equal(o.v, rv) || !aor.Equal(o.m, um) || !aor.Equal(o.v, uv) {
						t.Fatalf("step %d: %s replica differs", step, kind)
					}
				}
			}
		})
	}
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

func floats(t *testing.T, b []byte) []float32 {
	t.Helper()
	f, err := aor.Float32s(append(make([]byte, 0, len(b)), b...))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestAORReplay is the AOR contract end to end in the trainer: with an
// AOR snapshotter, a ZeRO-1 run registers the gradient and its optimizer
// shards with valid aor objects (proto.CheckAOR), and a replica of each
// rank's shard, kept by its ring predecessor from the gradient in the
// predecessor's own snapshot of every step, equals the owner's saved
// state bit for bit at every step. The parameters are those of a run
// without AOR.
func TestAORReplay(t *testing.T) {
	for _, kind := range []string{Momentum, Adam, AdamW} {
		t.Run(kind, func(t *testing.T) {
			c := small()
			c.Optimizer, c.DP, c.PP, c.Zero1, c.SaveEvery, c.Threads, c.Batch = kind, 3, 2, true, 1, 2, 18
			n := c.DP * c.PP
			plain := runOK(t, c, n, nil)
			store := NewMemStore(n)
			store.EnableAOR()
			got := runOK(t, c, n, func(r int) Options { return Options{Snap: store.Rank(r)} })
			if got.Hash != plain.Hash {
				t.Errorf("hash with AOR %s, without %s", got.Hash, plain.Hash)
			}
			states := []string{aor.StateM}
			if kind != Momentum {
				states = append(states, aor.StateV)
			}
			names := map[string]string{aor.StateM: "optimizer.m", aor.StateV: "optimizer.v"}
			for pipe := 0; pipe < c.PP; pipe++ {
				for q := 0; q < c.DP; q++ {
					owner, holder := q+c.DP*pipe, (q+c.DP-1)%c.DP+c.DP*pipe
					reg := store.OptimizerStates(owner)
					if len(reg) != len(states) {
						t.Fatalf("rank %d registered %d aor buffers, want %d", owner, len(reg), len(states))
					}
					g1 := store.Generation(1, owner)
					specs := []proto.BufferSpec{{Name: "gradients", Size: int64(len(g1["gradients"])), Replicated: true}}
					for _, st := range states {
						o := reg[names[st]]
						if o.Index != q || o.State != st || o.Grad != "gradients" || o.Optimizer.Kind != kind {
							t.Fatalf("rank %d %s: %+v", owner, st, o)
						}
						specs = append(specs, proto.BufferSpec{Name: names[st], Size: int64(len(g1[names[st]])),
							AOR: &proto.AOR{Optimizer: o.Optimizer.Kind, State: o.State, Beta1: o.Optimizer.Beta1, Beta2: o.Optimizer.Beta2,
								Momentum: o.Optimizer.Momentum, Grad: o.Grad, Shards: o.Shards, Index: o.Index}})
					}
					if err := proto.CheckAOR(specs); err != nil {
						t.Fatalf("rank %d: %v", owner, err)
					}
					sh := reg[names[aor.StateM]].Shards[q]
					opt := reg[names[aor.StateM]].Optimizer
					replica := map[string][]float32{}
					for _, st := range states {
						replica[st] = make([]float32, sh[1])
					}
					for step := int64(1); step <= c.Steps; step++ {
						grad := floats(t, store.Generation(step, holder)["gradients"])[sh[0] : sh[0]+sh[1]]
						own := store.Generation(step, owner)
						for _, st := range states {
							if err := opt.Update(st, replica[st], grad); err != nil {
								t.Fatal(err)
							}
							if !aor.Equal(replica[st], floats(t, own[names[st]])) {
								t.Fatalf("step %d: rank %d's replica of rank %d's %s differs from the owner's", step, holder, owner, st)
							}
						}
					}
				}
			}
		})
	}
}

// TestAORRegistration: the gradient is registered only when it is of use.
func TestAORRegistration(t *testing.T) {
	for _, tc := range []struct {
		opt       string
		dp        int
		zero1     bool
		every     int64
		enable    bool
		want      bool
		wantNotes string
	}{
		{Adam, 2, true, 1, true, true, ""},
		{Adam, 2, true, 1, false, false, ""}, // the job has no aor
		{Adam, 2, false, 1, true, false, ""}, // replicated optimizer state
		{SGD, 2, true, 1, true, false, ""},   // no state
		{Momentum, 1, true, 1, true, false, ""},
		{AdamW, 2, true, 2, true, false, "--save-every is 2, not 1"},
	} {
		t.Run(fmt.Sprintf("%s-dp%d-zero1=%v-every%d-aor=%v", tc.opt, tc.dp, tc.zero1, tc.every, tc.enable), func(t *testing.T) {
			c := small()
			c.Optimizer, c.DP, c.Zero1, c.SaveEvery, c.Steps = tc.opt, tc.dp, tc.zero1, tc.every, 2
			store := NewMemStore(tc.dp)
			if tc.enable {
				store.EnableAOR()
			}
			var log logBuf
			runOK(t, c, tc.dp, func(r int) Options { return Options{Snap: store.Rank(r), Log: &log} })
			_, has := store.Generation(2, 0)["gradients"]
			if has != tc.want || (len(store.OptimizerStates(0)) > 0) != tc.want {
				t.Errorf("gradients registered %v, aor states %v; want %v", has, store.OptimizerStates(0), tc.want)
			}
			if tc.wantNotes != "" && !log.contains(tc.wantNotes) {
				t.Errorf("log %q lacks %q", log.String(), tc.wantNotes)
			}
		})
	}
}

// logBuf is an io.Writer for a rank's log that tests can read.
type logBuf struct{ logtest.Buffer }

func (l *logBuf) contains(s string) bool { return strings.Contains(l.String(), s) }
