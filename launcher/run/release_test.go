package run

import (
	"strings"
	"testing"

	"github.com/reft-hpc/reft/agent/config"
)

func TestParseRelease(t *testing.T) {
	for out, want := range map[string]Release{
		"slurm 22.05.8\n":     {22, 5},
		"slurm-wlm 24.11.5\n": {24, 11},
		"slurm 23.02.7":       {23, 2},
	} {
		got, err := ParseRelease(out)
		if err != nil || got != want {
			t.Errorf("ParseRelease(%q) = %v, %v; want %v", out, got, err, want)
		}
	}
	if _, err := ParseRelease("srun: command not found"); err == nil {
		t.Error("ParseRelease accepted output without a release")
	}
}

// TestArgvPerRelease: the step's srun command line keeps --nodes beside
// --distribution=arbitrary for Slurm 22.05 and drops it for 24.11, which
// refuses the pair.
func TestArgvPerRelease(t *testing.T) {
	for _, c := range []struct {
		rel   Release
		nodes bool
	}{{Release{}, true}, {Release{22, 5}, true}, {Release{24, 11}, false}} {
		h := newHarness(t, []string{"n1", "n2", "n3"}, 1, config.Run{})
		h.r.SlurmRelease = c.rel
		argv, _, err := h.r.argv(0)
		if err != nil {
			t.Fatal(err)
		}
		line := strings.Join(argv, " ")
		if strings.Contains(line, "--nodes=") != c.nodes || !strings.Contains(line, "--distribution=arbitrary") {
			t.Errorf("release %v: srun %s", c.rel, line)
		}
	}
}
