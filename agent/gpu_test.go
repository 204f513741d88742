package agent

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/proto"
)

func TestStatusCarriesGPU(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.sock")
	s, err := Listen(path, Info{Job: "42", Node: "n1", Spec: "arc", Version: "test", UID: os.Getuid()}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	s.AttachGPU(func() *proto.GPU { return &proto.GPU{State: proto.GPUFailing, Reason: "GPU 1: XID 79"} })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	defer func() { cancel(); <-done }()
	var st proto.Status
	if err := proto.Call(dial(t, path), proto.TStatus, 1, nil, &st); err != nil {
		t.Fatal(err)
	}
	if st.GPU == nil || st.GPU.State != proto.GPUFailing || st.GPU.Reason != "GPU 1: XID 79" {
		t.Fatalf("status gpu %+v", st.GPU)
	}
}

// TestNoNVMLInAgent keeps NVML out of package agent: the SPANK plugin links
// it, and a c-shared library with go-nvml's unresolved symbols fails to
// load in slurmstepd ("undefined symbol: nvml...").
func TestNoNVMLInAgent(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/reft-hpc/reft/agent", "github.com/reft-hpc/reft/spank/plugin").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.Contains(dep, "go-nvml") || strings.HasSuffix(dep, "/agent/gpuhealth") {
			t.Fatalf("package agent or the SPANK plugin depends on %s; start GPU health from reft-agent's main (agent.Options.GPU)", dep)
		}
	}
}
