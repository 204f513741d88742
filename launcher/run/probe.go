package run

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/agent/proto"
)

// socketPath is the agent's socket, <run_dir>/<job>/agent.sock, as
// agent.SocketPath has it (a test holds the two together; the launcher
// does not link the agent).
func socketPath(runDir, job string) string {
	return filepath.Join(runDir, job, "agent.sock")
}

// QueryAgent asks the agent at sock for its status.
func QueryAgent(ctx context.Context, sock string) (*proto.Status, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, fmt.Errorf("no agent answers on %s: %w", sock, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	var st proto.Status
	if err := proto.Call(c, proto.TStatus, 1, nil, &st); err != nil {
		return nil, fmt.Errorf("the agent on %s: status: %w", sock, err)
	}
	return &st, nil
}

// StatusLocal is `reft status-local`: one JSON line (an AgentReport) with
// the status of this node's agent for a job. reft run runs it on every
// step node after a failure; it exits 0 also when no agent answers, since
// that is what the report says.
func StatusLocal(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("reft status-local", flag.ContinueOnError)
	fs.SetOutput(stderr)
	confPath := fs.String("config", config.DefaultPath, "reft configuration `file` (for [agent] run_dir)")
	job := fs.String("job", os.Getenv("SLURM_JOB_ID"), "job `id` (default $SLURM_JOB_ID)")
	sock := fs.String("socket", "", "agent socket `path`; default <run_dir>/<job>/agent.sock")
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for the agent")
	stopAgent := fs.Bool("stop-agent", false, "then stop the agent (SIGTERM) and wait for it to exit; the job's next step starts a new one")
	flushWait := fs.Duration("flush-wait", defaultFlushWait, "with --stop-agent: how long to wait for the ranks' connections to close (their last saves) before stopping the agent")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: reft status-local [--config FILE] [--job ID]\n\n"+
			"Prints this node's agent status for a job as JSON, in reft-report lines\n"+
			"of at most 700 bytes each (reft run's probe step reads them).\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "reft status-local: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *job == "" && *sock == "" {
		fmt.Fprintln(stderr, "reft status-local: no job: run it inside a job step or give --job")
		return 2
	}
	if *sock == "" {
		c, err := config.Load(*confPath, true)
		if err != nil {
			fmt.Fprintln(stderr, "reft status-local:", err)
			return 1
		}
		*sock = socketPath(c.Agent.RunDir, *job)
	}
	rep := AgentReport{Node: nodeName(), Job: *job}
	limit := *timeout
	if *stopAgent {
		limit += max(*flushWait, 0)
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	st, err := QueryAgent(ctx, *sock)
	if err != nil {
		rep.Error = err.Error()
	} else {
		rep.OK, rep.Status = true, st
		if *stopAgent {
			query := func(ctx context.Context) (*proto.Status, error) { return QueryAgent(ctx, *sock) }
			var waited time.Duration
			rep.Status, rep.OpenAtStop, waited = waitRanksGone(ctx, query, st, *flushWait, flushPoll)
			rep.FlushWaitS = waited.Seconds()
			if err := stopPID(ctx, st.PID); err != nil {
				rep.Error = err.Error()
			} else {
				rep.Stopped = true
			}
		}
	}
	b, err := json.Marshal(rep)
	if err != nil {
		fmt.Fprintln(stderr, "reft status-local:", err)
		return 1
	}
	if err := writeReport(stdout, rep.Node, b); err != nil {
		fmt.Fprintln(stderr, "reft status-local:", err)
		return 1
	}
	return 0
}

// A report goes out as lines of at most reportPiece bytes of its JSON,
// "reft-report <node> <i>/<n> <piece>", each in one write. srun forwards
// a task's output line by line only up to its I/O buffer (1 KiB in Slurm
// 22.05): a longer line is cut into messages that interleave with other
// tasks' (seen: four nodes' reports merged into garbage, and reft run
// learning nothing of what was committed).
const (
	reportTag   = "reft-report"
	reportPiece = 700
)

func writeReport(w io.Writer, node string, b []byte) error {
	if node == "" || strings.ContainsAny(node, " \t\n") {
		node = "?"
	}
	n := (len(b) + reportPiece - 1) / reportPiece
	for i := 0; i < n; i++ {
		piece := b[i*reportPiece : min((i+1)*reportPiece, len(b))]
		if _, err := fmt.Fprintf(w, "%s %s %d/%d %s\n", reportTag, node, i+1, n, piece); err != nil {
			return err
		}
	}
	return nil
}

// defaultFlushWait bounds how long `status-local --stop-agent` waits for
// the ranks to let go of the agent before it stops it; flushPoll is how
// often it asks meanwhile.
const (
	defaultFlushWait = 3 * time.Second
	flushPoll        = 50 * time.Millisecond
)

// waitRanksGone asks the agent (query) until no rank is connected to it,
// at most bound, and returns its last status, the ranks still connected
// then (0: none), and how long it waited. A rank counts as connected
// while the status shows its progress (proto.RankProgress: present while
// its connection is open and it has saved or reported a step; the agent
// drops it first thing when the connection closes). Not Status.Clients:
// it counts a closed rank connection until the agent's session for it has
// wound down, which after a failure took until the agent stopped (seen
// on the test cluster: the ranks gone 0.1 s after the cancel, Clients
// still 3 three seconds later). An agent stopped before then would lose what its ranks are
// still saving: reft run stops the agents right after it cancelled the
// step, while the survivors' ranks may still be writing their JIT flush
// (on the failure notice or on the cancel's SIGTERM); a flush cut off
// uncommitted makes the relaunch resume from an older step. The last
// status, taken after the ranks let go, holds what that flush committed.
// A query that fails ends the wait with the status before it.
func waitRanksGone(ctx context.Context, query func(context.Context) (*proto.Status, error), st *proto.Status, bound, every time.Duration) (*proto.Status, int, time.Duration) {
	start := time.Now()
	deadline := start.Add(bound)
	for connectedRanks(st) > 0 && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return st, connectedRanks(st), time.Since(start)
		case <-time.After(every):
		}
		next, err := query(ctx)
		if err != nil {
			break
		}
		st = next
	}
	return st, connectedRanks(st), time.Since(start)
}

// connectedRanks counts the ranks st shows connected (with progress).
func connectedRanks(st *proto.Status) int {
	n := 0
	for _, r := range st.Ranks {
		if r.Progress != nil {
			n++
		}
	}
	return n
}

// stopPID sends SIGTERM to the agent and waits until it has exited.
func stopPID(ctx context.Context, pid int) error {
	if pid <= 0 {
		return fmt.Errorf("the agent gave no pid (%d)", pid)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return nil
		}
		return fmt.Errorf("stopping the agent (pid %d): %w", pid, err)
	}
	for {
		if exited(pid) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the agent (pid %d) did not exit after SIGTERM: %w", pid, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// exited says whether process pid is gone or a zombie. The agent is
// detached (setsid, second fork), so its parent is init or a subreaper,
// which reaps it when it gets to it: on the test cluster 1.4 s after the
// exit, the whole of that time in reft run's probe phase. A zombie holds
// nothing of the agent's (its socket, its lock, its ports are closed with
// its files), so the next step's agent can start.
func exited(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return errors.Is(err, os.ErrNotExist) // reaped meanwhile
	}
	st, err := procState(b)
	return err == nil && (st == 'Z' || st == 'X')
}

// procState is the state letter in a /proc/<pid>/stat line, "pid (comm)
// S ...": after the last ')', since comm may hold any byte.
func procState(b []byte) (byte, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) || b[i+1] != ' ' {
		return 0, fmt.Errorf("a /proc stat line without \"(comm) state\": %.40q", b)
	}
	return b[i+2], nil
}

// nodeName is the Slurm node name of this process's node.
func nodeName() string {
	if n := os.Getenv("SLURMD_NODENAME"); n != "" {
		return n
	}
	h, _ := os.Hostname()
	return h
}

// ParseReports reads the probe step's output: each node's AgentReport in
// pieces (writeReport), in order per node, whatever other nodes' lines
// come between; a whole report on a line of its own is read too. Other
// lines are ignored; reports for nodes outside want, and incomplete ones,
// are dropped.
func ParseReports(out []byte, want []string) map[string]AgentReport {
	got := map[string]AgentReport{}
	pieces := map[string][]string{}
	take := func(b []byte) {
		var r AgentReport
		if json.Unmarshal(b, &r) != nil || r.Node == "" || !slices.Contains(want, r.Node) {
			return
		}
		got[r.Node] = r
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		if strings.HasPrefix(strings.TrimSpace(line), "{") {
			take([]byte(strings.TrimSpace(line)))
			continue
		}
		f := strings.SplitN(line, " ", 4)
		if len(f) != 4 || f[0] != reportTag {
			continue
		}
		var i, n int
		if _, err := fmt.Sscanf(f[2], "%d/%d", &i, &n); err != nil || i < 1 || i > n || n > 1<<16 {
			continue
		}
		ps := pieces[f[1]]
		if i == 1 || len(ps) != i-1 { // a new report, or a piece out of order: start over
			ps = nil
			if i != 1 {
				pieces[f[1]] = nil
				continue
			}
		}
		ps = append(ps, f[3])
		pieces[f[1]] = ps
		if len(ps) == n {
			take([]byte(strings.Join(ps, "")))
			delete(pieces, f[1])
		}
	}
	return got
}
