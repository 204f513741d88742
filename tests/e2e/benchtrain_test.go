//go:build e2e

package e2e

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The cluster benchmarks' common parts: a reft-train run's job id and
// slowest mean step time, and settings from the environment.

var meanStepRe = regexp.MustCompile(`(?m)^mean-step-ms: ([0-9.]+)$`)
var benchJobRe = regexp.MustCompile(`(?m)^job=(\d+)$`)
var steadyStepRe = regexp.MustCompile(`(?m)^mean-step-ms-from-\d+: ([0-9.]+) `)

// saveBlockedRe is reft-train's time blocked per snapshot (rank 0's; a
// whole output or one line).
var saveBlockedRe = regexp.MustCompile(`(?m)^save-blocked-ms: ([0-9.]+) per save`)

// slowest returns the largest value the first group of re matches in out
// (every rank prints its own line; the job waits for the slowest), and
// whether any matched.
func slowest(re *regexp.Regexp, out string) (float64, bool) {
	var worst float64
	m := re.FindAllStringSubmatch(out, -1)
	for _, x := range m {
		v, _ := strconv.ParseFloat(x[1], 64)
		worst = max(worst, v)
	}
	return worst, len(m) > 0
}

// benchTrain runs reft-train on nodes, one rank each, and returns the job
// id and the slowest rank's mean step time.
func benchTrain(t testing.TB, nodes []string, reft string, flags []string) (string, float64) {
	t.Helper()
	job, ms, _ := benchTrainOut(t, nodes, reft, flags)
	return job, ms
}

// benchTrainOut is benchTrain, with the run's standard output.
func benchTrainOut(t testing.TB, nodes []string, reft string, flags []string) (string, float64, string) {
	t.Helper()
	return benchTrainEnv(t, nodes, reft, "", flags)
}

// rankEnvRe is what benchTrainEnv takes for the ranks' environment:
// NAME=VALUE pairs, comma-separated, plain characters only.
var rankEnvRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=[A-Za-z0-9_.:/-]*(,[A-Za-z_][A-Za-z0-9_]*=[A-Za-z0-9_.:/-]*)*$`)

// benchTrainEnv is benchTrainOut with env (NAME=VALUE,...; "": none)
// added to the ranks' environment (srun --export=ALL,env).
func benchTrainEnv(t testing.TB, nodes []string, reft, env string, flags []string) (string, float64, string) {
	t.Helper()
	sh := `[ "$SLURM_PROCID" = 0 ] && echo job=$SLURM_JOB_ID; exec "$0" "$@"`
	args := []string{"srun", "--mpi=pmix", reft, "-w", strings.Join(nodes, ","), "-N" + strconv.Itoa(len(nodes)), "-n" + strconv.Itoa(len(nodes))}
	if env != "" {
		if !rankEnvRe.MatchString(env) {
			t.Fatalf("the ranks' environment %q: want NAME=VALUE pairs, comma-separated, of letters, digits and _.:/-", env)
		}
		args = append(args, "--export=ALL,"+env)
	}
	args = append(append(args, "sh", "-c", sh, bin("reft-train")), flags...)
	r := mustRun(t, 5*time.Minute, alice, args...)
	j := benchJobRe.FindStringSubmatch(r.Stdout)
	worst, ok := slowest(meanStepRe, r.Stdout)
	if j == nil || !ok {
		t.Fatalf("no job id or mean-step-ms line:\n%s", r)
	}
	return j[1], worst, r.Stdout
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
