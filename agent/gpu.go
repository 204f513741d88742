package agent

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/agent/gpuhealth"
	"github.com/reft-hpc/reft/agent/proto"
)

// startGPUHealth starts the GPU health monitor (agent/gpuhealth) unless
// reft.toml turns it off, and returns the status reply's gpu section.
// The monitor says itself, once, why it is off on a node without GPUs.
func startGPUHealth(ctx context.Context, cfg config.Config, log zerolog.Logger) func() *proto.GPU {
	if !cfg.Agent.GPUHealth {
		const why = "agent.gpu_health = false in reft.toml"
		log.Info().Str("event", "gpu_health_off").Msg("GPU health off: " + why)
		return func() *proto.GPU { return &proto.GPU{State: proto.GPUOff, Reason: why} }
	}
	m := gpuhealth.Start(ctx, gpuhealth.Options{Log: log})
	return func() *proto.GPU { return gpuProto(m.Status()) }
}

func gpuProto(st gpuhealth.Status) *proto.GPU {
	g := &proto.GPU{State: st.State, Reason: st.Reason}
	for _, d := range st.Devices {
		pd := proto.GPUDevice{Index: d.Index, UUID: d.UUID, State: d.State, Reason: d.Reason,
			XID: d.XID, SingleBitECC: d.SingleBitECC}
		if !d.Since.IsZero() {
			pd.Since = d.Since.UTC().Format(time.RFC3339)
		}
		g.Devices = append(g.Devices, pd)
	}
	return g
}
