package gpuhealth

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/proto"
)

// StatusFunc starts the monitor unless enabled is false (agent.gpu_health
// in reft.toml) and returns the agent status reply's gpu section. The
// monitor says itself, once, why it is off on a node without GPUs. It has
// the signature of agent.Options.GPU: reft-agent passes it there, so that
// package agent (which the SPANK plugin links) never links NVML.
func StatusFunc(ctx context.Context, enabled bool, log zerolog.Logger) func() *proto.GPU {
	if !enabled {
		const why = "agent.gpu_health = false in reft.toml"
		log.Info().Str("event", "gpu_health_off").Msg("GPU health off: " + why)
		return func() *proto.GPU { return &proto.GPU{State: proto.GPUOff, Reason: why} }
	}
	m := Start(ctx, Options{Log: log})
	return func() *proto.GPU { return ToProto(m.Status()) }
}

// ToProto is a Status as the status reply carries it.
func ToProto(st Status) *proto.GPU {
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
