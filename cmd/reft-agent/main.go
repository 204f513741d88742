// Command reft-agent is the per-node, per-job reft daemon. The SPANK plugin
// starts it as the job's user (see spank/README.md); it is not meant to be
// started by hand except for debugging.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/reft-hpc/reft/agent"
	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/agent/gpuhealth"
	"github.com/reft-hpc/reft/launcher/version"
)

func main() {
	if len(os.Args) > 1 && (os.Args[1] == "--version" || os.Args[1] == "version") {
		fmt.Println("reft-agent", version.Version)
		return
	}
	var o agent.Options
	fs := flag.NewFlagSet("reft-agent", flag.ContinueOnError)
	fs.StringVar(&o.ConfigPath, "config", config.DefaultPath, "reft.toml")
	fs.StringVar(&o.Job, "job", "", "Slurm job id")
	fs.StringVar(&o.Node, "node", "", "Slurm node name")
	fs.StringVar(&o.Spec, "spec", "", "the job's --reft SPEC")
	fs.IntVar(&o.UID, "uid", -1, "the job's uid (must be the uid the agent runs as)")
	fs.IntVar(&o.Restart, "restart", 0, "SLURM_RESTART_COUNT")
	fs.StringVar(&o.StartedBy, "started-by", "manual", "who started the agent (extern, step N)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	o.Version = version.Version
	o.GPU = gpuhealth.StatusFunc

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer stop()
	err := agent.Run(ctx, o)
	switch {
	case err == nil:
	case errors.Is(err, agent.ErrAlreadyRunning):
		fmt.Fprintf(os.Stderr, "reft-agent: job %s on %s: %v\n", o.Job, o.Node, err)
	default:
		fmt.Fprintf(os.Stderr, "reft-agent: job %s on %s: %v\n", o.Job, o.Node, err)
		os.Exit(1)
	}
}
