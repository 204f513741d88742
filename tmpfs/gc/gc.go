// Package gc removes snapshot data that no running or pending Slurm job
// owns: the agent runs it on start (for its own user), and `reft gc` runs
// it for the whole node.
//
// Slurm is the authority. A job directory is removed only when slurmctld
// no longer knows the job, or reports it in a final state it cannot be
// requeued from. A pending job, requeued or not, keeps its data: its
// restart needs it. When Slurm cannot be asked, nothing is removed.
package gc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/tmpfs"
)

// Job is what Slurm says about one job.
type Job struct {
	ID      string
	State   string // JOB STATE CODES in extended form: RUNNING, PENDING, ...
	Requeue bool   // the job may be requeued (known from Show only)
}

// Jobs is the source of job states: Slurm in production, a fake in tests.
type Jobs interface {
	// List returns every job slurmctld knows, by id.
	List(ctx context.Context) (map[string]Job, error)
	// Show returns one job; found is false when slurmctld does not know it.
	Show(ctx context.Context, id string) (job Job, found bool, err error)
}

// finalStates are states a job does not leave by itself.
var finalStates = map[string]bool{
	"BOOT_FAIL": true, "CANCELLED": true, "COMPLETED": true, "DEADLINE": true, "FAILED": true,
	"NODE_FAIL": true, "OUT_OF_MEMORY": true, "PREEMPTED": true, "REVOKED": true, "TIMEOUT": true,
}

// done says whether a job has no use for its snapshots any more. A failed
// or preempted job that may be requeued still needs them.
func done(j Job) bool {
	if !finalStates[j.State] {
		return false // running, pending, suspended, completing, requeued, or a state we do not know
	}
	return !j.Requeue || j.State == "COMPLETED" || j.State == "CANCELLED"
}

// Options configures a collection.
type Options struct {
	Root   string // store root, e.g. /dev/shm/reft
	UID    int    // only this user's jobs; -1 for all (root)
	Except string // a job id never to remove (the calling agent's own)
	DryRun bool
	Jobs   Jobs
	Log    zerolog.Logger
}

// Decision is what happened (or, in a dry run, would happen) to one job
// directory.
type Decision struct {
	Dir    tmpfs.JobDir
	Remove bool
	Reason string
	Bytes  int64
	Err    error // removal failed, or Slurm could not say
}

// Collect decides about every job directory under opt.Root and removes
// those that no job owns. It fails without removing anything when Slurm
// cannot list its jobs.
func Collect(ctx context.Context, opt Options) ([]Decision, error) {
	dirs, err := tmpfs.ListJobDirs(opt.Root, opt.UID)
	if err != nil || len(dirs) == 0 {
		return nil, err
	}
	var jobs map[string]Job
	// Slurm is asked only when there is something to decide: an agent
	// alone on its node (the common start) costs slurmctld nothing.
	if slices.ContainsFunc(dirs, func(d tmpfs.JobDir) bool { return d.JobID != opt.Except }) {
		if jobs, err = opt.Jobs.List(ctx); err != nil {
			return nil, fmt.Errorf("gc: ask Slurm which jobs are alive (nothing was removed): %w", err)
		}
	}
	var out []Decision
	for _, d := range dirs {
		dec := Decision{Dir: d}
		switch j, listed := jobs[d.JobID]; {
		case d.JobID == opt.Except:
			dec.Reason = "this agent's own job"
		case listed && !finalStates[j.State]:
			dec.Reason = "job " + j.State
		default:
			// Unlisted (maybe submitted after the listing) or final (maybe
			// about to be requeued): ask about this one job before removing.
			j, found, err := opt.Jobs.Show(ctx, d.JobID)
			switch {
			case err != nil:
				dec.Err, dec.Reason = err, "Slurm could not say whether the job is alive"
			case !found:
				dec.Remove, dec.Reason = true, "Slurm no longer knows the job"
			case done(j):
				dec.Remove, dec.Reason = true, "job "+j.State
			case j.Requeue && finalStates[j.State]:
				dec.Reason = "job " + j.State + " but requeueable"
			default:
				dec.Reason = "job " + j.State
			}
		}
		if dec.Remove {
			dec.Bytes = d.Size()
			if !opt.DryRun {
				if err := d.Remove(); err != nil {
					dec.Remove, dec.Err = false, err
					if errors.Is(err, tmpfs.ErrLocked) {
						dec.Err, dec.Reason = nil, "its agent is still running"
					}
				}
			}
		}
		ev := opt.Log.Info()
		if dec.Err != nil {
			ev = opt.Log.Warn().Err(dec.Err)
		}
		ev.Str("event", "gc").Str("job", d.JobID).Int("uid", d.UID).Bool("remove", dec.Remove).Bool("dry_run", opt.DryRun).
			Int64("bytes", dec.Bytes).Str("reason", dec.Reason).Msg("gc: " + d.Path)
		out = append(out, dec)
	}
	return out, nil
}

// Slurm asks slurmctld with squeue and scontrol.
type Slurm struct {
	Squeue, Scontrol string // programs; "" means from PATH
	// Conf, if set, is slurm.conf's path, passed as SLURM_CONF ([agent]
	// slurm_conf); "": the commands' own default.
	Conf string
}

func (s Slurm) run(ctx context.Context, prog string, args ...string) (string, string, error) {
	cmd := exec.CommandContext(ctx, prog, args...)
	if s.Conf != "" {
		cmd.Env = append(os.Environ(), "SLURM_CONF="+s.Conf)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return out.String(), errb.String(), err
}

// List runs `squeue -h -a -r -t all -o '%A %T'`: one line per job (array
// elements expanded, with the job id their SLURM_JOB_ID shows) and state.
func (s Slurm) List(ctx context.Context) (map[string]Job, error) {
	prog := or(s.Squeue, "squeue")
	out, errs, err := s.run(ctx, prog, "-h", "-a", "-r", "-t", "all", "-o", "%A %T")
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %s", prog, err, strings.TrimSpace(errs))
	}
	jobs := map[string]Job{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) != 2 {
			return nil, fmt.Errorf("%s: unexpected line %q (want \"JOBID STATE\")", prog, line)
		}
		jobs[f[0]] = Job{ID: f[0], State: f[1]}
	}
	return jobs, nil
}

// Show runs `scontrol -o show job ID`.
func (s Slurm) Show(ctx context.Context, id string) (Job, bool, error) {
	prog := or(s.Scontrol, "scontrol")
	out, errs, err := s.run(ctx, prog, "-o", "show", "job", id)
	if err != nil {
		if strings.Contains(errs, "Invalid job id") {
			return Job{}, false, nil
		}
		return Job{}, false, fmt.Errorf("%s show job %s: %w: %s", prog, id, err, strings.TrimSpace(errs))
	}
	j := Job{ID: id}
	for _, kv := range strings.Fields(out) {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "JobState":
			j.State = v
		case "Requeue":
			j.Requeue = v == "1"
		}
	}
	if j.State == "" {
		return Job{}, false, fmt.Errorf("%s show job %s: no JobState in %q", prog, id, strings.TrimSpace(out))
	}
	return j, true, nil
}

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
