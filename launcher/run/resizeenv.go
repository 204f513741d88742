package run

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/reft-hpc/reft/pmix/hostlist"
)

// resizedEnv is env (the batch script's environment) rewritten for an
// allocation shrunk to held, as the script Slurm writes for a resize
// (scontrol's slurm_job_<id>_resize.sh) would leave it: the node list
// and node counts name only held, SLURM_JOB_CPUS_PER_NODE counts only
// their CPUs, and the task counts Slurm cannot recompute are unset.
// Without it a relaunch after a shrink ran with the list of the
// allocation as submitted, lost node included: Slurm's mpi/pmix builds
// the job's node list from SLURM_JOB_NODELIST in the step's environment,
// and a rank that derives its rendezvous host from the list (the usual
// MASTER_ADDR recipe) would pick a node that is gone.
//
// Only variables already set are rewritten, as Slurm's script does. held
// must be a subset of the env's node list; nodes keep the list's order.
func resizedEnv(env []string, held []string) ([]string, error) {
	get := func(k string) (string, bool) {
		for _, kv := range slices.Backward(env) {
			if v, ok := strings.CutPrefix(kv, k+"="); ok {
				return v, true
			}
		}
		return "", false
	}
	listVar := "SLURM_JOB_NODELIST"
	list, ok := get(listVar)
	if !ok {
		if list, ok = get("SLURM_NODELIST"); !ok {
			return nil, fmt.Errorf("neither SLURM_JOB_NODELIST nor SLURM_NODELIST is set")
		}
		listVar = "SLURM_NODELIST"
	}
	was, err := hostlist.Expand(list)
	if err != nil {
		return nil, fmt.Errorf("%s=%q: %w", listVar, list, err)
	}
	var keep []int // indexes into was
	for _, n := range held {
		i := slices.Index(was, n)
		if i < 0 {
			return nil, fmt.Errorf("node %s is not in %s=%s", n, listVar, list)
		}
		keep = append(keep, i)
	}
	slices.Sort(keep)
	nodes := make([]string, len(keep))
	for j, i := range keep {
		nodes[j] = was[i]
	}
	set := map[string]string{}
	unset := map[string]bool{}
	for _, k := range []string{"SLURM_JOB_NODELIST", "SLURM_NODELIST"} {
		set[k] = hostlist.Compress(nodes)
	}
	for _, k := range []string{"SLURM_NNODES", "SLURM_JOB_NUM_NODES"} {
		set[k] = strconv.Itoa(len(nodes))
	}
	if cpus, ok := get("SLURM_JOB_CPUS_PER_NODE"); ok {
		per, err := hostlist.ExpandCounts(cpus)
		if err != nil {
			return nil, fmt.Errorf("SLURM_JOB_CPUS_PER_NODE=%q: %w", cpus, err)
		}
		if len(per) != len(was) {
			return nil, fmt.Errorf("SLURM_JOB_CPUS_PER_NODE=%q counts %d nodes, %s=%s has %d", cpus, len(per), listVar, list, len(was))
		}
		kept := make([]int, len(keep))
		for j, i := range keep {
			kept[j] = per[i]
		}
		set["SLURM_JOB_CPUS_PER_NODE"] = hostlist.CompressCounts(kept)
	}
	if _, ok := get("SLURM_TASKS_PER_NODE"); ok {
		// Slurm's own script: "We don't have sufficient information to
		// recreate these". reft run states --ntasks on srun's command line.
		for _, k := range []string{"SLURM_NPROCS", "SLURM_NTASKS", "SLURM_TASKS_PER_NODE"} {
			unset[k] = true
		}
	}
	out := make([]string, 0, len(env))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if unset[k] {
			continue
		}
		if v, ok := set[k]; ok {
			kv = k + "=" + v
		}
		out = append(out, kv)
	}
	return out, nil
}
