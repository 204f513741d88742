package run

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/launcher/recoverylog"
)

func TestParseArgs(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		check func(Args) bool
	}{
		{"command only", []string{"python", "train.py"}, func(a Args) bool {
			return slices.Equal(a.Command, []string{"python", "train.py"}) && len(a.SrunOpts) == 0 && a.Spares == -1
		}},
		{"srun options kept in order", []string{"--mpi=pmix", "-l", "--cpus-per-task", "2", "--", "reft-train", "--fail-at", "7:2"}, func(a Args) bool {
			return slices.Equal(a.SrunOpts, []string{"--mpi=pmix", "-l", "--cpus-per-task", "2"}) &&
				slices.Equal(a.Command, []string{"reft-train", "--fail-at", "7:2"})
		}},
		{"own flags both forms", []string{"--config", "/c.toml", "--spares=1", "--max-restarts", "0", "--max-stalled=2",
			"--backoff", "250ms", "--backoff-max=2s", "--probe-timeout", "5s", "--srun=/bin/srun", "--", "x"}, func(a Args) bool {
			return a.ConfigPath == "/c.toml" && a.ConfigGiven && a.Spares == 1 && *a.MaxRestarts == 0 && *a.MaxStalled == 2 &&
				*a.Backoff == 250*time.Millisecond && *a.BackoffMax == 2*time.Second && *a.ProbeTimeout == 5*time.Second &&
				a.Srun == "/bin/srun" && len(a.SrunOpts) == 0
		}},
		{"tasks and spec read, not passed", []string{"-n8", "--ntasks-per-node", "2", "--reft=arc,spares=1", "--", "x"}, func(a Args) bool {
			return a.NTasks == 8 && a.NTasksPerNode == 2 && a.Spec == "arc,spares=1" && len(a.SrunOpts) == 0
		}},
		{"separate -n value", []string{"-n", "4", "--ntasks=4", "--", "x"}, func(a Args) bool { return a.NTasks == 4 }},
		{"flags after -- are the command's", []string{"--", "x", "--spares", "3", "-N2"}, func(a Args) bool {
			return a.Spares == -1 && slices.Equal(a.Command, []string{"x", "--spares", "3", "-N2"})
		}},
		{"help", []string{"--help"}, func(a Args) bool { return a.Help }},
		{"help among options", []string{"--mpi=pmix", "-h", "--", "x"}, func(a Args) bool { return a.Help }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := ParseArgs(tt.args)
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(a) {
				t.Fatalf("got %+v", a)
			}
		})
	}
}

func TestParseArgsErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"nothing", nil, "no command"},
		{"no separator", []string{"--mpi=pmix", "python"}, "put -- between the options and the command"},
		{"nothing after --", []string{"--mpi=pmix", "--"}, "no command after --"},
		{"-N", []string{"-N2", "--", "x"}, "srun option -N2: reft run chooses the step's nodes"},
		{"--nodes", []string{"--nodes=2", "--", "x"}, "remove --nodes"},
		{"-w", []string{"-w", "n1", "--", "x"}, "remove --nodelist"},
		{"--exclude", []string{"--exclude=n1", "--", "x"}, "remove --exclude"},
		{"-m", []string{"-m", "cyclic", "--", "x"}, "remove --distribution"},
		{"-K", []string{"-K0", "--", "x"}, "remove --kill-on-bad-exit"},
		{"--jobid", []string{"--jobid=5", "--", "x"}, "remove --jobid"},
		{"--nodefile", []string{"--nodefile=/f", "--", "x"}, "remove --nodefile"},
		{"--relative", []string{"-r", "1", "--", "x"}, "remove --relative"},
		{"bad spec", []string{"--reft=arcc", "--", "x"}, `--reft=arcc: unknown mode "arcc"`},
		{"ntasks zero", []string{"-n0", "--", "x"}, "--ntasks=0: want a whole number >= 1"},
		{"ntasks word", []string{"--ntasks-per-node=two", "--", "x"}, "--ntasks-per-node=two: want a whole number >= 1"},
		{"missing value", []string{"--spares", "--", "x"}, "--spares needs a value"},
		{"missing -n value", []string{"-n", "--", "x"}, "-n needs a value"},
		{"negative restarts", []string{"--max-restarts=-1", "--", "x"}, "--max-restarts=-1: want a whole number >= 0"},
		{"zero stalled", []string{"--max-stalled=0", "--", "x"}, "--max-stalled=0: want a whole number >= 1"},
		{"bad backoff", []string{"--backoff=soon", "--", "x"}, "--backoff=soon: want a duration >= 0"},
		{"negative backoff", []string{"--backoff-max=-1s", "--", "x"}, "--backoff-max=-1s: want a duration >= 0"},
		{"zero probe timeout", []string{"--probe-timeout=0s", "--", "x"}, "--probe-timeout=0s: want a duration > 0"},
		{"too many spares", []string{"--spares=100000", "--", "x"}, "--spares=100000: at most 65536"},
		{"empty config", []string{"--config=", "--", "x"}, "--config needs a file"},
		{"empty srun", []string{"--srun=", "--", "x"}, "--srun needs a value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseArgs(tt.args)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want %q", err, tt.want)
			}
		})
	}
}

func TestPolicy(t *testing.T) {
	base := config.Default().Run
	a, err := ParseArgs([]string{"--max-restarts=2", "--backoff=0s", "--", "x"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := a.Policy(base)
	if err != nil {
		t.Fatal(err)
	}
	if p.MaxRestarts != 2 || p.Backoff != 0 || p.MaxStalled != base.MaxStalled || p.BackoffMax != base.BackoffMax {
		t.Errorf("policy %+v", p)
	}
	a, _ = ParseArgs([]string{"--backoff=2m", "--", "x"})
	if _, err := a.Policy(base); err == nil || !strings.Contains(err.Error(), "run.backoff_max = 1m0s is below run.backoff = 2m0s") ||
		!strings.Contains(err.Error(), "flags of the same names") {
		t.Errorf("backoff above its max: %v", err)
	}
}

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestJobSpec(t *testing.T) {
	tests := []struct {
		name   string
		arg    string
		env    map[string]string
		want   string
		errHas string
	}{
		{"option env first", "", map[string]string{"SLURM_SPANK__SLURM_SPANK_OPTION_reft_reft": "arc,spares=1", "REFT_SPEC": "aec"}, "arc,spares=1", ""},
		{"plugin env", "", map[string]string{"REFT_SPEC": "aec"}, "aec", ""},
		{"--reft wins", "aor", map[string]string{"REFT_SPEC": "aec"}, "aor", ""},
		{"none", "", nil, "", "the job has no --reft SPEC"},
		{"bad job spec", "", map[string]string{"REFT_SPEC": "arc,spare=1"}, "", `REFT_SPEC: --reft=arc,spare=1: unknown key "spare"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := JobSpec(Args{Spec: tt.arg}, env(tt.env))
			if tt.errHas != "" {
				if err == nil || !strings.Contains(err.Error(), tt.errHas) {
					t.Fatalf("error %v, want %q", err, tt.errHas)
				}
				return
			}
			if err != nil || s.String() != tt.want {
				t.Fatalf("%v %v, want %s", s, err, tt.want)
			}
		})
	}
}

func TestTasksPerNode(t *testing.T) {
	tests := []struct {
		name      string
		n, npn    int
		stepNodes int
		env       map[string]string
		want      int
		errHas    string
	}{
		{"default", 0, 0, 4, nil, 1, ""},
		{"per node", 0, 2, 4, nil, 2, ""},
		{"ntasks even", 8, 0, 4, nil, 2, ""},
		{"ntasks uneven", 6, 0, 4, nil, 0, "--ntasks=6 over 4 step node(s) is uneven"},
		{"both agree", 8, 2, 4, nil, 2, ""},
		{"both disagree", 6, 2, 4, nil, 0, "disagree"},
		{"sbatch per node", 0, 0, 3, map[string]string{"SLURM_NTASKS_PER_NODE": "4", "SLURM_TASKS_PER_NODE": "4(x4)"}, 4, ""},
		{"allocation even", 0, 0, 3, map[string]string{"SLURM_TASKS_PER_NODE": "2(x4)"}, 2, ""},
		{"allocation single", 0, 0, 1, map[string]string{"SLURM_TASKS_PER_NODE": "3"}, 3, ""},
		{"allocation uneven", 0, 0, 3, map[string]string{"SLURM_TASKS_PER_NODE": "2(x2),1(x2)"}, 0, "different task counts per node"},
		{"bad env", 0, 0, 3, map[string]string{"SLURM_NTASKS_PER_NODE": "x"}, 0, "SLURM_NTASKS_PER_NODE"},
		{"flag beats env", 0, 1, 3, map[string]string{"SLURM_NTASKS_PER_NODE": "4"}, 1, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := TasksPerNode(Args{NTasks: tt.n, NTasksPerNode: tt.npn}, tt.stepNodes, env(tt.env))
			if tt.errHas != "" {
				if err == nil || !strings.Contains(err.Error(), tt.errHas) {
					t.Fatalf("error %v, want %q", err, tt.errHas)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %d %v, want %d", got, err, tt.want)
			}
		})
	}
}

func TestPrepare(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "reft.toml")
	logDir := filepath.Join(dir, "log")
	os.WriteFile(conf, []byte("[log]\ndir = \""+logDir+"\"\n[run]\nmax_restarts = 7\n"), 0o644)
	badConf := filepath.Join(dir, "bad.toml")
	os.WriteFile(badConf, []byte("[run]\nmax_restart = 7\n"), 0o644)
	base := map[string]string{"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-5]", "REFT_SPEC": "arc,spares=1",
		"SLURM_TASKS_PER_NODE": "1(x5)", "SLURM_RESTART_COUNT": "1"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	args := func(s ...string) Args {
		a, err := ParseArgs(append([]string{"--config", conf}, s...))
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	fs := &fakeSlurm{}

	r, code, err := Prepare(context.Background(), args("--mpi=pmix", "--", "train"), env(base), nil, fs)
	if err != nil || code != 0 {
		t.Fatalf("%v (exit %d)", err, code)
	}
	r.Log.Close()
	if !slices.Equal(r.Plan.Slots, []string{"n1", "n2", "n3", "n4"}) || !slices.Equal(r.Plan.Spares(), []string{"n5"}) ||
		r.Plan.TasksPerNode != 1 || r.Spec != "arc,spares=1" || r.Restart != 1 || r.Policy.MaxRestarts != 7 ||
		r.JobLogDir != filepath.Join(logDir, "42") || !slices.Equal(r.SrunOpts, []string{"--mpi=pmix"}) {
		t.Errorf("runner %+v", r)
	}

	// A node an earlier reft run of this allocation lost stays out.
	w, _ := recoverylog.Open(logDir, "42")
	w.Write(recoverylog.Event{Job: "42", Event: recoverylog.NodeExcluded, Node: "n2", Restart: 1})
	w.Write(recoverylog.Event{Job: "42", Event: recoverylog.NodeExcluded, Node: "n3", Restart: 0}) // before a requeue: other nodes now
	w.Close()
	r, _, err = Prepare(context.Background(), args("--", "train"), env(base), nil, fs)
	if err != nil {
		t.Fatal(err)
	}
	r.Log.Close()
	if !slices.Equal(r.Plan.Slots, []string{"n1", "n5", "n3", "n4"}) || len(r.Plan.Spares()) != 0 {
		t.Errorf("after an earlier node loss: slots %v", r.Plan.Slots)
	}
	if _, code, err := Prepare(context.Background(), args("--spares=0", "--", "train"), env(base), nil, fs); err == nil ||
		code != ExitError || !strings.Contains(err.Error(), "node n2 was lost earlier in this allocation") {
		t.Errorf("lost node, no spare: %v (exit %d)", err, code)
	}

	tests := []struct {
		name string
		a    Args
		env  map[string]string
		code int
		want string
	}{
		{"outside", args("--", "x"), map[string]string{}, ExitUsage, "not inside an allocation"},
		{"inside a step", args("--", "x"), with("SLURM_STEP_ID", "0"), ExitUsage, "inside step 42.0"},
		{"no spec", args("--", "x"), with("REFT_SPEC", ""), ExitUsage, "no --reft SPEC"},
		{"missing named config", func() Args { a := args("--", "x"); a.ConfigPath = filepath.Join(dir, "none.toml"); return a }(), base, ExitUsage, "none.toml"},
		{"strict config", func() Args { a := args("--", "x"); a.ConfigPath = badConf; return a }(), base, ExitUsage, `unknown key "run.max_restart"`},
		{"no nodelist", args("--", "x"), with("SLURM_JOB_NODELIST", ""), ExitUsage, "SLURM_JOB_NODELIST is not set"},
		{"too many spares", args("--spares=5", "--", "x"), base, ExitUsage, "spares=5 leaves no node for the step in an allocation of 5 node(s)"},
		{"uneven tasks", args("-n6", "--", "x"), base, ExitUsage, "--ntasks=6 over 4 step node(s) is uneven"},
		{"bad restart count", args("--", "x"), with("SLURM_RESTART_COUNT", "x"), ExitError, "SLURM_RESTART_COUNT"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, code, err := Prepare(context.Background(), tt.a, env(tt.env), nil, fs)
			if err == nil || code != tt.code || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("%v (exit %d), want %q (exit %d)", err, code, tt.want, tt.code)
			}
		})
	}
}
