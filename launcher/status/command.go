package status

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/agent/metrics"
	"github.com/reft-hpc/reft/agent/peer"
	"github.com/reft-hpc/reft/agent/peerconfig"
	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/hostmem"
)

var jobArgRe = regexp.MustCompile(`^[0-9]+$`)

// Command is `reft status [JOBID]`.
func Command(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("reft status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	confPath := fs.String("config", config.UserPath(), "reft configuration `file`, default $REFT_CONFIG or "+config.DefaultPath+" (agent.port_range, peer_auth, peer_secret: as the job's agents use them)")
	asJSON := fs.Bool("json", false, "print the report as one JSON object")
	asProm := fs.Bool("prom", false, "print the agents' Prometheus metrics (the families of docs/METRICS.md, text format)")
	timeout := fs.Duration("timeout", 10*time.Second, "how long to wait for Slurm and the agents")
	watch := fs.Bool("watch", false, "refresh the table every --interval until Ctrl-C or the job ends (plain timestamped lines when stdout is not a terminal)")
	interval := fs.Duration("interval", 2*time.Second, "--watch's refresh `interval`")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: reft status [--json|--prom|--watch [--interval D]] [--config FILE] [JOBID]\n\n"+
			"Asks every node's agent of a running job (default $SLURM_JOB_ID) for its state:\n"+
			"agent up or not and why, each rank's newest committed step, protection (SPEC,\n"+
			"sharding group, peers connected, degraded states), bytes held and memory\n"+
			"budget used. Run it as the job's user, from any node that reaches the agents'\n"+
			"peer ports (agent.port_range).\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *asJSON && *asProm {
		fmt.Fprintln(stderr, "reft status: --json or --prom, not both")
		return 2
	}
	if *watch && (*asJSON || *asProm) {
		fmt.Fprintln(stderr, "reft status: --watch shows the table; for --json or --prom, call reft status at your own interval")
		return 2
	}
	if *interval < 100*time.Millisecond {
		fmt.Fprintf(stderr, "reft status: --interval %s is too short (every refresh asks slurmctld and every agent); use 100ms or more\n", *interval)
		return 2
	}
	job := os.Getenv("SLURM_JOB_ID")
	switch fs.NArg() {
	case 0:
		if job == "" {
			fmt.Fprintln(stderr, "reft status: no job: give a job id (reft status 4242), or run it inside the job")
			return 2
		}
	case 1:
		job = fs.Arg(0)
	default:
		fmt.Fprintln(stderr, "reft status: want at most one job id")
		return 2
	}
	if !jobArgRe.MatchString(job) {
		fmt.Fprintf(stderr, "reft status: %q is not a job id (want a number, e.g. reft status 4242)\n", job)
		return 2
	}
	c, err := config.Load(*confPath, config.MissingOK(*confPath))
	if err != nil {
		fmt.Fprintln(stderr, "reft status:", err)
		return 1
	}
	host, _ := os.Hostname()
	uid := os.Getuid()
	pc, err := peerconfig.FromAgentConfig(c, peer.Config{Job: job, UID: uid, Node: "reft-status@" + host, Role: peer.RoleStatus, Log: zerolog.Nop()})
	if err != nil {
		fmt.Fprintf(stderr, "reft status: %v\n", err)
		return 1
	}
	opts := Options{Peer: pc, Jobs: Slurm{Conf: c.Agent.SlurmConf}, Timeout: *timeout}
	if *watch {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		err := Watch(ctx, stdout, WatchOptions{
			Query:    func(ctx context.Context) (*Report, error) { return Query(ctx, opts) },
			Interval: *interval,
			TTY:      isTerminal(stdout),
		})
		if err != nil {
			fmt.Fprintln(stderr, "reft status:", err)
			return 1
		}
		return 0
	}
	rep, err := Query(context.Background(), opts)
	if err != nil {
		fmt.Fprintln(stderr, "reft status:", err)
		return 1
	}
	if *asProm {
		if err := WriteProm(stdout, stderr, rep); err != nil {
			fmt.Fprintln(stderr, "reft status:", err)
			return 1
		}
		return 0
	}
	if *asJSON {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			fmt.Fprintln(stderr, "reft status:", err)
			return 1
		}
		fmt.Fprintf(stdout, "%s\n", b)
		return 0
	}
	Print(stdout, rep)
	return 0
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// WriteProm writes the metrics of every node whose agent answered (agent/
// metrics, the families its textfile has), and to stderr which did not.
func WriteProm(w, stderr io.Writer, r *Report) error {
	var sts []proto.Status
	for _, n := range r.Nodes {
		switch {
		case n.Status != nil:
			sts = append(sts, *n.Status)
		case n.Agent != AgentNone:
			fmt.Fprintf(stderr, "reft status: %s: agent %s%s; no metrics from it\n", n.Node, n.Agent, strings.TrimSuffix(": "+n.Error, ": "))
		}
	}
	return metrics.Write(w, sts...)
}

// Print writes the report as a table, one row per node, then the
// degraded states and why agents are not up.
func Print(w io.Writer, r *Report) {
	spec := r.Spec
	if spec == "" {
		spec = "?"
	}
	fmt.Fprintf(w, "job %s (%s) %s, --reft=%s, %d nodes\n", r.Job, r.User, r.State, spec, len(r.Nodes))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tAGENT\tRANKS\tCOMMITTED\tPROTECTION\tPEERS\tHELD\tMEMORY USED/BUDGET")
	for _, n := range r.Nodes {
		st := n.Status
		if st == nil {
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\t-\t-\n", n.Node, n.Agent)
			continue
		}
		ranks, committed := "-", "-"
		var rs, cs []string
		for _, rk := range st.Ranks {
			rs = append(rs, strconv.Itoa(rk.Rank))
			if rk.Newest < 0 {
				cs = append(cs, "none")
			} else {
				cs = append(cs, strconv.FormatInt(rk.Newest, 10))
			}
		}
		if len(rs) > 0 {
			ranks, committed = strings.Join(rs, ","), strings.Join(cs, ",")
		}
		mem, held := "-", "-"
		if m := st.Memory; m != nil {
			held = hostmem.FormatBytes(m.Held)
			mem = hostmem.FormatBytes(m.InUse)
			if m.Budget > 0 {
				mem += " / " + hostmem.FormatBytes(int64(m.Budget))
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Node, n.Agent, ranks, committed, protection(st), peers(st, r.Nodes), held, mem)
	}
	tw.Flush()
	var notes []string
	for _, n := range r.Nodes {
		if n.Error != "" {
			notes = append(notes, n.Node+": "+n.Error)
		}
		for _, x := range n.Warnings {
			notes = append(notes, n.Node+": "+x)
		}
	}
	for _, x := range r.Stragglers {
		notes = append(notes, x.String())
	}
	if len(notes) > 0 {
		fmt.Fprintln(w, "notes:")
		for _, x := range notes {
			fmt.Fprintln(w, "  "+x)
		}
	}
}

// protection is a node's PROTECTION cell: how its ranks' snapshots are
// protected, e.g. "arc SG(pp=0,tp=0) 1/4" (ring position of members).
func protection(st *proto.Status) string {
	if len(st.Ranks) == 0 {
		return "no ranks (spare?)"
	}
	var out []string
	for _, rk := range st.Ranks {
		p := rk.Protection
		var s string
		switch {
		case p == nil:
			s = "? (not registered since the agent started)"
		case p.Mode == proto.ProtectLocal:
			s = "local only"
		default:
			var modes []string
			if p.ARC {
				modes = append(modes, "arc")
			}
			if p.AEC > 0 {
				modes = append(modes, "aec:"+strconv.Itoa(p.AEC))
			}
			if p.AOR {
				modes = append(modes, "aor")
			}
			if p.Mode == proto.ProtectWhole {
				modes = append(modes, "whole")
			}
			s = fmt.Sprintf("%s SG%s %d/%d", strings.Join(modes, "+"), p.Group, p.Position, len(p.Members))
		}
		if p != nil && !p.Connected {
			s += " (rank gone)"
		}
		out = append(out, s)
	}
	return strings.Join(dedup(out), "; ")
}

func dedup(s []string) []string {
	var out []string
	for _, x := range s {
		if len(out) == 0 || out[len(out)-1] != x {
			out = append(out, x)
		}
	}
	return out
}

// peers is a node's PEERS cell: connected / other nodes that need an
// agent (spares without one left out), or the peering state when it is
// not on.
func peers(st *proto.Status, all []NodeReport) string {
	p := st.Peering
	if p == nil {
		return "-"
	}
	if p.State != proto.PeeringOn {
		return p.State
	}
	n, of := 0, 0
	for _, ps := range p.Peers {
		if ps.Connected {
			n++
		}
		if ps.Connected || needsAgent(ps.Node, all) {
			of++
		}
	}
	return fmt.Sprintf("%d/%d", n, of)
}
