package run

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/spank/spec"
)

// Args is reft run's command line: its own flags, the srun options it
// passes on, and the command.
type Args struct {
	ConfigPath    string
	ConfigGiven   bool // --config was given: a missing file is an error
	Spares        int  // -1: the SPEC's spares=
	MaxRestarts   *int
	MaxStalled    *int
	Backoff       *time.Duration
	BackoffMax    *time.Duration
	ProbeTimeout  *time.Duration
	Srun          string
	Scontrol      string
	Squeue        string
	Spec          string   // --reft=SPEC among the srun options; "" for the job's
	NTasks        int      // -n/--ntasks among the srun options; 0 if not given
	NTasksPerNode int      // --ntasks-per-node among the srun options; 0 if not given
	SrunOpts      []string // the other srun options, in order
	Command       []string
	Help          bool
}

// Usage is reft run's help text.
const Usage = `usage: reft run [reft run flags] [srun options] -- command [args...]

Runs command as a job step (srun --reft=SPEC --kill-on-bad-exit=1) inside the
current allocation (a batch script or an salloc shell). When the step fails, it
finds out what failed, relaunches it (a rank or an agent: on the same nodes,
the ranks restore from their nodes' snapshots; a lost node: on the remaining
nodes plus a spare, which takes the lost node's ranks), and gives up after too
many relaunches or when relaunches stop making progress. Every decision is an
event in <log dir>/<jobid>/recovery.jsonl ('reft log JOBID'), and the job's
Comment holds a one-line summary (sacct -o JobID,State,Comment%80).

The SPEC is the job's (#SBATCH --reft=SPEC); --reft=SPEC among the srun
options overrides it. spares=N (or --spares) keeps the allocation's last N
nodes out of the step as replacements. Submit with --requeue and --no-kill:
with no spare left after a node loss, reft run requeues the job.

reft run flags (defaults from [run] in reft.toml):
  --config FILE         reft configuration (default /etc/reft/reft.toml)
  --spares N            spare nodes, overriding the SPEC's spares=
  --max-restarts N      relaunch at most N times (run.max_restarts)
  --max-stalled N       give up after N relaunches in a row that committed no newer
                        snapshot (run.max_stalled)
  --backoff D           wait before a relaunch, doubled after each stalled one
                        (run.backoff, e.g. 1s)
  --backoff-max D       at most this wait (run.backoff_max)
  --probe-timeout D     bound on asking every node's agent after a failure
                        (run.probe_timeout)
  --srun, --scontrol, --squeue PROGRAM   the Slurm programs to run

reft run chooses the step's nodes and task placement itself: the srun options
-N/--nodes, -w/--nodelist, -x/--exclude, -F/--nodefile, -m/--distribution,
-r/--relative, --jobid and -K/--kill-on-bad-exit are refused. Give the ranks per
node with --ntasks-per-node (or -n, a multiple of the step's node count).

exit status: 0 the step completed; 1 reft run failed (see its message); 2 usage
or configuration error; 3 gave up, relaunches made no progress; 4 gave up,
relaunch limit reached; 5 a node was lost with no spare left and the job was
requeued; 128+N stopped by signal N (Ctrl-C, scancel).
`

// Exit codes of reft run.
const (
	ExitOK       = 0
	ExitError    = 1
	ExitUsage    = 2
	ExitStalled  = 3
	ExitLimit    = 4
	ExitRequeued = 5
)

// srun options that reft run decides itself.
var refused = map[string]string{
	"-N": "--nodes", "--nodes": "--nodes",
	"-w": "--nodelist", "--nodelist": "--nodelist",
	"-x": "--exclude", "--exclude": "--exclude",
	"-F": "--nodefile", "--nodefile": "--nodefile",
	"-m": "--distribution", "--distribution": "--distribution",
	"-r": "--relative", "--relative": "--relative",
	"--jobid":            "--jobid",
	"-K":                 "--kill-on-bad-exit",
	"--kill-on-bad-exit": "--kill-on-bad-exit",
}

// srun options with a value that reft run reads.
var valued = map[string]string{
	"-n": "--ntasks", "--ntasks": "--ntasks",
	"--ntasks-per-node": "--ntasks-per-node",
	"--reft":            "--reft",
}

// ParseArgs splits reft run's command line.
func ParseArgs(args []string) (Args, error) {
	a := Args{ConfigPath: config.UserPath(), Spares: -1, Srun: "srun", Scontrol: "scontrol", Squeue: "squeue"}
	sep := -1
	for i, s := range args {
		if s == "--" {
			sep = i
			break
		}
	}
	var opts []string
	switch {
	case sep >= 0:
		opts, a.Command = args[:sep], args[sep+1:]
	case len(args) > 0 && !strings.HasPrefix(args[0], "-"):
		a.Command = args
	default:
		for _, s := range args {
			if s == "-h" || s == "--help" {
				a.Help = true
				return a, nil
			}
		}
		if len(args) == 0 {
			return a, errors.New("no command; usage: reft run [srun options] -- command [args...]")
		}
		return a, errors.New("put -- between the options and the command: reft run [srun options] -- command [args...]")
	}
	if err := a.parseOpts(opts); err != nil {
		return a, err
	}
	if !a.Help && len(a.Command) == 0 {
		return a, errors.New("no command after --; usage: reft run [srun options] -- command [args...]")
	}
	return a, nil
}

func (a *Args) parseOpts(opts []string) error {
	for i := 0; i < len(opts); i++ {
		o := opts[i]
		if o == "-h" || o == "--help" {
			a.Help = true
			continue
		}
		name, val, hasVal := o, "", false
		if strings.HasPrefix(o, "--") {
			name, val, hasVal = strings.Cut(o, "=")
		} else if strings.HasPrefix(o, "-") && len(o) > 2 {
			name, val, hasVal = o[:2], o[2:], true // -n4
		}
		// next takes the option's value from the next argument when it was
		// not attached.
		next := func() (string, error) {
			if hasVal {
				return val, nil
			}
			if i+1 >= len(opts) {
				return "", fmt.Errorf("%s needs a value", name)
			}
			i++
			return opts[i], nil
		}
		if mine, ok := ownFlag(name); ok {
			v, err := next()
			if err != nil {
				return err
			}
			if err := a.setOwn(mine, v); err != nil {
				return err
			}
			continue
		}
		if long, ok := refused[name]; ok {
			return fmt.Errorf("srun option %s: reft run chooses the step's nodes and placement itself (and sets --kill-on-bad-exit=1); remove %s, and give the ranks per node with --ntasks-per-node", o, long)
		}
		if long, ok := valued[name]; ok {
			v, err := next()
			if err != nil {
				return err
			}
			switch long {
			case "--reft":
				if _, err := spec.Parse(v); err != nil {
					return err
				}
				a.Spec = v
			case "--ntasks", "--ntasks-per-node":
				n, err := strconv.Atoi(v)
				if err != nil || n < 1 {
					return fmt.Errorf("%s=%s: want a whole number >= 1", long, v)
				}
				if long == "--ntasks" {
					a.NTasks = n
				} else {
					a.NTasksPerNode = n
				}
			}
			continue
		}
		a.SrunOpts = append(a.SrunOpts, o)
	}
	return nil
}

// ownFlag recognizes reft run's flags.
func ownFlag(name string) (string, bool) {
	switch name {
	case "--config", "--spares", "--max-restarts", "--max-stalled", "--backoff", "--backoff-max",
		"--probe-timeout", "--srun", "--scontrol", "--squeue":
		return name, true
	}
	return "", false
}

func (a *Args) setOwn(name, v string) error {
	count := func(min int) (*int, error) {
		n, err := strconv.Atoi(v)
		if err != nil || n < min {
			return nil, fmt.Errorf("%s=%s: want a whole number >= %d", name, v, min)
		}
		return &n, nil
	}
	dur := func(positive bool) (*time.Duration, error) {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || (positive && d == 0) {
			want := ">= 0"
			if positive {
				want = "> 0"
			}
			return nil, fmt.Errorf("%s=%s: want a duration %s (examples: 500ms, 2s, 1m)", name, v, want)
		}
		return &d, nil
	}
	var err error
	switch name {
	case "--config":
		a.ConfigPath, a.ConfigGiven = v, true
		if v == "" {
			err = errors.New("--config needs a file")
		}
	case "--spares":
		var n *int
		if n, err = count(0); err == nil {
			if *n > spec.MaxSpares {
				return fmt.Errorf("--spares=%d: at most %d", *n, spec.MaxSpares)
			}
			a.Spares = *n
		}
	case "--max-restarts":
		a.MaxRestarts, err = count(0)
	case "--max-stalled":
		a.MaxStalled, err = count(1)
	case "--backoff":
		a.Backoff, err = dur(false)
	case "--backoff-max":
		a.BackoffMax, err = dur(false)
	case "--probe-timeout":
		a.ProbeTimeout, err = dur(true)
	case "--srun":
		a.Srun = v
	case "--scontrol":
		a.Scontrol = v
	case "--squeue":
		a.Squeue = v
	}
	if err == nil && v == "" {
		err = fmt.Errorf("%s needs a value", name)
	}
	return err
}

// Policy applies the flags over reft.toml's [run].
func (a Args) Policy(base config.Run) (config.Run, error) {
	p := base
	if a.MaxRestarts != nil {
		p.MaxRestarts = *a.MaxRestarts
	}
	if a.MaxStalled != nil {
		p.MaxStalled = *a.MaxStalled
	}
	if a.Backoff != nil {
		p.Backoff = config.Duration(*a.Backoff)
	}
	if a.BackoffMax != nil {
		p.BackoffMax = config.Duration(*a.BackoffMax)
	}
	if a.ProbeTimeout != nil {
		p.ProbeTimeout = config.Duration(*a.ProbeTimeout)
	}
	if err := p.Validate(); err != nil {
		return p, fmt.Errorf("%w (from reft.toml's [run] and the flags of the same names)", err)
	}
	return p, nil
}

// SpecEnv are where the job's SPEC is found in a batch script or salloc
// shell: the option's value as sbatch/salloc export it (every srun of the
// job re-reads it), then what the plugin set for the batch step.
var SpecEnv = []string{"SLURM_SPANK__SLURM_SPANK_OPTION_reft_reft", "REFT_SPEC"}

// JobSpec returns the SPEC reft run launches with: --reft among the srun
// options, else the job's.
func JobSpec(a Args, getenv func(string) string) (spec.Spec, error) {
	text, from := a.Spec, "--reft"
	for _, k := range SpecEnv {
		if text != "" {
			break
		}
		text, from = getenv(k), k
	}
	if text == "" {
		return spec.Spec{}, errors.New("the job has no --reft SPEC: submit it with #SBATCH --reft=SPEC (or salloc --reft=SPEC), or pass --reft=SPEC to reft run")
	}
	s, err := spec.Parse(text)
	if err != nil {
		return spec.Spec{}, fmt.Errorf("%s: %w", from, err)
	}
	return s, nil
}

var tasksPerNodeRe = regexp.MustCompile(`^(\d+)(?:\(x\d+\))?$`)

// TasksPerNode decides the ranks per step node: --ntasks-per-node, else
// -n over the step's nodes, else the allocation's own (sbatch
// --ntasks-per-node, or SLURM_TASKS_PER_NODE when it is the same on every
// node), else 1. The layout must be even, so that a spare can take
// exactly a lost node's ranks.
func TasksPerNode(a Args, stepNodes int, getenv func(string) string) (int, error) {
	switch {
	case a.NTasksPerNode > 0:
		if a.NTasks > 0 && a.NTasks != a.NTasksPerNode*stepNodes {
			return 0, fmt.Errorf("--ntasks=%d and --ntasks-per-node=%d disagree on %d step node(s); give one of them", a.NTasks, a.NTasksPerNode, stepNodes)
		}
		return a.NTasksPerNode, nil
	case a.NTasks > 0:
		if a.NTasks%stepNodes != 0 {
			return 0, fmt.Errorf("--ntasks=%d over %d step node(s) is uneven; reft run keeps the same ranks on every node so that a spare can take a lost node's: use --ntasks-per-node", a.NTasks, stepNodes)
		}
		return a.NTasks / stepNodes, nil
	}
	if v := getenv("SLURM_NTASKS_PER_NODE"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return 0, fmt.Errorf("SLURM_NTASKS_PER_NODE=%q is not a count; give --ntasks-per-node", v)
		}
		return n, nil
	}
	if v := getenv("SLURM_TASKS_PER_NODE"); v != "" {
		if m := tasksPerNodeRe.FindStringSubmatch(v); m != nil {
			n, _ := strconv.Atoi(m[1])
			if n >= 1 {
				return n, nil
			}
		}
		return 0, fmt.Errorf("the allocation has different task counts per node (SLURM_TASKS_PER_NODE=%s); give --ntasks-per-node", v)
	}
	return 1, nil
}
