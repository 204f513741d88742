package gpuhealth

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/proto"
)

func TestGPUStatesMatchProto(t *testing.T) {
	for _, p := range [][2]string{{StateStarting, proto.GPUStarting}, {StateOK, proto.GPUOK},
		{StateFailing, proto.GPUFailing}, {StateOff, proto.GPUOff}, {StateUnwatched, proto.GPUUnwatched}} {
		if p[0] != p[1] {
			t.Errorf("gpuhealth state %q, proto %q", p[0], p[1])
		}
	}
}

func TestGPUProto(t *testing.T) {
	since := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	got := ToProto(Status{State: StateFailing, Reason: "GPU 1 (GPU-b): XID 79: GPU has fallen off the bus",
		Devices: []Device{
			{Index: 0, UUID: "GPU-a", State: StateOK, SingleBitECC: 2},
			{Index: 1, UUID: "GPU-b", State: StateFailing, Reason: "XID 79: GPU has fallen off the bus", XID: 79, Since: since},
		}})
	if got.State != proto.GPUFailing || len(got.Devices) != 2 || got.Devices[0].Since != "" || got.Devices[0].SingleBitECC != 2 ||
		got.Devices[1] != (proto.GPUDevice{Index: 1, UUID: "GPU-b", State: proto.GPUFailing, Reason: "XID 79: GPU has fallen off the bus",
			XID: 79, Since: "2025-03-01T12:00:00Z"}) {
		t.Fatalf("gpuProto: %+v", got)
	}
}

func TestGPUHealthDisabled(t *testing.T) {
	var logBuf bytes.Buffer
	g := StatusFunc(context.Background(), false, zerolog.New(&logBuf))()
	if g == nil || g.State != proto.GPUOff || !strings.Contains(g.Reason, "agent.gpu_health = false") {
		t.Fatalf("gpu %+v, want off by reft.toml", g)
	}
	if n := strings.Count(logBuf.String(), `"event":"gpu_health_off"`); n != 1 {
		t.Fatalf("want one gpu_health_off line, got:\n%s", logBuf.String())
	}
}

// TestGPUHealthThisNode starts the real monitor: off with its reason where
// the node has no NVIDIA driver, watching its GPUs where it has one.
func TestGPUHealthThisNode(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gpu := StatusFunc(ctx, true, zerolog.Nop())
	for gpu().State == proto.GPUStarting {
		time.Sleep(time.Millisecond)
	}
	g := gpu()
	t.Logf("gpu: %+v", g)
	switch {
	case g.State == proto.GPUOff && g.Reason == "":
		t.Fatal("off without a reason")
	case g.State != proto.GPUOff && len(g.Devices) == 0:
		t.Fatalf("%s without devices", g.State)
	}
}
