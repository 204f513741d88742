// Package makefile tests Makefile recipes that need no build and no
// cluster: `make install` (the files it installs under DESTDIR, and that the
// shipped plugstack line and reft.toml name the installed paths for PREFIX
// and SYSCONFDIR, not the source's /usr/local), and that `make e2e` and
// `make bench` always take the test cluster down again, and that `make
// unit` runs synctest bubbles under -race on one P only.
package makefile

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/reft-hpc/reft/agent/config"
)

// repoRoot is the checkout's root (the Makefile's directory).
func repoRoot(t *testing.T) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot find the test's source path")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// runMake runs make in the checkout with `-o all`, which keeps it from
// building: these tests are about the recipes, not the artifacts.
func runMake(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("make", append([]string{"-C", repoRoot(t), "-o", "all"}, args...)...)
	// An outer `make unit` must not pass its flags (-n, -j...) down.
	cmd.Env = append(os.Environ(), "MAKEFLAGS=", "MFLAGS=", "MAKELEVEL=")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// makeInstall runs the install recipe into destdir; build holds stand-ins
// for the artifacts.
func makeInstall(t *testing.T, build, destdir string, vars ...string) {
	t.Helper()
	args := append([]string{"install", "BUILD=" + build, "DESTDIR=" + destdir}, vars...)
	if out, err := runMake(t, args...); err != nil {
		t.Fatalf("make %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func TestInstallPaths(t *testing.T) {
	cases := []struct {
		name, prefix, sysconfdir string
		vars                     []string // make variables; none: the Makefile's defaults
	}{
		{"defaults", "/usr/local", "/etc", nil},
		{"prefix and sysconfdir", "/opt/reft", "/opt/reft/etc", []string{"PREFIX=/opt/reft", "SYSCONFDIR=/opt/reft/etc"}},
		{"prefix only", "/srv/reft-1.0", "/etc", []string{"PREFIX=/srv/reft-1.0"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tmp := t.TempDir()
			build, dest := filepath.Join(tmp, "build"), filepath.Join(tmp, "dest")
			if err := os.MkdirAll(build, 0o755); err != nil {
				t.Fatal(err)
			}
			artifacts := []string{"reft", "reft-agent", "spank_reft.so", "libreft_spank.so"}
			for _, a := range artifacts {
				if err := os.WriteFile(filepath.Join(build, a), []byte("stand-in for "+a), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			makeInstall(t, build, dest, c.vars...)

			for _, f := range []string{
				c.prefix + "/bin/reft", c.prefix + "/bin/reft-agent",
				c.prefix + "/lib/slurm/spank_reft.so", c.prefix + "/lib/slurm/libreft_spank.so",
			} {
				st, err := os.Stat(filepath.Join(dest, f))
				if err != nil {
					t.Errorf("%s not installed: %v", f, err)
				} else if st.Mode().Perm() != 0o755 {
					t.Errorf("%s: mode %v, want 0755", f, st.Mode().Perm())
				}
			}

			// The plugstack line names the installed plugin and config.
			conf := filepath.Join(dest, c.sysconfdir, "slurm", "plugstack.conf.d", "reft.conf")
			b, err := os.ReadFile(conf)
			if err != nil {
				t.Fatalf("plugstack line not installed: %v", err)
			}
			var active []string
			for _, l := range strings.Split(string(b), "\n") {
				if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
					active = append(active, l)
				}
			}
			want := "optional " + c.prefix + "/lib/slurm/spank_reft.so config=" + c.sysconfdir + "/reft/reft.toml"
			if len(active) != 1 || active[0] != want {
				t.Errorf("%s: plugin lines %q, want [%q]", conf, active, want)
			}

			// reft.toml parses strictly, and the agent it starts is the
			// installed one.
			toml := filepath.Join(dest, c.sysconfdir, "reft", "reft.toml")
			data, err := os.ReadFile(toml)
			if err != nil {
				t.Fatalf("reft.toml not installed: %v", err)
			}
			cfg, err := config.Parse(toml, data)
			if err != nil {
				t.Fatalf("installed reft.toml: %v", err)
			}
			if cfg.Agent.Binary != c.prefix+"/bin/reft-agent" {
				t.Errorf("installed reft.toml: agent.binary %q, want %q", cfg.Agent.Binary, c.prefix+"/bin/reft-agent")
			}

			// A second install keeps the site's edited configuration.
			edited := append(data, []byte("\n# edited by the site\n")...)
			if err := os.WriteFile(toml, edited, 0o644); err != nil {
				t.Fatal(err)
			}
			makeInstall(t, build, dest, c.vars...)
			if got, _ := os.ReadFile(toml); string(got) != string(edited) {
				t.Errorf("a second make install replaced the edited %s", toml)
			}
		})
	}
}

// TestClusterAlwaysTakenDown: `make e2e` and `make bench` run their cluster
// part between the cluster tool's `up` and `down`, and call `down` whatever
// happens (`up` failing halfway included), exiting non-zero on any failure.
// A stand-in cluster tool records its calls, and GO stands in for the test
// runs.
func TestClusterAlwaysTakenDown(t *testing.T) {
	cases := []struct {
		name, target, goCmd string
		upRC, downRC        int
		wantOK              bool
		wantMsg             string   // in make's output
		wantCalls           []string // the cluster tool's, in order
	}{
		// e2e's second phase brings up a --net cluster after the first
		// is down; a failed first phase stops make before it.
		{"e2e passes", "e2e", "true", 0, 0, true, "", []string{"up --no-reft", "down", "up --no-reft --net", "down"}},
		{"e2e tests fail", "e2e", "false", 0, 0, false, "", []string{"up --no-reft", "down"}},
		{"e2e up fails halfway", "e2e", "true", 7, 0, false, "Error 7", []string{"up --no-reft", "down"}},
		{"e2e down fails", "e2e", "true", 0, 3, false, "Error 1", []string{"up --no-reft", "down"}},
		{"e2e-net passes", "e2e-net", "true", 0, 0, true, "", []string{"up --no-reft --net", "down"}},
		{"e2e-net tests fail", "e2e-net", "false", 0, 0, false, "", []string{"up --no-reft --net", "down"}},
		// bench's goodput benchmark runs on a cluster of its own, and its
		// last phase, GEMINI's interference benchmark, on a --net one.
		{"bench passes", "bench", "true", 0, 0, true, "", []string{"up --no-reft", "down", "up --no-reft", "down", "up --no-reft --net", "down"}},
		{"bench-goodput passes", "bench-goodput", "true", 0, 0, true, "", []string{"up --no-reft", "down"}},
		{"bench-goodput fails", "bench-goodput", "false", 0, 0, false, "", []string{"up --no-reft", "down"}},
		{"bench-gemini passes", "bench-gemini", "true", 0, 0, true, "", []string{"up --no-reft --net", "down"}},
		{"bench-gemini fails", "bench-gemini", "false", 0, 0, false, "", []string{"up --no-reft --net", "down"}},
		{"bench up fails halfway", "bench", "true", 7, 0, false, "Error 7", []string{"up --no-reft", "down"}},
		{"bench-net passes", "bench-net", "true", 0, 0, true, "", []string{"up --no-reft --net", "down"}},
		{"bench-net tests fail", "bench-net", "false", 0, 0, false, "", []string{"up --no-reft --net", "down"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			calls := filepath.Join(dir, "calls")
			tool := filepath.Join(dir, "cluster")
			script := fmt.Sprintf("#!/bin/sh\necho \"$*\" >>%s\ncase $1 in up) exit %d ;; down) exit %d ;; esac\n", calls, c.upRC, c.downRC)
			if err := os.WriteFile(tool, []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			out, err := runMake(t, c.target, "CLUSTER="+tool, "GO="+c.goCmd)
			if (err == nil) != c.wantOK {
				t.Errorf("make %s: error %v, want success %v\n%s", c.target, err, c.wantOK, out)
			}
			if !strings.Contains(out, c.wantMsg) {
				t.Errorf("make %s: output lacks %q:\n%s", c.target, c.wantMsg, out)
			}
			b, _ := os.ReadFile(calls)
			if got := strings.Split(strings.TrimSpace(string(b)), "\n"); !slices.Equal(got, c.wantCalls) {
				t.Errorf("make %s: cluster tool called with %q, want %q", c.target, got, c.wantCalls)
			}
		})
	}
}
