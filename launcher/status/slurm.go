package status

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/reft-hpc/reft/agent/mesh"
	"github.com/reft-hpc/reft/pmix/hostlist"
)

// Slurm is the JobSource of a real cluster: scontrol, as the agents ask it.
type Slurm struct {
	Scontrol string // "": scontrol on PATH
	Squeue   string // "": squeue on PATH
	Sacct    string // "": sacct on PATH
	Conf     string // SLURM_CONF for scontrol and squeue; "": the environment's
}

var (
	jobIDRe = regexp.MustCompile(`(?:^|\s)JobId=(\S+)`)
	// The owner is the last UserId= of the line: JobName, which comes
	// before it, could contain the text.
	userRe      = regexp.MustCompile(`\sUserId=([^\s(]*)\((\d+)\)`)
	nodeStateRe = regexp.MustCompile(`\sState=(\S+)`)
	nodeNameRe  = regexp.MustCompile(`^NodeName=(\S+)`)
	nodeAddrRe  = regexp.MustCompile(`\sNodeAddr=(\S+)`)
)

// Job implements JobSource.
func (s Slurm) Job(ctx context.Context, id string) (Job, error) {
	j := Job{ID: id, NodeStates: map[string]string{}}
	out, err := s.run(ctx, "show", "job", "-o", id)
	if err != nil {
		if strings.Contains(err.Error(), "Invalid job id") {
			return j, notRunning{fmt.Sprintf("job %s is unknown to Slurm (finished long ago, or never existed; reft log %s may still tell its story)", id, id)}
		}
		return j, err
	}
	var line string
	for _, l := range strings.Split(string(out), "\n") {
		if m := jobIDRe.FindStringSubmatch(l); m != nil && m[1] == id {
			line = l
			break
		}
	}
	if line == "" {
		return j, fmt.Errorf("`scontrol show job -o %s` did not list job %s (an array or het job? give the job id of one component): %.200s", id, id, strings.TrimSpace(string(out)))
	}
	us := userRe.FindAllStringSubmatch(line, -1)
	if us == nil {
		return j, fmt.Errorf("`scontrol show job -o %s` names no owner (UserId=): %.200s", id, line)
	}
	u := us[len(us)-1]
	j.User = u[1]
	if j.UID, err = strconv.Atoi(u[2]); err != nil {
		return j, fmt.Errorf("job %s: owner uid %q: %w", id, u[2], err)
	}
	sl := mesh.Slurm{Job: id, Scontrol: s.Scontrol, Conf: s.Conf}
	if j.State, _, err = sl.JobState(ctx); err != nil {
		return j, err
	}
	if j.State != "RUNNING" && j.State != "COMPLETING" {
		return j, nil
	}
	t, err := sl.Topology(ctx)
	if err != nil {
		return j, err
	}
	j.Nodes = t.Nodes
	names := make([]string, len(t.Nodes))
	for i, n := range t.Nodes {
		names[i] = n.Name
	}
	// A --no-kill allocation shrinks after a node loss, but its agents
	// keep the ports they computed from the whole allocation: index the
	// nodes as they did, from the job's first accounting record.
	all := names
	if orig := s.originalNodes(ctx, id); len(orig) > len(names) && !slices.ContainsFunc(names, func(n string) bool { return !slices.Contains(orig, n) }) {
		all = orig
	}
	// Node states and steps only explain a missing agent: their absence
	// is no error.
	j.StepNodes = s.stepNodes(ctx, id)
	addrs := map[string]string{}
	if out, err := s.run(ctx, "show", "node", "-o", strings.Join(all, ",")); err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			n := nodeNameRe.FindStringSubmatch(l)
			if n == nil {
				continue
			}
			if st := nodeStateRe.FindStringSubmatch(l); st != nil {
				j.NodeStates[n[1]] = st[1]
			}
			if a := nodeAddrRe.FindStringSubmatch(l); a != nil {
				addrs[n[1]] = a[1]
			}
		}
	}
	if len(all) > len(names) {
		nodes := make([]mesh.Node, len(all))
		for i, n := range all {
			if addrs[n] == "" {
				return j, nil // keep the current allocation's view
			}
			nodes[i] = mesh.Node{Index: i, Name: n, Addr: addrs[n]}
		}
		j.Released = map[string]bool{}
		for _, n := range all {
			j.Released[n] = !slices.Contains(names, n)
		}
		j.Nodes = nodes
	}
	return j, nil
}

// originalNodes is the job's first allocation, the largest node list of
// its accounting records; nil when sacct does not tell.
func (s Slurm) originalNodes(ctx context.Context, id string) []string {
	prog := s.Sacct
	if prog == "" {
		prog = "sacct"
	}
	out, err := s.exec(ctx, prog, "-n", "-X", "-P", "-j", id, "-o", "NodeList")
	if err != nil {
		return nil
	}
	var best []string
	for _, l := range strings.Split(string(out), "\n") {
		if names, err := hostlist.Expand(strings.TrimSpace(l)); err == nil && len(names) > len(best) {
			best = names
		}
	}
	return best
}

// stepNodes is the nodes of the job's running steps, its batch and
// extern steps left out; nil when squeue does not tell.
func (s Slurm) stepNodes(ctx context.Context, id string) map[string]bool {
	prog := s.Squeue
	if prog == "" {
		prog = "squeue"
	}
	out, err := s.exec(ctx, prog, "-h", "-s", "-j", id, "-o", "%i|%N")
	if err != nil {
		return nil
	}
	m := map[string]bool{}
	for _, l := range strings.Split(string(out), "\n") {
		step, list, ok := strings.Cut(strings.TrimSpace(l), "|")
		if !ok || strings.HasSuffix(step, ".batch") || strings.HasSuffix(step, ".extern") {
			continue
		}
		names, err := hostlist.Expand(list)
		if err != nil {
			return nil
		}
		for _, n := range names {
			m[n] = true
		}
	}
	return m
}

func (s Slurm) run(ctx context.Context, args ...string) ([]byte, error) {
	prog := s.Scontrol
	if prog == "" {
		prog = "scontrol"
	}
	return s.exec(ctx, prog, args...)
}

func (s Slurm) exec(ctx context.Context, prog string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, prog, args...)
	if s.Conf != "" {
		cmd.Env = append(os.Environ(), "SLURM_CONF="+s.Conf)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s (is Slurm's client installed and slurmctld up?)", prog, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}
