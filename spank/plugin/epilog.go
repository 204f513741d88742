package main

/*
#include <stdint.h>
*/
import "C"

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

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/hostmem"
	"github.com/reft-hpc/reft/tmpfs"
	"github.com/reft-hpc/reft/tmpfs/gc"
)

// The job epilog (slurm_spank_job_epilog: slurmd runs it as root on every
// node of a job as the job ends there) frees the node's snapshot memory:
// the job's store goes unless Slurm will run the job again, and every
// store on the node unchanged beyond [store] max_age goes too. Removal is
// tmpfs/gc's: through verified directory descriptors, never through a
// user's names (docs/SECURITY.md). It asks slurmctld one `scontrol show
// job` per node, and only when the job left a store on the node.

// epilogScontrolTimeout bounds the one question to slurmctld; the epilog
// holds the job in COMPLETING meanwhile.
const epilogScontrolTimeout = 10 * time.Second

// epilogLockWait is how long the epilog waits for the job's agent to let
// go of its store: the extern step's exit stops it, and an agent that a
// step started outside the extern step stops when its job watch (every
// 15 s, agent/jobwatch.go) sees the job COMPLETING.
var epilogLockWait = 20 * time.Second

// jobFields is what `scontrol -o show job` says about a job; nil when
// slurmctld no longer knows it.
type jobFields map[string]string

// showJob runs `scontrol -o show job ID`.
func showJob(ctx context.Context, conf, job string) (jobFields, error) {
	prog, err := exec.LookPath("scontrol")
	if err != nil {
		prog = "/usr/bin/scontrol"
	}
	cmd := exec.CommandContext(ctx, prog, "-o", "show", "job", job)
	if conf != "" {
		cmd.Env = append(os.Environ(), "SLURM_CONF="+conf)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		if strings.Contains(errb.String(), "Invalid job id") {
			return nil, nil
		}
		return nil, fmt.Errorf("scontrol show job %s: %w: %s", job, err, strings.TrimSpace(errb.String()))
	}
	return parseJobFields(out.String(), job)
}

// parseJobFields reads the one-line form of `scontrol show job` for job
// (an array or heterogeneous job prints several lines; the one whose
// JobId is job counts).
func parseJobFields(out, job string) (jobFields, error) {
	for _, line := range strings.Split(out, "\n") {
		f := jobFields{}
		for _, kv := range strings.Fields(line) {
			if k, v, ok := strings.Cut(kv, "="); ok {
				if _, seen := f[k]; !seen {
					f[k] = v
				}
			}
		}
		if f["JobId"] == job {
			if f["JobState"] == "" {
				return nil, fmt.Errorf("scontrol show job %s: no JobState in %q", job, line)
			}
			return f, nil
		}
	}
	return nil, fmt.Errorf("scontrol show job %s: no line for the job in %q", job, strings.TrimSpace(out))
}

// runsAgain says whether Slurm will run the job again (requeued), so its
// store must stay for the restart to restore from, and why. runs counts
// the job's runs that accounting recorded (sacct -D), for a job that Slurm
// requeued before: nil when it cannot say.
//
// Verified on Slurm 22.05: during the epilog scontrol shows a requeued job
// and an ended one alike, JobState=COMPLETING (Slurm prints the flag, not
// the base state, PENDING or COMPLETED); Restarts has already grown for a
// requeue. So a job never requeued (Restarts=0) ended for good. For one
// requeued before, accounting holds one record per run so far: Restarts
// of them when this run was requeued (the next run's record comes only
// when it starts), Restarts+1 when this run was the job's last.
func runsAgain(ctx context.Context, f jobFields, runs func(ctx context.Context) (int, error)) (bool, string, error) {
	if f == nil {
		return false, "Slurm no longer knows the job", nil
	}
	st := f["JobState"]
	desc := fmt.Sprintf("job %s, Restarts=%s", st, f["Restarts"])
	switch st {
	case "PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SPECIAL_EXIT", "RUNNING", "SUSPENDED", "RESIZING", "CONFIGURING":
		return true, desc + ": Slurm runs it again", nil
	}
	restarts, err := strconv.Atoi(f["Restarts"])
	if err != nil {
		return false, "", fmt.Errorf("scontrol show job: Restarts=%q is no number", f["Restarts"])
	}
	if restarts == 0 {
		return false, desc + ": never requeued", nil
	}
	n, err := runs(ctx)
	switch {
	case err != nil:
		return false, "", fmt.Errorf("%s: whether this run was requeued needs accounting (sacct): %w", desc, err)
	case n <= restarts:
		return true, fmt.Sprintf("%s, %d run(s) in accounting: requeued", desc, n), nil
	default:
		return false, fmt.Sprintf("%s, %d run(s) in accounting: its last run ended", desc, n), nil
	}
}

// sacctRuns counts the job's runs that accounting recorded.
func sacctRuns(ctx context.Context, conf, job string) (int, error) {
	prog, err := exec.LookPath("sacct")
	if err != nil {
		prog = "/usr/bin/sacct"
	}
	cmd := exec.CommandContext(ctx, prog, "-j", job, "-D", "-X", "-n", "-P", "-o", "JobID")
	if conf != "" {
		cmd.Env = append(os.Environ(), "SLURM_CONF="+conf)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("sacct -j %s: %w: %s", job, err, strings.TrimSpace(errb.String()))
	}
	n := 0
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.TrimSpace(l) == job {
			n++
		}
	}
	if n == 0 {
		return 0, fmt.Errorf("sacct -j %s: accounting has no record of the job (is AccountingStorageType set?)", job)
	}
	return n, nil
}

// jobEpilog removes job's store of uid on this node unless the job runs
// again, then applies the age limit to every store on the node. It returns
// what it did, for the log.
func jobEpilog(ctx context.Context, cfg config.Config, job string, uid int,
	show func(ctx context.Context, job string) (jobFields, error), runs func(ctx context.Context, job string) (int, error)) (string, error) {
	var msgs []string
	var errs []error
	dirs, err := tmpfs.ListJobDirs(cfg.Store.TmpfsRoot, uid)
	if err != nil {
		errs = append(errs, err)
	}
	has := false
	for _, d := range dirs {
		has = has || d.JobID == job
	}
	if has {
		sctx, cancel := context.WithTimeout(ctx, epilogScontrolTimeout)
		f, err := show(sctx, job)
		var keep bool
		var why string
		if err == nil {
			keep, why, err = runsAgain(sctx, f, func(ctx context.Context) (int, error) { return runs(ctx, job) })
		}
		cancel()
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("store of job %s kept: Slurm could not say whether the job is requeued (store.max_age removes it later): %w", job, err))
		case keep:
			msgs = append(msgs, fmt.Sprintf("store kept (%s)", why))
		default:
			// The job's agent may still be on its way out (the extern
			// step's exit signalled it just before): give it a moment.
			var n int64
			for deadline := time.Now().Add(epilogLockWait); ; time.Sleep(100 * time.Millisecond) {
				n, err = gc.RemoveJob(cfg.Store.TmpfsRoot, cfg.Store.HugeTLBFS, uid, job)
				if !errors.Is(err, tmpfs.ErrLocked) || time.Now().After(deadline) {
					break
				}
			}
			if errors.Is(err, tmpfs.ErrLocked) {
				// An agent of the job outlived it: the age limit catches
				// the store it leaves.
				msgs = append(msgs, fmt.Sprintf("store kept: an agent of the job still holds it %s after the job ended (store.max_age removes it later)", epilogLockWait))
			} else if err != nil {
				if errors.Is(err, tmpfs.ErrForeign) {
					msgs = append(msgs, fmt.Sprintf("store removed (%s) but for what is not the user's own", why))
				}
				errs = append(errs, fmt.Errorf("remove the store of job %s (%s): %w", job, why, err))
			} else {
				msgs = append(msgs, fmt.Sprintf("store removed (%s, %s)", why, hostmem.FormatBytes(n)))
			}
		}
	}
	if maxAge := time.Duration(cfg.Store.MaxAge); maxAge > 0 {
		decs, err := gc.Collect(ctx, gc.Options{Root: cfg.Store.TmpfsRoot, HugeTLBFS: cfg.Store.HugeTLBFS, UID: -1,
			Except: job, MaxAge: maxAge, Log: zerolog.Nop()})
		if err != nil {
			errs = append(errs, err)
		}
		for _, d := range decs {
			switch {
			case d.Remove:
				msgs = append(msgs, fmt.Sprintf("removed %s (%s, %s)", d.Dir.Path, d.Reason, hostmem.FormatBytes(d.Bytes)))
			case d.Err != nil:
				errs = append(errs, fmt.Errorf("%s: %w", d.Dir.Path, d.Err))
			}
		}
	}
	return strings.Join(msgs, "; "), errors.Join(errs...)
}

// reft_go_job_epilog runs in the job epilog (root): jobEpilog. Returns 0
// with what it did in out ("" for nothing), or -1 with a message in errb.
//
//export reft_go_job_epilog
func reft_go_job_epilog(cfgPath *C.char, job, uid C.uint32_t, out *C.char, outlen C.int, errb *C.char, errlen C.int) (rc C.int) {
	defer guard(errb, errlen, &rc)
	cfg, err := config.Load(C.GoString(cfgPath), false)
	if err != nil {
		put(errb, errlen, err.Error())
		return -1
	}
	j := fmt.Sprint(uint32(job))
	msg, err := jobEpilog(context.Background(), cfg, j, int(uid), func(ctx context.Context, id string) (jobFields, error) {
		return showJob(ctx, cfg.Agent.SlurmConf, id)
	}, func(ctx context.Context, id string) (int, error) {
		return sacctRuns(ctx, cfg.Agent.SlurmConf, id)
	})
	put(out, outlen, msg)
	if err != nil {
		put(errb, errlen, err.Error())
		return -1
	}
	return 0
}
