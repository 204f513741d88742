package proto

import (
	"encoding/json"
	"strings"
	"testing"
)

// adamRank1 is a valid registration: rank 1 of a DP group of 3 whose
// ZeRO-1 cut of a 10-element gradient is 4, 4, 2 elements.
func adamRank1() []BufferSpec {
	a := func(state string) *AOR {
		return &AOR{Optimizer: "adam", State: state, Beta1: 0.9, Beta2: 0.999, Grad: "grads",
			Shards: [][2]int64{{0, 4}, {4, 4}, {8, 2}}, Index: 1}
	}
	return []BufferSpec{
		{Name: "w", Size: 40, Replicated: true},
		{Name: "grads", Size: 40, Replicated: true},
		{Name: "optimizer.m", Size: 16, AOR: a("m")},
		{Name: "optimizer.v", Size: 16, AOR: a("v")},
	}
}

func TestCheckAOR(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(b []BufferSpec) []BufferSpec
		want string // "" valid; else a substring of the error
	}{
		{"valid adam", func(b []BufferSpec) []BufferSpec { return b }, ""},
		{"no aor at all", func(b []BufferSpec) []BufferSpec {
			b[2].AOR, b[3].AOR = nil, nil
			return b
		}, ""},
		{"valid momentum", func(b []BufferSpec) []BufferSpec {
			b[2].AOR.Optimizer, b[2].AOR.Beta1, b[2].AOR.Beta2, b[2].AOR.Momentum = "momentum", 0, 0, 0.9
			return b[:3]
		}, ""},
		{"last rank", func(b []BufferSpec) []BufferSpec {
			b[2].AOR.Index, b[3].AOR.Index, b[2].Size, b[3].Size = 2, 2, 8, 8
			return b
		}, ""},
		{"unknown optimizer", func(b []BufferSpec) []BufferSpec {
			b[2].AOR.Optimizer = "lion"
			return b
		}, `buffer "optimizer.m": aor.optimizer "lion": use one of sgd, momentum, adam, adamw`},
		{"sgd", func(b []BufferSpec) []BufferSpec {
			b[2].AOR.Optimizer = "sgd"
			return b
		}, `aor.optimizer "sgd" keeps no state`},
		{"bad beta", func(b []BufferSpec) []BufferSpec {
			b[2].AOR.Beta2 = 1
			return b
		}, `buffer "optimizer.m": aor.beta2 1: must be in [0, 1)`},
		{"state not of the optimizer", func(b []BufferSpec) []BufferSpec {
			b[2].AOR.Optimizer, b[2].AOR.State = "momentum", "v"
			return b[:3]
		}, `aor.state "v": optimizer momentum keeps [m]`},
		{"replicated", func(b []BufferSpec) []BufferSpec {
			b[3].Replicated = true
			return b
		}, `buffer "optimizer.v": an aor buffer is this rank's ZeRO-1 shard: register it with replicated false`},
		{"grad empty", func(b []BufferSpec) []BufferSpec {
			b[2].AOR.Grad = ""
			return b
		}, "aor.grad is empty"},
		{"grad not registered", func(b []BufferSpec) []BufferSpec {
			b[2].AOR.Grad = "gradients"
			return b
		}, `aor.grad "gradients" is not a registered buffer`},
		{"grad not replicated", func(b []BufferSpec) []BufferSpec {
			b[1].Replicated = false
			return b
		}, `aor.grad "grads" is not replicated`},
		{"grad is aor", func(b []BufferSpec) []BufferSpec {
			b[2].AOR.Grad = "optimizer.v"
			return b
		}, `aor.grad "optimizer.v" is itself an aor buffer`},
		{"grad not float32", func(b []BufferSpec) []BufferSpec {
			b[1].Size = 41
			return b
		}, "not a whole number of float32 elements"},
		{"no shards", func(b []BufferSpec) []BufferSpec {
			b[2].AOR.Shards = nil
			return b
		}, "aor.shards is empty"},
		{"gap", func(b []BufferSpec) []BufferSpec {
			b[2].AOR.Shards = [][2]int64{{0, 4}, {5, 4}, {8, 2}}
			return b
		}, "aor.shards[1] = [5 4] starts at element 5, want 4"},
		{"negative count", func(b []BufferSpec) []BufferSpec {
			b[2].AOR.Shards = [][2]int64{{0, 4}, {4, -1}, {3, 7}}
			return b
		}, "aor.shards[1] = [4 -1]: negative element count"},
		{"short of the end", func(b []BufferSpec) []BufferSpec {
			b[2].AOR.Shards = [][2]int64{{0, 4}, {4, 4}, {8, 1}}
			return b
		}, `aor.shards cover 9 elements (36 bytes), grad "grads" has 40 bytes`},
		{"huge", func(b []BufferSpec) []BufferSpec {
			b[2].AOR.Shards = [][2]int64{{0, 4}, {4, 1 << 62}}
			return b
		}, "too large"},
		{"index out of range", func(b []BufferSpec) []BufferSpec {
			b[2].AOR.Index = 3
			return b
		}, "aor.index 3: must be this rank's DP index, in [0, 3)"},
		{"size not the shard", func(b []BufferSpec) []BufferSpec {
			b[2].Size = 40
			return b
		}, `buffer "optimizer.m" has 40 bytes, its aor shard (shards[1] = [4 4]) 4 elements: register exactly this rank's shard, 16 bytes`},
		{"states disagree", func(b []BufferSpec) []BufferSpec {
			b[3].AOR.Beta1 = 0.8
			return b
		}, `buffers "optimizer.m" and "optimizer.v" share grad "grads" but differ in aor.beta1`},
		{"shards disagree", func(b []BufferSpec) []BufferSpec {
			b[3].AOR.Shards = [][2]int64{{0, 2}, {2, 4}, {6, 4}}
			return b
		}, "differ in aor.shards"},
		{"state twice", func(b []BufferSpec) []BufferSpec {
			b[3].AOR.State = "m"
			return b
		}, `buffers "optimizer.m" and "optimizer.v" are both state m of gradient "grads"`},
		{"v missing", func(b []BufferSpec) []BufferSpec { return b[:3] },
			`buffer "optimizer.m": adam state v of gradient "grads" is not registered with aor`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckAOR(tc.edit(adamRank1()))
			switch {
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one with %q", err, tc.want)
			}
		})
	}
}

// TestAORWire: the aor object's JSON, and a buffer without one sends no
// "aor" key (so registrations of older clients are byte-identical).
func TestAORWire(t *testing.T) {
	b := adamRank1()
	got, err := json.Marshal(b[2])
	if err != nil {
		t.Fatal(err)
	}
	want := `{"name":"optimizer.m","size":16,"replicated":false,"aor":{"optimizer":"adam","state":"m","beta1":0.9,"beta2":0.999,"grad":"grads","shards":[[0,4],[4,4],[8,2]],"index":1}}`
	if string(got) != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	var back BufferSpec
	if err := json.Unmarshal(got, &back); err != nil || back.AOR.Beta2 != float32(0.999) || back.AOR.Shards[2] != [2]int64{8, 2} {
		t.Errorf("round trip: %+v %v", back.AOR, err)
	}
	plain, _ := json.Marshal(b[0])
	if strings.Contains(string(plain), "aor") {
		t.Errorf("a plain buffer sends %s", plain)
	}
}
