// Package slurmjob asks Slurm about a job: its nodes and their addresses
// (the topology the agents' mesh is built on), a step's nodes, the job's
// state. It is a leaf package (scontrol and the standard library), so that
// the SPANK plugin, which slurmstepd loads as root, links it without the
// agent's mesh; package mesh re-exports its types.
package slurmjob

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Node is one node of the job's allocation.
type Node struct {
	// Index is the node's position in the allocation's node list (spares
	// included); it picks the node's candidate ports.
	Index int
	// Name is the Slurm node name (what the agent gets as --node).
	Name string
	// Addr is where its agent is reached: Slurm's NodeAddr (a host name or
	// an address), without a port.
	Addr string
	// SlurmdPort is the node's slurmd port (Slurm's Port); 0: unknown.
	// Failure detection connects to it to tell a dead node from a dead
	// agent.
	SlurmdPort int
}

// Topology is the job's allocation: every node, in Slurm's order.
type Topology struct {
	Nodes []Node
}

// Node finds a node by name.
func (t Topology) Node(name string) (Node, bool) {
	for _, n := range t.Nodes {
		if n.Name == name {
			return n, true
		}
	}
	return Node{}, false
}

// Check makes sure indexes are positions and names are unique.
func (t Topology) Check() error {
	if len(t.Nodes) == 0 {
		return errors.New("job topology has no nodes")
	}
	seen := map[string]bool{}
	for i, n := range t.Nodes {
		switch {
		case n.Index != i:
			return fmt.Errorf("job topology: node %s has index %d at position %d", n.Name, n.Index, i)
		case n.Name == "" || n.Addr == "":
			return fmt.Errorf("job topology: node %d has no name or address (%q, %q)", i, n.Name, n.Addr)
		case seen[n.Name]:
			return fmt.Errorf("job topology: node %s listed twice", n.Name)
		}
		seen[n.Name] = true
	}
	return nil
}

// TopologySource tells a Mesh the job's allocation: Slurm in the agent,
// Fixed in tests.
type TopologySource interface {
	Topology(ctx context.Context) (Topology, error)
}

// Fixed is a topology known in advance.
type Fixed Topology

// Topology implements TopologySource.
func (f Fixed) Topology(context.Context) (Topology, error) { return Topology(f), nil }

// Slurm asks Slurm for a job's allocation with scontrol: the job's NodeList
// (`scontrol show job -o`), expanded in order (`scontrol show hostnames`),
// and each node's NodeAddr (`scontrol show node -o`).
type Slurm struct {
	Job string
	// Scontrol is the scontrol program; "": found on PATH.
	Scontrol string
	// Conf, if set, is slurm.conf's path, passed as SLURM_CONF ([agent]
	// slurm_conf). "": scontrol's own default (its compiled-in path, or a
	// configless node's cache), or SLURM_CONF inherited by the agent.
	Conf string
	// Timeout bounds each scontrol call; 0: 10 s.
	Timeout time.Duration
}

// Topology implements TopologySource.
func (s Slurm) Topology(ctx context.Context) (Topology, error) {
	prog, err := s.scontrol()
	if err != nil {
		return Topology{}, err
	}
	list, names, err := s.jobNodes(ctx, prog)
	if err != nil {
		return Topology{}, err
	}
	out, err := s.run(ctx, prog, "show", "node", "-o", list)
	if err != nil {
		return Topology{}, err
	}
	addrs, ports := nodeAddrs(out), nodePorts(out)
	t := Topology{Nodes: make([]Node, len(names))}
	for i, n := range names {
		a := addrs[n]
		if a == "" {
			return Topology{}, fmt.Errorf("scontrol show node %s gave no NodeAddr for %s", list, n)
		}
		t.Nodes[i] = Node{Index: i, Name: n, Addr: a, SlurmdPort: ports[n]}
	}
	return t, t.Check()
}

// scontrol is the scontrol to run: Scontrol, else the one on PATH.
func (s Slurm) scontrol() (string, error) {
	if s.Scontrol != "" {
		return s.Scontrol, nil
	}
	p, err := exec.LookPath("scontrol")
	if err != nil {
		return "", fmt.Errorf("finding the job's nodes: scontrol is not on PATH (%s): %w (install Slurm's client commands on the compute nodes)",
			os.Getenv("PATH"), err)
	}
	return p, nil
}

// JobNodes are the nodes the job holds now, in slurmctld's order (a
// --no-kill job's list shrinks when it loses one); none once it no longer
// runs (ending, requeued, gone).
func (s Slurm) JobNodes(ctx context.Context) ([]string, error) {
	prog, err := s.scontrol()
	if err != nil {
		return nil, err
	}
	out, err := s.run(ctx, prog, "show", "job", "-o", s.Job)
	if err != nil {
		if strings.Contains(err.Error(), "Invalid job id") {
			return nil, nil
		}
		return nil, err
	}
	if m := jobStateRe.FindStringSubmatch(string(out)); m == nil || (m[1] != "RUNNING" && m[1] != "RESIZING") {
		return nil, nil
	}
	list, err := jobNodeList(out, s.Job)
	if err != nil {
		return nil, err
	}
	return s.hostnames(ctx, prog, list)
}

// StepNodes are the nodes of the job's step ("3", "extern").
func (s Slurm) StepNodes(ctx context.Context, step string) ([]string, error) {
	prog, err := s.scontrol()
	if err != nil {
		return nil, err
	}
	out, err := s.run(ctx, prog, "show", "step", "-o", s.Job+"."+step)
	if err != nil {
		return nil, err
	}
	m := nodeListRe.FindStringSubmatch(string(out))
	if m == nil {
		return nil, fmt.Errorf("`scontrol show step -o %s.%s` gave no NodeList: %.200s", s.Job, step, strings.TrimSpace(string(out)))
	}
	return s.hostnames(ctx, prog, m[1])
}

func (s Slurm) jobNodes(ctx context.Context, prog string) (list string, names []string, err error) {
	out, err := s.run(ctx, prog, "show", "job", "-o", s.Job)
	if err != nil {
		return "", nil, err
	}
	if list, err = jobNodeList(out, s.Job); err != nil {
		return "", nil, err
	}
	names, err = s.hostnames(ctx, prog, list)
	return list, names, err
}

// Hostnames expands a Slurm hostlist ("n[1-3,5]").
func (s Slurm) Hostnames(ctx context.Context, list string) ([]string, error) {
	prog, err := s.scontrol()
	if err != nil {
		return nil, err
	}
	return s.hostnames(ctx, prog, list)
}

func (s Slurm) hostnames(ctx context.Context, prog, list string) ([]string, error) {
	out, err := s.run(ctx, prog, "show", "hostnames", list)
	if err != nil {
		return nil, err
	}
	names := strings.Fields(string(out))
	if len(names) == 0 {
		return nil, fmt.Errorf("scontrol show hostnames %s printed no names", list)
	}
	return names, nil
}

func (s Slurm) run(ctx context.Context, prog string, args ...string) ([]byte, error) {
	d := s.Timeout
	if d <= 0 {
		d = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	cmd := exec.CommandContext(ctx, prog, args...)
	if s.Conf != "" {
		cmd.Env = append(os.Environ(), "SLURM_CONF="+s.Conf)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if ctx.Err() != nil {
			msg = fmt.Sprintf("no answer within %s (is slurmctld up?) %s", d, msg)
		}
		conf := "SLURM_CONF unset: scontrol's default slurm.conf"
		if s.Conf != "" {
			conf = "SLURM_CONF=" + s.Conf
		}
		return nil, fmt.Errorf("%s %s: %w: %s (%s; set agent.slurm_conf in reft.toml to slurm.conf's path if it is elsewhere)",
			prog, strings.Join(args, " "), err, msg, conf)
	}
	return out, nil
}

var (
	jobIDRe    = regexp.MustCompile(`(?:^|\s)JobId=(\S+)`)
	nodeListRe = regexp.MustCompile(`(?:^|\s)NodeList=(\S+)`)
	// Anchored on the field before it, so that a job name or comment that
	// contains " NodeList=" cannot stand in for it.
	allocListRe = regexp.MustCompile(`\sExcNodeList=\S*\s+NodeList=(\S+)`)
	nodeNameRe  = regexp.MustCompile(`^NodeName=(\S+)`)
	nodeAddrRe  = regexp.MustCompile(`\sNodeAddr=(\S+)`)
	nodePortRe  = regexp.MustCompile(`\sPort=(\d+)`)
)

// jobNodeList finds the allocation's NodeList in `scontrol show job -o`
// output (one line per job; a heterogeneous job prints several).
func jobNodeList(out []byte, job string) (string, error) {
	for _, line := range strings.Split(string(out), "\n") {
		m := jobIDRe.FindStringSubmatch(line)
		if m == nil || m[1] != job {
			continue
		}
		l := allocListRe.FindStringSubmatch(line)
		if l == nil {
			l = nodeListRe.FindStringSubmatch(line)
		}
		if l == nil || l[1] == "(null)" || l[1] == "" {
			return "", fmt.Errorf("job %s has no NodeList in `scontrol show job -o %s` (not running yet?): %.200s", job, job, line)
		}
		return l[1], nil
	}
	return "", fmt.Errorf("`scontrol show job -o %s` did not list job %s: %.200s", job, job, strings.TrimSpace(string(out)))
}

// nodeAddrs maps NodeName to NodeAddr in `scontrol show node -o` output.
func nodeAddrs(out []byte) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		n := nodeNameRe.FindStringSubmatch(line)
		a := nodeAddrRe.FindStringSubmatch(line)
		if n != nil && a != nil {
			m[n[1]] = a[1]
		}
	}
	return m
}

// nodePorts maps NodeName to its slurmd Port in `scontrol show node -o`
// output; nodes without one are left out.
func nodePorts(out []byte) map[string]int {
	m := map[string]int{}
	for _, line := range strings.Split(string(out), "\n") {
		n := nodeNameRe.FindStringSubmatch(line)
		p := nodePortRe.FindStringSubmatch(line)
		if n == nil || p == nil {
			continue
		}
		if v, err := strconv.Atoi(p[1]); err == nil && v > 0 && v < 65536 {
			m[n[1]] = v
		}
	}
	return m
}

// jobStateRe is anchored on QOS, the field before JobState (with WCKey
// between them when the site tracks WCKeys), so that a job name
// containing " JobState=" cannot stand in for it.
var jobStateRe = regexp.MustCompile(`\sQOS=\S*(?:\s+WCKey=\S*)?\s+JobState=(\S+)`)

// JobState is the job's state as slurmctld reports it (RUNNING, PENDING,
// COMPLETED, ...). gone is true when slurmctld no longer knows the job.
func (s Slurm) JobState(ctx context.Context) (state string, gone bool, err error) {
	prog := s.Scontrol
	if prog == "" {
		if prog, err = exec.LookPath("scontrol"); err != nil {
			return "", false, fmt.Errorf("scontrol is not on PATH: %w", err)
		}
	}
	out, err := s.run(ctx, prog, "show", "job", "-o", s.Job)
	if err != nil {
		if strings.Contains(err.Error(), "Invalid job id") {
			return "", true, nil
		}
		return "", false, err
	}
	for _, line := range strings.Split(string(out), "\n") {
		if m := jobIDRe.FindStringSubmatch(line); m == nil || m[1] != s.Job {
			continue
		}
		if m := jobStateRe.FindStringSubmatch(line); m != nil {
			return m[1], false, nil
		}
	}
	return "", false, fmt.Errorf("scontrol show job -o %s: no JobState for job %s", s.Job, s.Job)
}
