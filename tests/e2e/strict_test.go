//go:build e2e

package e2e

// Degraded protection on the real cluster (issue 18): one rank on one node
// under arc has its state on that node only (rank_local), less than arc
// promises. Without strict the rank is told once and trains on; with
// strict the agent refuses its commits once the shortfall has held for
// agent.DegradedGrace, and the step fails saying why.

import (
	"os/user"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestReftStrictDegraded(t *testing.T) {
	enableReft(t)
	// 80 steps of at least 200 ms: well past the 10 s grace.
	flags := []string{"--size", "256KiB", "--steps", "80", "--compute", "200ms", "--log-every", "20", "--save-every", "1",
		"--batch", "32", "--micro", "8", "--seed", "7"}
	const warning = "less protected than the SPEC asks ("
	for _, tc := range []struct {
		spec   string
		strict bool
	}{
		{"arc", false},
		{"arc,strict", true},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			job := allocate(t, "--reft="+tc.spec, "-N1", "-w", "n1")
			u, err := user.Lookup(alice)
			if err != nil {
				t.Fatal(err)
			}
			// The stores outlive the job by design (reft gc removes them
			// later); this test's go now.
			defer run(t, time.Minute, alice, "srun", "--jobid", job, "-n1", "rm", "-rf", filepath.Join(reftStoreRoot, u.Uid, job))
			args := append([]string{"srun", "--jobid", job, "--reft=" + tc.spec, "--mpi=pmix", "-n1", bin("reft-train")}, flags...)
			r := run(t, 3*time.Minute, alice, args...)
			out := r.Stdout + r.Stderr
			if !tc.strict {
				if r.Code != 0 || !hashRe.MatchString(r.Stdout) {
					t.Fatalf("under %s the step must complete:\n%s", tc.spec, r)
				}
				if n := strings.Count(out, warning); n != 1 || !strings.Contains(out, "rank_local") {
					t.Fatalf("the rank said %d warning(s) of degraded protection, want one naming rank_local:\n%s", n, r)
				}
				return
			}
			if r.Code == 0 || hashRe.MatchString(r.Stdout) {
				t.Fatalf("under %s the step must fail once the protection has been short for the grace:\n%s", tc.spec, r)
			}
			for _, want := range []string{"the SPEC is strict", "rank_local", "leave strict out of --reft"} {
				if !strings.Contains(out, want) {
					t.Errorf("the failed step does not say %q:\n%s", want, r)
				}
			}
			if !lossRe.MatchString(r.Stdout) {
				t.Errorf("the strict run trained no step before the grace ran out:\n%s", r)
			}
		})
	}
}
