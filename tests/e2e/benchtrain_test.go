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
	sh := `[ "$SLURM_PROCID" = 0 ] && echo job=$SLURM_JOB_ID; exec "$0" "$@"`
	args := append([]string{"srun", "--mpi=pmix", reft, "-w", strings.Join(nodes, ","), "-N" + strconv.Itoa(len(nodes)), "-n" + strconv.Itoa(len(nodes)),
		"sh", "-c", sh, bin("reft-train")}, flags...)
	r := mustRun(t, 5*time.Minute, alice, args...)
	j := benchJobRe.FindStringSubmatch(r.Stdout)
	m := meanStepRe.FindAllStringSubmatch(r.Stdout, -1)
	if j == nil || len(m) == 0 {
		t.Fatalf("no job id or mean-step-ms line:\n%s", r)
	}
	var worst float64
	for _, x := range m { // every rank prints one: take the slowest, which the job waits for
		v, _ := strconv.ParseFloat(x[1], 64)
		worst = max(worst, v)
	}
	return j[1], worst, r.Stdout
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
