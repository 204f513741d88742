//go:build e2e

// Package readme runs the README's "Try it yourself" commands as they are
// written, so that the README cannot drift from the cluster tool and reft:
// every ```sh block between the try-it markers, in order, in one bash (as
// root, from the checkout), from `tests/cluster/cluster up` to the node
// loss and the recovery log. It brings the cluster up itself (with reft,
// as a newcomer does), so it needs the cluster down when it starts and
// takes it down when it ends; `make e2e` runs it last.
package readme

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

const (
	begin = "<!-- try-it: begin"
	end   = "<!-- try-it: end -->"
	// built is the README's first line, which `make e2e` has already done
	// (it depends on `make all`, and `make deps` is its precondition):
	// the test checks it is there and does not run it again.
	built = "make deps && make"
)

// blocks returns the ```sh blocks between the try-it markers.
func blocks(t *testing.T, readme string) []string {
	t.Helper()
	_, rest, ok := strings.Cut(readme, begin)
	if !ok {
		t.Fatalf("README.md has no %q marker", begin)
	}
	section, _, ok := strings.Cut(rest, end)
	if !ok {
		t.Fatalf("README.md has no %q marker", end)
	}
	var out []string
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(section, -1) {
		out = append(out, m[1])
	}
	if len(out) == 0 {
		t.Fatal("no ```sh block between the try-it markers")
	}
	return out
}

func TestReadmeTryIt(t *testing.T) {
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(repo, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	bs := blocks(t, string(b))
	first, rest, _ := strings.Cut(bs[0], "\n")
	if first != built {
		t.Fatalf("the README's first command is %q; the test expects %q there (make e2e has run it)", first, built)
	}
	bs[0] = rest
	script := "set -euo pipefail -x\n" + strings.Join(bs, "\n")
	tool := filepath.Join(repo, "tests", "cluster", "cluster")
	if out, err := exec.Command(tool, "status").CombinedOutput(); err == nil {
		t.Fatalf("the cluster is up; the README's commands start from 'cluster up': take it down first (%s down)\n%s", tool, out)
	}
	// Whatever happens, the cluster goes down; a node the script killed
	// goes with it.
	t.Cleanup(func() {
		if out, err := exec.Command(tool, "down").CombinedOutput(); err != nil {
			t.Errorf("cluster down: %v\n%s", err, out)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir = repo
	// A newcomer's root shell: none of the cluster's variables set yet.
	// (The cluster tool's own state directory and ports pass, as they
	// would in that shell.)
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME=/root", "LANG=C.UTF-8"}
	for _, k := range []string{"REFT_CLUSTER_DIR", "REFT_CLUSTER_PORT_BASE"} {
		if v := os.Getenv(k); v != "" {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	cmd.WaitDelay = 10 * time.Second
	var outb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &outb, &outb
	err = cmd.Run()
	out := outb.String()
	t.Logf("the README's commands:\n%s", out)
	if ctx.Err() != nil {
		t.Fatalf("the README's commands did not finish within 12 minutes")
	}
	if err != nil {
		t.Fatalf("the README's commands failed: %v", err)
	}

	job := regexp.MustCompile(`(?m)^\+ job=(\d+)$`).FindStringSubmatch(out)
	if job == nil {
		t.Fatalf("no job id from the README's sbatch line")
	}
	for _, want := range []*regexp.Regexp{
		// the two-node training job ran under reft, with snapshots
		regexp.MustCompile(`(?m)^reft-train: .* dp 2 `),
		regexp.MustCompile(`(?m)^final-params-sha256: [0-9a-f]{64}$`),
		// reft status: the job's agents up, protected by arc
		regexp.MustCompile(`(?m)^job ` + job[1] + ` \(reft-alice\) RUNNING, --reft=arc`),
		regexp.MustCompile(`(?m)^n1 +up `),
		// node_exporter serves the agents' committed steps
		regexp.MustCompile(`(?m)^reft_committed_step\{job_id="` + job[1] + `",node="n1",rank="0"\} \d+`),
		// reft log: the node loss, the spare, the restore and the resume
		regexp.MustCompile(`(?m)failure: node n2`),
		regexp.MustCompile(`(?m)spare n5 takes its ranks`),
		regexp.MustCompile(`(?m)n5: rank 1 restored step \d+ `),
		regexp.MustCompile(`(?m)resumed from step \d+`),
		regexp.MustCompile(`(?m)drew the timeline into timeline\.svg`),
		// sacct: the job completed, reft's summary in its Comment
		regexp.MustCompile(`(?m)^\s*` + job[1] + `\s+COMPLETED\s+reft: `),
	} {
		if !want.MatchString(out) {
			t.Errorf("the README's commands printed nothing matching %s", want)
		}
	}
	if strings.Contains(out, "snapshots off") {
		t.Error("reft-train ran without snapshots: reft is not on after cluster up")
	}
	state := "/var/tmp/reft-cluster"
	if d := os.Getenv("REFT_CLUSTER_DIR"); d != "" {
		state = d
	}
	svg, err := os.ReadFile(filepath.Join(state, "home", "reft-alice", "timeline.svg"))
	if err != nil || !bytes.Contains(svg, []byte("reft log "+job[1]+": recovery timeline")) {
		t.Errorf("the timeline picture in alice's home: %v (%d bytes)", err, len(svg))
	}
}
