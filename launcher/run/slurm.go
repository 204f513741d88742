package run

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/reft-hpc/reft/launcher/recoverylog"
	"github.com/reft-hpc/reft/pmix/hostlist"
)

// Slurm is what reft run asks of Slurm; tests replace it.
type Slurm interface {
	// Hostnames expands a host list (scontrol show hostnames).
	Hostnames(ctx context.Context, list string) ([]string, error)
	// NodeStates returns the State of those of nodes that are still in
	// the job's allocation.
	NodeStates(ctx context.Context, job string, nodes []string) (map[string]string, error)
	// Probe asks the agent of every node (a step running reft
	// status-local); nodes that could not be reached have no report. err
	// is set only when no node answered.
	Probe(ctx context.Context, job string, nodes []string) (map[string]AgentReport, error)
	// Steps lists the job's running steps: "42.3" -> step name.
	Steps(ctx context.Context, job string) (map[string]string, error)
	SetComment(ctx context.Context, job, text string) error
	Requeue(ctx context.Context, job string) error
	// Cancel cancels a step ("42.3") that srun did not end.
	Cancel(ctx context.Context, step string) error
	// Shrink gives the allocation's other nodes back: the job keeps only
	// keep (scontrol update NodeList=), and its steps there are ended.
	Shrink(ctx context.Context, job string, keep []string) error
	// StopAgents is Probe that also stops the agents (reft status-local
	// --stop-agent): the reports say what each had before it stopped; the
	// next step starts new ones.
	StopAgents(ctx context.Context, job string, nodes []string) (map[string]AgentReport, error)
	// Start launches the step.
	Start(l Launch) (Proc, error)
	// Release is the Slurm release of srun (srun --version), which picks
	// the step's command line where releases differ.
	Release(ctx context.Context) (Release, error)
}

// Launch is one srun of the step.
type Launch struct {
	Argv     []string
	Env      []string // the whole environment
	Stdout   io.Writer
	Stderr   io.Writer                      // srun's stderr is copied here ...
	OnStderr func(line string, t time.Time) // ... and each line handed here
}

// Proc is a running srun.
type Proc interface {
	// Wait returns srun's exit status (-1 when a signal killed it).
	Wait() int
	// Signal sends sig to srun.
	Signal(sig os.Signal) error
}

// Exec is Slurm through its commands.
type Exec struct {
	Srun, Scontrol, Squeue, Scancel string
	Self                            string // this reft binary, run by the probe on every node
	ConfigPath                      string // passed to reft status-local
	Env                             []string
}

func (e Exec) command(ctx context.Context, prog string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, prog, args...)
	cmd.Env = e.Env
	// srun given SIGTERM ends its step cleanly; SIGKILL would orphan it.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 15 * time.Second
	return cmd
}

func (e Exec) output(ctx context.Context, prog string, args ...string) ([]byte, error) {
	cmd := e.command(ctx, prog, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("%s %s: %w: %s", prog, strings.Join(args, " "), err, oneLine(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// Hostnames runs scontrol show hostnames.
func (e Exec) Hostnames(ctx context.Context, list string) ([]string, error) {
	out, err := e.output(ctx, e.Scontrol, "show", "hostnames", list)
	if err != nil {
		return nil, err
	}
	hosts := strings.Fields(string(out))
	if len(hosts) == 0 {
		return nil, fmt.Errorf("scontrol show hostnames %s gave no node", list)
	}
	return hosts, nil
}

var (
	jobNodeListRe = regexp.MustCompile(`(?:^|\s)NodeList=(\S+)`)
	nodeStateRe   = regexp.MustCompile(`(?:^|\s)NodeName=(\S+)\s.*?(?:^|\s)State=(\S+)`)
)

// NodeStates asks scontrol for the job's current node list and the states
// of nodes.
func (e Exec) NodeStates(ctx context.Context, job string, nodes []string) (map[string]string, error) {
	out, err := e.output(ctx, e.Scontrol, "-o", "show", "job", job)
	if err != nil {
		return nil, err
	}
	m := jobNodeListRe.FindStringSubmatch(string(out))
	if m == nil {
		return nil, fmt.Errorf("scontrol show job %s: no NodeList", job)
	}
	inJob := map[string]bool{}
	if m[1] != "(null)" {
		hosts, err := e.Hostnames(ctx, m[1])
		if err != nil {
			return nil, err
		}
		for _, h := range hosts {
			inJob[h] = true
		}
	}
	// scontrol fails as a whole when one of several nodes is unknown, but
	// still prints the others.
	out, err = e.output(ctx, e.Scontrol, "-o", "show", "node", strings.Join(nodes, ","))
	states := ParseNodeStates(string(out))
	if len(states) == 0 && err != nil {
		return nil, err
	}
	for n := range states {
		if !inJob[n] {
			delete(states, n)
		}
	}
	return states, nil
}

// ParseNodeStates reads `scontrol -o show node` output.
func ParseNodeStates(out string) map[string]string {
	states := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if m := nodeStateRe.FindStringSubmatch(line); m != nil {
			states[m[1]] = m[2]
		}
	}
	return states
}

// Probe runs reft status-local on every node, one task each, overlapping
// whatever else runs there, with the plugin off for the step so that it
// neither starts an agent nor hides a dead one.
func (e Exec) Probe(ctx context.Context, job string, nodes []string) (map[string]AgentReport, error) {
	return e.probe(ctx, job, nodes)
}

func (e Exec) probe(ctx context.Context, job string, nodes []string, extra ...string) (map[string]AgentReport, error) {
	if len(nodes) == 0 {
		return map[string]AgentReport{}, nil
	}
	n := strconv.Itoa(len(nodes))
	args := []string{"--overlap", "--reft=off", "--job-name=" + recoverylog.ProbeStepName,
		"--nodes=" + n, "--ntasks=" + n, "--ntasks-per-node=1", "--nodelist=" + strings.Join(nodes, ","),
		"--kill-on-bad-exit=0", e.Self, "status-local", "--config", e.ConfigPath, "--job", job}
	args = append(args, extra...)
	out, err := e.output(ctx, e.Srun, args...)
	reports := ParseReports(out, nodes)
	if len(reports) == 0 {
		if err == nil {
			err = errors.New("the probe step printed no report")
		}
		return reports, fmt.Errorf("asking the agents: %w", err)
	}
	return reports, nil
}

// StopAgents is Probe with --stop-agent.
func (e Exec) StopAgents(ctx context.Context, job string, nodes []string) (map[string]AgentReport, error) {
	return e.probe(ctx, job, nodes, "--stop-agent")
}

// Steps lists the job's running steps with squeue.
func (e Exec) Steps(ctx context.Context, job string) (map[string]string, error) {
	out, err := e.output(ctx, e.Squeue, "-h", "-s", "-j", job, "-o", "%i|%j")
	if err != nil {
		return nil, err
	}
	steps := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		id, name, ok := strings.Cut(strings.TrimSpace(line), "|")
		if ok {
			steps[id] = name
		}
	}
	return steps, nil
}

// SetComment sets the job's Comment.
func (e Exec) SetComment(ctx context.Context, job, text string) error {
	_, err := e.output(ctx, e.Scontrol, "update", "jobid="+job, "Comment="+text)
	return err
}

// Requeue requeues the job (it must have been submitted with --requeue).
func (e Exec) Requeue(ctx context.Context, job string) error {
	_, err := e.output(ctx, e.Scontrol, "requeue", job)
	return err
}

// Cancel runs scancel on a step.
func (e Exec) Cancel(ctx context.Context, step string) error {
	_, err := e.output(ctx, e.Scancel, step)
	return err
}

// Shrink resizes the job to the nodes in keep (a job's owner may shrink
// it). Slurm then ends the steps on the others without waiting for their
// slurmd, so a relaunch need not wait until Slurm calls a lost node down.
func (e Exec) Shrink(ctx context.Context, job string, keep []string) error {
	_, err := e.output(ctx, e.Scontrol, "update", "JobId="+job, "NodeList="+hostlist.Compress(keep))
	return err
}

// Start launches srun in its own process group, so that a Ctrl-C reaches
// reft run alone and reft run decides how the step ends; srun gets
// SIGTERM if reft run dies.
func (e Exec) Start(l Launch) (Proc, error) {
	p := &execProc{done: make(chan int, 1)}
	started := make(chan error, 1)
	go func() {
		// Pdeathsig fires when the thread that forked exits: keep it
		// alive, locked, until srun has ended.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		cmd := exec.Command(l.Argv[0], l.Argv[1:]...)
		cmd.Env = l.Env
		cmd.Stdout = l.Stdout
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
		pipe, err := cmd.StderrPipe()
		if err == nil {
			err = cmd.Start()
		}
		if err != nil {
			started <- fmt.Errorf("starting %s: %w", l.Argv[0], err)
			return
		}
		p.cmd = cmd
		started <- nil
		sc := bufio.NewScanner(pipe)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if l.Stderr != nil {
				fmt.Fprintln(l.Stderr, line)
			}
			if l.OnStderr != nil {
				l.OnStderr(line, time.Now())
			}
		}
		io.Copy(io.Discard, pipe) // a line over the buffer: keep srun from blocking
		cmd.Wait()
		p.done <- cmd.ProcessState.ExitCode()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

type execProc struct {
	cmd  *exec.Cmd
	done chan int
	code *int
}

func (p *execProc) Wait() int {
	if p.code == nil {
		c := <-p.done
		p.code = &c
	}
	return *p.code
}

func (p *execProc) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}
