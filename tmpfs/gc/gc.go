// Package gc removes snapshot data that no running or pending Slurm job
// owns: the job epilog runs it for the ending job and the node's age limit,
// `reft gc` for the whole node, and the agent at start for its own user's
// age limit only.
//
// Slurm is the authority for `reft gc`. A job directory is removed only
// when slurmctld no longer knows the job, or reports it in a final state it
// cannot be requeued from. A pending job, requeued or not, keeps its data:
// its restart needs it. When Slurm cannot be asked, nothing is removed. The
// age limit ([store] max_age) is the exception: a store unchanged for
// longer goes whatever Slurm says, so that nothing outlives its job for
// good.
//
// Removal, as root, never goes through a user's names (tmpfs.JobDir.Remove;
// docs/security-cleanup.md).
package gc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/tmpfs"
)

// Job is what Slurm says about one job.
type Job struct {
	ID      string
	State   string // JOB STATE CODES in extended form: RUNNING, PENDING, ...
	Requeue bool   // the job may be requeued (known from Show only)
	// Restarts is how often Slurm requeued the job (known from Show only).
	Restarts int
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
	Root      string // store root, e.g. /dev/shm/reft
	HugeTLBFS string // the configured hugetlbfs mount ("": none); arena links are followed only into it
	UID       int    // only this user's jobs; -1 for all (root)
	Except    string // a job id never to remove (the calling agent's own)
	// MaxAge, when > 0, removes a store unchanged for longer whatever
	// Slurm says ([store] max_age).
	MaxAge time.Duration
	// Jobs is asked about the stores younger than MaxAge; nil: it is not
	// asked and only the age limit applies (an agent's start, the job
	// epilog: every node of a job at once must not query slurmctld).
	Jobs   Jobs
	DryRun bool
	Log    zerolog.Logger
	Now    func() time.Time // nil: time.Now
}

// Decision is what happened (or, in a dry run, would happen) to one job
// directory.
type Decision struct {
	Dir    tmpfs.JobDir
	Remove bool
	Reason string
	Bytes  int64
	Err    error // removal failed, Slurm could not say, or the directory is not its user's own
}

// Collect decides about every job directory under opt.Root and removes
// those that no job owns or that passed the age limit. It fails without
// removing anything when Slurm must be asked and cannot list its jobs.
func Collect(ctx context.Context, opt Options) ([]Decision, error) {
	dirs, err := tmpfs.ListJobDirs(opt.Root, opt.UID)
	if err != nil || len(dirs) == 0 {
		return nil, err
	}
	now := time.Now()
	if opt.Now != nil {
		now = opt.Now()
	}
	out := make([]Decision, len(dirs))
	var ask bool
	for i, d := range dirs {
		dec := Decision{Dir: d}
		switch {
		case d.Problem != nil:
			dec.Err, dec.Reason = d.Problem, "not its user's own"
		case d.JobID == opt.Except:
			dec.Reason = "this agent's own job"
		default:
			var mod time.Time
			dec.Bytes, mod = d.Usage(opt.HugeTLBFS)
			if age := now.Sub(mod); opt.MaxAge > 0 && !mod.IsZero() && age > opt.MaxAge {
				dec.Remove, dec.Reason = true, fmt.Sprintf("unchanged for %s, beyond store.max_age = %s", age.Round(time.Second), opt.MaxAge)
			} else if opt.Jobs == nil {
				dec.Reason = "younger than store.max_age; Slurm not asked"
			} else {
				ask = true
			}
		}
		out[i] = dec
	}
	var jobs map[string]Job
	// Slurm is asked only when there is something to decide: an agent
	// alone on its node (the common start) costs slurmctld nothing.
	if ask {
		if jobs, err = opt.Jobs.List(ctx); err != nil {
			return nil, fmt.Errorf("gc: ask Slurm which jobs are alive (nothing was removed): %w", err)
		}
	}
	for i := range out {
		dec := &out[i]
		d := dec.Dir
		if ask && dec.Err == nil && !dec.Remove && dec.Reason == "" {
			switch j, listed := jobs[d.JobID]; {
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
		}
		if dec.Remove && !opt.DryRun {
			if err := d.Remove(opt.HugeTLBFS); err != nil {
				dec.Remove, dec.Err = false, err
				if errors.Is(err, tmpfs.ErrLocked) {
					dec.Err, dec.Reason = nil, "its agent is still running"
				}
			}
		}
		if !dec.Remove {
			dec.Bytes = 0
		}
		ev := opt.Log.Info()
		if dec.Err != nil {
			ev = opt.Log.Warn().Err(dec.Err)
		}
		ev.Str("event", "gc").Str("job", d.JobID).Int("uid", d.UID).Bool("remove", dec.Remove).Bool("dry_run", opt.DryRun).
			Int64("bytes", dec.Bytes).Str("reason", dec.Reason).Msg("gc: " + d.Path)
	}
	return out, nil
}

// RemoveJob removes the store of one job of uid under root, if there is
// one (the job epilog): through the same checks as Collect, never through
// a user's names. It returns the bytes freed.
func RemoveJob(root, hugetlbfs string, uid int, job string) (int64, error) {
	dirs, err := tmpfs.ListJobDirs(root, uid)
	if err != nil {
		return 0, err
	}
	for _, d := range dirs {
		if d.JobID != job && !(d.JobID == "" && d.Problem != nil) {
			continue
		}
		if d.Problem != nil {
			return 0, fmt.Errorf("gc: job %s: %w", job, d.Problem)
		}
		n, _ := d.Usage(hugetlbfs)
		if err := d.Remove(hugetlbfs); err != nil {
			return 0, err
		}
		return n, nil
	}
	return 0, nil
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
		case "Restarts":
			j.Restarts, _ = strconv.Atoi(v)
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
