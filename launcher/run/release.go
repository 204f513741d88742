package run

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// Release is a Slurm release, as `srun --version` names it.
type Release struct{ Major, Minor int }

var releaseRE = regexp.MustCompile(`(?m)^slurm[-a-z]* (\d+)\.(\d+)\.`)

// ParseRelease reads `srun --version`'s output: "slurm 22.05.8",
// "slurm-wlm 24.11.5".
func ParseRelease(out string) (Release, error) {
	m := releaseRE.FindStringSubmatch(strings.TrimSpace(out))
	if m == nil {
		return Release{}, fmt.Errorf("cannot read a Slurm release from %q (want \"slurm X.Y.Z\")", strings.TrimSpace(out))
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	return Release{major, minor}, nil
}

// Release runs `srun --version`.
func (e Exec) Release(ctx context.Context) (Release, error) {
	srun := e.Srun
	out, err := exec.CommandContext(ctx, srun, "--version").CombinedOutput()
	if err != nil {
		return Release{}, fmt.Errorf("%s --version: %v: %s (reft run needs srun, from the job's Slurm)", srun, err, strings.TrimSpace(string(out)))
	}
	return ParseRelease(string(out))
}

// nodesWithArbitrary: srun accepts --nodes beside --distribution=arbitrary.
// Slurm 22.05 does (and reft's step layout was proven with it); 24.11
// refuses the pair ("--nodes is incompatible with --distribution=arbitrary")
// and takes the node count from SLURM_HOSTFILE. Releases between them are
// treated as 24.11; an unknown release (the zero value) as 22.05.
func (r Release) nodesWithArbitrary() bool {
	return r == (Release{}) || r.Major < 23
}
