package agent

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/agent/gpuhealth"
	"github.com/reft-hpc/reft/agent/proto"
)

func TestGPUStatesMatchProto(t *testing.T) {
	for _, p := range [][2]string{{gpuhealth.StateStarting, proto.GPUStarting}, {gpuhealth.StateOK, proto.GPUOK},
		{gpuhealth.StateFailing, proto.GPUFailing}, {gpuhealth.StateOff, proto.GPUOff}, {gpuhealth.StateUnwatched, proto.GPUUnwatched}} {
		if p[0] != p[1] {
			t.Errorf("gpuhealth state %q, proto %q", p[0], p[1])
		}
	}
}

func TestGPUProto(t *testing.T) {
	since := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	got := gpuProto(gpuhealth.Status{State: gpuhealth.StateFailing, Reason: "GPU 1 (GPU-b): XID 79: GPU has fallen off the bus",
		Devices: []gpuhealth.Device{
			{Index: 0, UUID: "GPU-a", State: gpuhealth.StateOK, SingleBitECC: 2},
			{Index: 1, UUID: "GPU-b", State: gpuhealth.StateFailing, Reason: "XID 79: GPU has fallen off the bus", XID: 79, Since: since},
		}})
	if got.State != proto.GPUFailing || len(got.Devices) != 2 || got.Devices[0].Since != "" || got.Devices[0].SingleBitECC != 2 ||
		got.Devices[1] != (proto.GPUDevice{Index: 1, UUID: "GPU-b", State: proto.GPUFailing, Reason: "XID 79: GPU has fallen off the bus",
			XID: 79, Since: "2025-03-01T12:00:00Z"}) {
		t.Fatalf("gpuProto: %+v", got)
	}
}

// statusWithGPU runs a server whose status reply carries gpu and returns the reply.
func statusWithGPU(t *testing.T, gpu func() *proto.GPU) proto.Status {
	t.Helper()
	path := filepath.Join(t.TempDir(), "agent.sock")
	s, err := Listen(path, Info{Job: "42", Node: "n1", Spec: "arc", Version: "test", UID: os.Getuid()}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	s.AttachGPU(gpu)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	defer func() { cancel(); <-done }()
	var st proto.Status
	if err := proto.Call(dial(t, path), proto.TStatus, 1, nil, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func TestGPUHealthDisabled(t *testing.T) {
	cfg := config.Default()
	cfg.Agent.GPUHealth = false
	var logBuf bytes.Buffer
	st := statusWithGPU(t, startGPUHealth(context.Background(), cfg, zerolog.New(&logBuf)))
	if st.GPU == nil || st.GPU.State != proto.GPUOff || !strings.Contains(st.GPU.Reason, "agent.gpu_health = false") {
		t.Fatalf("status gpu %+v, want off by reft.toml", st.GPU)
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
	gpu := startGPUHealth(ctx, config.Default(), zerolog.Nop())
	for gpu().State == proto.GPUStarting {
		time.Sleep(time.Millisecond)
	}
	st := statusWithGPU(t, gpu)
	t.Logf("gpu: %+v", st.GPU)
	switch {
	case st.GPU == nil:
		t.Fatal("no gpu section")
	case st.GPU.State == proto.GPUOff && st.GPU.Reason == "":
		t.Fatal("off without a reason")
	case st.GPU.State != proto.GPUOff && len(st.GPU.Devices) == 0:
		t.Fatalf("%s without devices", st.GPU.State)
	}
}
