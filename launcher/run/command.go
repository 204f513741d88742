// Package run is `reft run`: it launches a training step with srun inside
// the job's allocation, watches it, and when it fails classifies the
// failure (rank, agent, node), relaunches it (on the same nodes, or with a
// spare in a lost node's place), requeues the job when no spare is left,
// and gives up when relaunches stop making progress. Its decisions go to
// the recovery log (launcher/recoverylog) and the job's Comment.
//
// `reft status-local`, which the probe step runs on every node after a
// failure, lives here too.
package run

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/launcher/recoverylog"
)

// Command is `reft run`.
func Command(args []string, stdout, stderr io.Writer) int {
	a, err := ParseArgs(args)
	if a.Help {
		fmt.Fprint(stdout, Usage)
		return ExitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "reft run: %v\n(reft run --help shows the usage)\n", err)
		return ExitUsage
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	r, code, err := Prepare(context.Background(), a, os.Getenv, os.Environ(), nil)
	if err != nil {
		fmt.Fprintf(stderr, "reft run: %v\n", err)
		return code
	}
	defer r.Log.Close()
	r.Stdout, r.Stderr, r.Signals = stdout, stderr, sigs
	return r.Run(context.Background())
}

var numericRe = regexp.MustCompile(`^[0-9]+$`)

// Prepare checks the environment and the configuration and builds the
// Runner (without Stdout, Stderr and Signals). slurm nil means the real
// commands. On error it also returns the exit code.
func Prepare(ctx context.Context, a Args, getenv func(string) string, environ []string, slurm Slurm) (*Runner, int, error) {
	job := getenv("SLURM_JOB_ID")
	if job == "" {
		return nil, ExitUsage, errors.New("not inside an allocation (SLURM_JOB_ID is not set): call reft run from a batch script (sbatch --reft=SPEC) or an salloc shell")
	}
	if numericRe.MatchString(getenv("SLURM_STEP_ID")) {
		return nil, ExitUsage, fmt.Errorf("inside step %s.%s: reft run launches steps itself; call it from the batch script or the salloc shell, not under srun", job, getenv("SLURM_STEP_ID"))
	}
	s, err := JobSpec(a, getenv)
	if err != nil {
		return nil, ExitUsage, err
	}
	cfg, err := config.Load(a.ConfigPath, !a.ConfigGiven && config.MissingOK(a.ConfigPath))
	if err != nil {
		return nil, ExitUsage, err
	}
	policy, err := a.Policy(cfg.Run)
	if err != nil {
		return nil, ExitUsage, err
	}
	if slurm == nil {
		self, err := os.Executable()
		if err != nil {
			return nil, ExitError, fmt.Errorf("finding the reft binary for the probe step: %w", err)
		}
		slurm = Exec{Srun: a.Srun, Scontrol: a.Scontrol, Squeue: a.Squeue, Scancel: "scancel", Self: self,
			ConfigPath: a.ConfigPath, Env: environ}
	}
	list := getenv("SLURM_JOB_NODELIST")
	if list == "" {
		return nil, ExitUsage, errors.New("SLURM_JOB_NODELIST is not set: reft run needs the allocation's environment (run it in the batch script or the salloc shell)")
	}
	alloc, err := slurm.Hostnames(ctx, list)
	if err != nil {
		return nil, ExitError, fmt.Errorf("the allocation's nodes: %w", err)
	}
	spares := s.Spares
	if a.Spares >= 0 {
		spares = a.Spares
	}
	if spares >= len(alloc) {
		return nil, ExitUsage, fmt.Errorf("spares=%d leaves no node for the step in an allocation of %d node(s) (%s); ask for more nodes (sbatch -N) or fewer spares",
			spares, len(alloc), list)
	}
	tpn, err := TasksPerNode(a, len(alloc)-spares, getenv)
	if err != nil {
		return nil, ExitUsage, err
	}
	plan, err := NewPlan(alloc, spares, tpn)
	if err != nil {
		return nil, ExitUsage, err
	}
	restart := 0
	if v := getenv("SLURM_RESTART_COUNT"); v != "" {
		if restart, err = strconv.Atoi(v); err != nil {
			return nil, ExitError, fmt.Errorf("SLURM_RESTART_COUNT=%q is not a number", v)
		}
	}
	// Nodes that an earlier reft run of this allocation lost stay out.
	prior, _, err := recoverylog.ReadFile(recoverylog.Path(cfg.Log.Dir, job))
	if err != nil {
		return nil, ExitError, err
	}
	for _, e := range prior {
		if e.Event == recoverylog.NodeExcluded && e.Restart == restart {
			if _, ok := plan.Replace(e.Node); !ok {
				return nil, ExitError, fmt.Errorf("node %s was lost earlier in this allocation (%s) and no spare is left to replace it: requeue the job (scontrol requeue %s)",
					e.Node, recoverylog.Path(cfg.Log.Dir, job), job)
			}
		}
	}
	rel, err := slurm.Release(ctx)
	if err != nil {
		return nil, ExitError, err
	}
	w, err := recoverylog.Open(cfg.Log.Dir, job)
	if err != nil {
		return nil, ExitError, err
	}
	var earlier []recoverylog.Event
	for _, e := range prior {
		if e.Restart < restart {
			earlier = append(earlier, e)
		}
	}
	// Stragglers and degraded nodes are asked of the agents as reft
	// status asks them; a configuration that cannot reach them was
	// refused by the agents too.
	var health HealthSource
	var healthOff error
	if s.String() != "off" {
		health, healthOff = AgentHealthSource(cfg, job)
	}
	return &Runner{
		Health:       health,
		healthOff:    healthOff,
		SlurmRelease: rel,
		Prior:        earlier,
		Slurm:        slurm, Log: w, Env: environ, Job: job, Restart: restart, Spec: s.String(), Plan: plan,
		Policy: policy, Srun: a.Srun, SrunOpts: a.SrunOpts, Command: a.Command,
		JobLogDir: filepath.Dir(recoverylog.Path(cfg.Log.Dir, job)),
	}, ExitOK, nil
}
