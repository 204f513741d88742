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
// store must stay for the restart to restore from, and why.
func runsAgain(f jobFields) (bool, string) {
	if f == nil {
		return false, "Slurm no longer knows the job"
	}
	st := f["JobState"]
	desc := fmt.Sprintf("job %s, Reason=%s, Restarts=%s, BatchFlag=%s", st, f["Reason"], f["Restarts"], f["BatchFlag"])
	switch st {
	case "PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SPECIAL_EXIT", "RUNNING", "SUSPENDED", "RESIZING", "CONFIGURING":
		return true, desc + ": Slurm runs it again"
	}
	return false, desc
}

// jobEpilog removes job's store of uid on this node unless the job runs
// again, then applies the age limit to every store on the node. It returns
// what it did, for the log.
func jobEpilog(ctx context.Context, cfg config.Config, job string, uid int,
	show func(ctx context.Context, job string) (jobFields, error)) (string, error) {
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
		cancel()
		switch keep, why := runsAgain(f); {
		case err != nil:
			errs = append(errs, fmt.Errorf("store of job %s kept: Slurm could not say whether the job is requeued (store.max_age removes it later): %w", job, err))
		case keep:
			msgs = append(msgs, fmt.Sprintf("store kept (%s)", why))
		default:
			n, err := gc.RemoveJob(cfg.Store.TmpfsRoot, cfg.Store.HugeTLBFS, uid, job)
			if errors.Is(err, tmpfs.ErrLocked) {
				// An agent still holds it: the extern step's exit stops
				// it; the age limit catches a store it leaves.
				msgs = append(msgs, "store kept: its agent still runs")
			} else if err != nil {
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
	})
	put(out, outlen, msg)
	if err != nil {
		put(errb, errlen, err.Error())
		return -1
	}
	return 0
}
