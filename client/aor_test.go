package client_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/client"
)

// TestAOR: the client reports AOR from the SPEC of the agent's hello reply.
func TestAOR(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want bool
	}{{"arc", false}, {"aor", true}, {"arc+aec:2+aor,every=2", true}, {"off", false}, {"", false}, {"nonsense", false}} {
		fa := &fakeAgent{reply: func(f proto.Frame) ([]proto.Frame, bool) {
			b, _ := json.Marshal(proto.HelloReply{Protocol: proto.Version, Spec: tc.spec})
			return []proto.Frame{msg(proto.THelloReply, f.ID, string(b))}, false
		}}
		c, err := client.Open(context.Background(), client.Options{Socket: fa.start(t)})
		if err != nil {
			t.Fatal(err)
		}
		if got := c.AOR(); got != tc.want {
			t.Errorf("spec %q: AOR() = %v, want %v", tc.spec, got, tc.want)
		}
		c.Close()
	}
	t.Setenv(client.SocketEnv, "")
	c, err := client.Open(context.Background(), client.Options{Optional: true})
	if err != nil {
		t.Fatal(err)
	}
	if c.AOR() {
		t.Error("a disabled client reports AOR")
	}
}

func adamState(state string, index int) client.AOR {
	return client.AOR{Optimizer: "adam", State: state, Beta1: 0.9, Beta2: 0.999, Grad: "grads",
		Shards: [][2]int64{{0, 256}, {256, 256}}, Index: index}
}

// TestRegisterOptimizerStateWire: the register request carries the aor
// objects, the gradient as a plain replicated buffer.
func TestRegisterOptimizerStateWire(t *testing.T) {
	var mu sync.Mutex
	var got proto.Register
	fa := &fakeAgent{reply: func(f proto.Frame) ([]proto.Frame, bool) {
		switch f.Type {
		case proto.THello:
			return []proto.Frame{msg(proto.THelloReply, f.ID, helloOK)}, false
		case proto.TRegister:
			mu.Lock()
			f.Unmarshal(&got)
			mu.Unlock()
		}
		return []proto.Frame{msg(proto.TError, f.ID, `{"code":"internal","message":"seen"}`)}, false
	}}
	c, err := client.Open(context.Background(), client.Options{Socket: fa.start(t), Rank: 1, World: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	shards := [][2]int64{{0, 256}, {256, 256}}
	a := adamState("m", 1)
	a.Shards = shards
	must(t, c.Register("grads", make([]byte, 2048), client.Replicated))
	must(t, c.RegisterOptimizerState("m", make([]byte, 1024), a))
	shards[1][1] = 7 // the client keeps its own copy
	must(t, c.RegisterOptimizerState("v", make([]byte, 1024), adamState("v", 1)))
	if err := c.Save(1).Wait(context.Background()); err == nil || !strings.Contains(err.Error(), "seen") {
		t.Fatalf("Save = %v, want the fake agent's error", err)
	}
	mu.Lock()
	defer mu.Unlock()
	b, _ := json.Marshal(got.Buffers)
	want := `[{"name":"grads","size":2048,"replicated":true},` +
		`{"name":"m","size":1024,"replicated":false,"aor":{"optimizer":"adam","state":"m","beta1":0.9,"beta2":0.999,"grad":"grads","shards":[[0,256],[256,256]],"index":1}},` +
		`{"name":"v","size":1024,"replicated":false,"aor":{"optimizer":"adam","state":"v","beta1":0.9,"beta2":0.999,"grad":"grads","shards":[[0,256],[256,256]],"index":1}}]`
	if string(b) != want {
		t.Errorf("register buffers\n got  %s\n want %s", b, want)
	}
}

// TestRegisterOptimizerState: against a real agent (which needs no AOR to
// store the buffers), an incomplete set is refused by the client before
// the agent is asked, registration stays open, and the complete set saves
// and restores.
func TestRegisterOptimizerState(t *testing.T) {
	a := startAgent(t)
	c := open(t, a, client.Options{Rank: 0, World: 1})
	grads, m, v := patterned(2048, 1), patterned(1024, 2), patterned(1024, 3)
	must(t, c.Register("grads", grads, client.Replicated))
	must(t, c.RegisterOptimizerState("m", m, adamState("m", 0)))
	err := c.Save(1).Wait(ctxT(t))
	if err == nil || !strings.Contains(err.Error(), `buffer "m": adam state v of gradient "grads" is not registered with aor`) {
		t.Fatalf("Save of m without v = %v", err)
	}
	must(t, c.RegisterOptimizerState("v", v, adamState("v", 0)))
	if err := c.Save(1).Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	want := [][]byte{append([]byte(nil), grads...), append([]byte(nil), m...), append([]byte(nil), v...)}
	clear(grads)
	clear(m)
	clear(v)
	if step, ok, err := c.Restore(ctxT(t)); err != nil || !ok || step != 1 {
		t.Fatalf("Restore = %d, %v, %v", step, ok, err)
	}
	mustEqual(t, "grads", grads, want[0])
	mustEqual(t, "m", m, want[1])
	mustEqual(t, "v", v, want[2])
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
