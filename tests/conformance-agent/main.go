// Command conformance-agent serves a real reft agent over a fresh temporary
// snapshot store, for client conformance runners in any language
// (client/conformance). It prints the socket's path as its first line of
// stdout, serves until its stdin is closed, then removes its directory. A
// line "notify NODE [CAUSE]" on stdin sends a peer failure notice.
//
//	conformance-agent [--job 4242] [--dir /dev/shm] [--layout scatter] [--memory-budget BYTES] [--verbose]
//
// --layout defaults to $REFT_CONFORMANCE_AGENT, through which a runner
// passes a vectors scenario's "agent" field (client/conformance/README.md).
// --memory-budget is the node's memory budget that each rank's message log
// cap derives from (half of it, split among the registered ranks); without
// it every message log append is refused as over the cap.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/tests/conformance-agent/agenttest"
)

// LayoutEnv carries a vectors scenario's "agent" field from a
// conformance runner to this command: the default of --layout.
const LayoutEnv = "REFT_CONFORMANCE_AGENT"

func main() {
	if err := run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "conformance-agent:", err)
		os.Exit(1)
	}
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("conformance-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	job := fs.String("job", "4242", "Slurm job id the agent serves")
	dir := fs.String("dir", "", "where to make the temporary directory (default /dev/shm when writable, else the temp dir)")
	verbose := fs.Bool("verbose", false, "log the agent's events to stderr")
	layout := fs.String("layout", os.Getenv(LayoutEnv), "arena layout: \"\" (the agent's own) or \"scatter\" (a test layout); default $"+LayoutEnv)
	spc := fs.String("spec", "", "the --reft SPEC the agent serves (default agenttest's, arc)")
	budget := fs.Uint64("memory-budget", 0, "the node's memory budget in bytes, which the message log's per-rank cap derives from (0: none, every log append is over the cap)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log := zerolog.Nop()
	if *verbose {
		log = zerolog.New(stderr).With().Timestamp().Logger()
	}
	a, err := agenttest.Start(agenttest.Options{Job: *job, Dir: *dir, Log: log, Layout: *layout, Spec: *spc, MemoryBudget: *budget})
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintln(stdout, a.Socket); err != nil {
		a.Close()
		return fmt.Errorf("writing the socket path: %w", err)
	}
	// The runner holds our stdin open for as long as it needs the agent;
	// EOF (or a read error: the runner died) ends the agent. SIGINT and
	// SIGTERM too, so the directory never outlives us.
	// A line "notify NODE [CAUSE...]" makes the agent send its watching
	// clients a peer failure notice for NODE (JIT flush tests); other
	// lines are ignored.
	eof := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdin)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) >= 2 && f[0] == "notify" {
				a.NotifyPeerFailure(f[1], strings.Join(f[2:], " "))
			}
		}
		close(eof)
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sig)
	select {
	case <-eof:
	case <-sig:
	}
	return a.Close()
}
