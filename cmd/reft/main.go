// Command reft is the user's and operator's tool: it launches and relaunches
// training steps, plans protection, and reads recovery logs.
package main

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/reft-hpc/reft/agent/sg/explain"
	"github.com/reft-hpc/reft/launcher/plan"
	"github.com/reft-hpc/reft/launcher/recoverylog"
	reftrun "github.com/reft-hpc/reft/launcher/run"
	"github.com/reft-hpc/reft/launcher/status"
	"github.com/reft-hpc/reft/launcher/version"
	"github.com/reft-hpc/reft/tmpfs/gc"
)

// command is one `reft` subcommand. run gets the arguments after the
// subcommand name and returns the process exit code.
type command struct {
	summary string
	run     func(args []string, stdout, stderr io.Writer) int
}

// commands is the subcommand table. Each subcommand lives in its own package
// and is wired in with one line here.
var commands = map[string]command{
	"explain":      {"which node failures a job's snapshots survive under a --reft spec, and why not", explain.Command},
	"gc":           {"remove node-local snapshots of jobs no longer running or pending (--dry-run lists them)", gc.Command},
	"log":          {"a job's recovery timeline: its Slurm steps joined with reft run's events (--json)", recoverylog.Command},
	"plan":         {"reliability and cost planning (survival, placement, interval, memory, simulate)", plan.Main},
	"run":          {"run a training step inside an allocation and relaunch it after failures", reftrun.Command},
	"status":       {"a running job's agents: committed steps, protection, bytes held, memory (--json)", status.Command},
	"status-local": {"this node's agent status for a job, as JSON in reft-report lines (reft run's probe)", reftrun.StatusLocal},
	"version": {"print the reft version", func(_ []string, stdout, _ io.Writer) int {
		fmt.Fprintln(stdout, "reft", version.Version)
		return 0
	}},
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func usage() string {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("usage: reft COMMAND [ARGS]\n\ncommands:\n")
	for _, n := range names {
		fmt.Fprintf(&b, "  %-13s %s\n", n, commands[n].summary)
	}
	b.WriteString("\nRun 'reft COMMAND --help' for a command's options.\n")
	return b.String()
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage())
		return 2
	}
	switch args[0] {
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage())
		return 0
	case "--version":
		args[0] = "version"
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "reft: unknown command %q; run 'reft help' for the list\n", args[0])
		return 2
	}
	return c.run(args[1:], stdout, stderr)
}
