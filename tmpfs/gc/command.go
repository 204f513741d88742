package gc

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/hostmem"
)

// Command is `reft gc`: it removes the snapshot data of jobs that are no
// longer running or pending on this node. It returns the exit code.
func Command(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("reft gc", flag.ContinueOnError)
	fs.SetOutput(stderr)
	confPath := fs.String("config", config.DefaultPath, "reft configuration `file` (for [store] tmpfs_root)")
	root := fs.String("root", "", "store root `dir`; default: tmpfs_root from the configuration")
	dryRun := fs.Bool("dry-run", false, "list what would be removed, remove nothing")
	verbose := fs.Bool("v", false, "also list the job directories that are kept, and why")
	maxAge := fs.Duration("max-age", -1, "remove stores unchanged for longer than this whatever Slurm says (default: store.max_age from the configuration; 0 disables)")
	uid := fs.Int("uid", -1, "only this user's jobs (default: every user's, which needs root)")
	squeue := fs.String("squeue", "squeue", "squeue `program`")
	scontrol := fs.String("scontrol", "scontrol", "scontrol `program`")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: reft gc [--dry-run] [--root DIR] [--uid N] [--max-age D]\n\n"+
			"Removes node-local snapshot data (<root>/<uid>/<jobid>) of jobs that Slurm reports\n"+
			"finished or no longer knows, and any unchanged for longer than --max-age.\n"+
			"Pending and requeued jobs keep theirs. As root it deletes through checked\n"+
			"directory descriptors only: it never follows a user's symlink (docs/SECURITY.md).\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "reft gc: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	c, err := config.Load(*confPath, true)
	if err != nil {
		fmt.Fprintln(stderr, "reft gc:", err)
		return 1
	}
	if *root == "" {
		*root = c.Store.TmpfsRoot
	}
	if *maxAge < 0 {
		*maxAge = time.Duration(c.Store.MaxAge)
	}
	if *uid < 0 && os.Geteuid() != 0 {
		*uid = os.Geteuid() // others' directories are 0700 anyway
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	decs, err := Collect(ctx, Options{Root: *root, HugeTLBFS: c.Store.HugeTLBFS, UID: *uid, DryRun: *dryRun, MaxAge: *maxAge,
		Jobs: Slurm{Squeue: *squeue, Scontrol: *scontrol}, Log: zerolog.Nop()})
	if err != nil {
		fmt.Fprintln(stderr, "reft gc:", err)
		return 1
	}
	verb, code := "removed", 0
	if *dryRun {
		verb = "would remove"
	}
	var total int64
	for _, d := range decs {
		switch {
		case d.Err != nil:
			fmt.Fprintf(stderr, "reft gc: %s (%s): %v\n", d.Dir.Path, d.Reason, d.Err)
			code = 1
		case d.Remove:
			total += d.Bytes
			fmt.Fprintf(stdout, "%s %s (%s, %s)\n", verb, d.Dir.Path, d.Reason, hostmem.FormatBytes(d.Bytes))
		case *verbose:
			fmt.Fprintf(stdout, "kept %s (%s)\n", d.Dir.Path, d.Reason)
		}
	}
	if total > 0 || *verbose {
		fmt.Fprintf(stdout, "%s %s in total under %s\n", verb, hostmem.FormatBytes(total), *root)
	}
	return code
}
