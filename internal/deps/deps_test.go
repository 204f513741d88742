package deps

import (
	"bufio"
	"bytes"
	"os/exec"
	"path"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/reft-hpc/reft"

// graph is every package of the module (tests excluded, as `go list`
// has them) with its transitive dependencies inside the module.
func graph(t *testing.T) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Deps " "}}`, module+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v: %s", err, stderr.String())
	}
	g := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		var deps []string
		for _, d := range f[1:] {
			if d == module || strings.HasPrefix(d, module+"/") {
				deps = append(deps, strings.TrimPrefix(strings.TrimPrefix(d, module), "/"))
			}
		}
		g[strings.TrimPrefix(strings.TrimPrefix(f[0], module), "/")] = deps
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return g
}

// under says whether pkg is pattern or, for "x/...", x or below it.
func under(pkg, pattern string) bool {
	if p, ok := strings.CutSuffix(pattern, "/..."); ok {
		return pkg == p || strings.HasPrefix(pkg, p+"/")
	}
	return pkg == pattern
}

// TestDependencyDirections: the directions issue 17 asks for, and the
// ones the packages' doc comments promise.
func TestDependencyDirections(t *testing.T) {
	g := graph(t)
	rules := []struct {
		from   string   // packages (a "/..." pattern covers the subtree)
		mustNo []string // none of these may be among their dependencies
		only   []string // if set: their module dependencies must all be among these
		why    string
	}{
		{from: "client", mustNo: []string{"tmpfs", "agent", "launcher/..."},
			why: "the client library links the checksum leaf (internal/crc32c), not the store or the agent"},
		{from: "agent/...", mustNo: []string{"launcher/..."},
			why: "the agent does not link reft's commands; shared models live in internal/ (internal/jit)"},
		{from: "agent/peer", mustNo: []string{"agent/config"},
			why: "the transport takes its settings from its caller (agent/peerconfig)"},
		{from: "launcher/...", mustNo: []string{"agent"},
			why: "reft's commands do not link the agent's composition root"},
		{from: "agent/event", only: []string{},
			why: "reft run and the tests import it without linking the agent"},
		{from: "agent/runrecord", only: []string{"agent/event"},
			why: "reft run links the run record without the agent"},
		{from: "internal/crc32c", only: []string{}, why: "a leaf"},
		{from: "internal/jit", only: []string{}, why: "a neutral model: imports only math"},
		{from: "internal/logplan", only: []string{}, why: "a neutral model (SWIFT's selective logging): the agent and reft plan share it"},
	}
	for _, r := range rules {
		t.Run(r.from, func(t *testing.T) {
			matched := 0
			for pkg, deps := range g {
				if !under(pkg, r.from) {
					continue
				}
				matched++
				for _, d := range deps {
					if slices.ContainsFunc(r.mustNo, func(p string) bool { return under(d, p) }) {
						t.Errorf("%s depends on %s: %s (go list -deps %s/%s | grep %s shows the path)", pkg, d, r.why, module, pkg, path.Base(d))
					}
					if r.only != nil && !slices.Contains(r.only, d) {
						t.Errorf("%s depends on %s: %s", pkg, d, r.why)
					}
				}
			}
			if matched == 0 {
				t.Fatalf("no package matches %s: the rule is stale", r.from)
			}
		})
	}
}
