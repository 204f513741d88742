// Command plugin is the Go half of the reft SPANK plugin, built with
// -buildmode=c-shared as libreft_spank.so. spank/shim.c loads it lazily, with
// asynchronous signals blocked, and only where no forked child runs Go: srun,
// sbatch, salloc (validating --reft), the prolog, and slurmstepd (before it
// forks tasks, and in its own process when they have exited). See
// spank/README.md for which callback does what.
//
// Rules for this file: no exported function panics across the C boundary
// (each recovers), none exits the process, none forks. Strings come in as C
// strings and go out into caller-provided buffers, NUL-terminated and
// truncated to fit.
package main

/*
#include <stdint.h>
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/agent/runpath"
	"github.com/reft-hpc/reft/agent/slurmjob"
	"github.com/reft-hpc/reft/launcher/version"
	"github.com/reft-hpc/reft/spank/rootfs"
	"github.com/reft-hpc/reft/spank/spec"
	"github.com/reft-hpc/reft/spank/stepend"
)

func main() {} // required by -buildmode=c-shared

// put copies s into the C buffer buf of n bytes, NUL-terminated.
func put(buf *C.char, n C.int, s string) {
	if buf == nil || n <= 0 {
		return
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(n))
	k := copy(b[:len(b)-1], s)
	b[k] = 0
}

// putList writes items NUL-separated with a final empty item ("a\0b\0\0").
// It fails rather than truncate.
func putList(buf *C.char, n C.int, items []string) error {
	size := 1
	for _, it := range items {
		if strings.IndexByte(it, 0) >= 0 {
			return fmt.Errorf("NUL byte in %q", it)
		}
		size += len(it) + 1
	}
	if buf == nil || int(n) < size {
		return fmt.Errorf("internal: %d-byte buffer too small for %d bytes", n, size)
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(n))
	i := 0
	for _, it := range items {
		i += copy(b[i:], it)
		b[i] = 0
		i++
	}
	b[i] = 0
	return nil
}

// guard turns a panic into an error return: nothing may unwind into C.
func guard(errb *C.char, errlen C.int, rc *C.int) {
	if r := recover(); r != nil {
		put(errb, errlen, fmt.Sprintf("internal error in the reft plugin: %v", r))
		*rc = -1
	}
}

// reft_go_normalize validates a SPEC and writes its canonical form to out.
// Returns 0, or -1 with a one-line message in errb.
//
//export reft_go_normalize
func reft_go_normalize(in *C.char, out *C.char, outlen C.int, errb *C.char, errlen C.int) (rc C.int) {
	defer guard(errb, errlen, &rc)
	s, err := spec.Normalize(C.GoString(in))
	if err != nil {
		put(errb, errlen, err.Error())
		return -1
	}
	put(out, outlen, s)
	return 0
}

// markerName is the job's marker in the plugin's state directory, where the
// prolog (or the first step, when only an inner srun asked for reft) leaves
// the job's SPEC on this node. The state directory is fixed in the shim
// (REFT_STATE_DIR, root:root 0700 under a root-owned directory) so that the
// shim can tell a reft job without loading Go.
func markerName(job string) string { return job + ".spec" }

// maxMarker bounds what is read from a marker: a SPEC is short.
const maxMarker = 4096

// reft_go_prolog runs in the job prolog (root). For a reft job it records the
// SPEC on this node, so that the extern step starts the agent. Returns 1 when
// reft is on for the job, 0 when off, -1 on error (message in errb; the
// caller only logs it: a prolog failure would drain the node).
//
//export reft_go_prolog
func reft_go_prolog(cfgPath, stateDir, specIn *C.char, job C.uint32_t, errb *C.char, errlen C.int) (rc C.int) {
	defer guard(errb, errlen, &rc)
	s, err := spec.Parse(C.GoString(specIn))
	if err != nil {
		put(errb, errlen, err.Error())
		return -1
	}
	if !s.Enabled() {
		return 0
	}
	if _, err := config.Load(C.GoString(cfgPath), false); err != nil {
		put(errb, errlen, err.Error()) // the steps report it to the user
		return -1
	}
	if err := writeMarker(C.GoString(stateDir), strconv.FormatUint(uint64(job), 10), s); err != nil {
		put(errb, errlen, err.Error())
		return -1
	}
	return 1
}

// writeMarker records the job's SPEC in the verified state directory
// (created if missing), through a fresh O_EXCL|O_NOFOLLOW temporary file.
func writeMarker(stateDir, job string, s spec.Spec) error {
	d, err := rootfs.OpenRootDir(stateDir, true, 0o700)
	if err != nil {
		return fmt.Errorf("plugin state directory: %w", err)
	}
	defer d.Close()
	return d.WriteFileAtomic(markerName(job), []byte(s.String()+"\n"), 0o600)
}

// readMarker returns the SPEC recorded for job on this node, normalized, or
// "" when there is none (or it says off). The marker must be root's regular
// file in the verified state directory, and hold a valid SPEC: it becomes
// the agent's argument. The error never quotes the file's content.
func readMarker(stateDir, job string) (string, error) {
	d, err := rootfs.OpenRootDir(stateDir, false, 0)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("plugin state directory: %w", err)
	}
	defer d.Close()
	b, err := d.ReadFile(markerName(job), maxMarker)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("job marker: %w", err)
	}
	s, err := spec.Parse(strings.TrimSpace(string(b)))
	if err != nil {
		return "", fmt.Errorf("job marker %s/%s does not hold a valid SPEC: ignored", d.Path(), markerName(job))
	}
	if !s.Enabled() {
		return "", nil
	}
	return s.String(), nil
}

// plan is what the shim needs to start an agent (spawn_agent's P_* items):
// the directories it creates as root (run_dir and the job's directory in
// it, tmpfs_root and the user's directory in it, the same under the
// hugetlbfs mount), the log directory (the job's directory in it is made as
// the user), then the agent's argv.
func plan(cfgPath string, cfg config.Config, specStr, job string, uid uint32, node string, restart int, startedBy string) []string {
	return []string{
		cfg.Agent.RunDir,
		job,
		cfg.Store.TmpfsRoot,
		strconv.FormatUint(uint64(uid), 10),
		cfg.Store.HugeTLBFS,
		cfg.Log.Dir,
		cfg.Agent.Binary,
		"--config", cfgPath, "--job", job, "--node", node, "--spec", specStr,
		"--uid", strconv.FormatUint(uint64(uid), 10), "--restart", strconv.Itoa(restart),
		"--started-by", startedBy,
	}
}

// reft_go_extern_plan runs in the extern step (root). If the prolog marked
// the job as a reft job, it writes the agent plan to out (see plan;
// NUL-separated) and returns 1; it returns 0 for a job without reft and -1
// on error.
//
//export reft_go_extern_plan
func reft_go_extern_plan(cfgPath, stateDir *C.char, job, uid C.uint32_t, node *C.char, out *C.char, outlen C.int, errb *C.char, errlen C.int) (rc C.int) {
	defer guard(errb, errlen, &rc)
	cfg, err := config.Load(C.GoString(cfgPath), false)
	if err != nil {
		put(errb, errlen, err.Error())
		return -1
	}
	j := strconv.FormatUint(uint64(job), 10)
	s, err := readMarker(C.GoString(stateDir), j)
	if err != nil {
		put(errb, errlen, err.Error())
		return -1
	}
	if s == "" {
		return 0
	}
	if uid == 0 {
		return 0 // the shim never asks for root's jobs; no agent for them
	}
	if err := putList(out, outlen, plan(C.GoString(cfgPath), cfg, s, j, uint32(uid), C.GoString(node), 0, "extern")); err != nil {
		put(errb, errlen, err.Error())
		return -1
	}
	return 1
}

// stepName renders Slurm's special step ids.
func stepName(id uint32) string {
	switch id {
	case 0xfffffffa:
		return "interactive"
	case 0xfffffffb:
		return "batch"
	case 0xfffffffc:
		return "extern"
	}
	return strconv.FormatUint(uint64(id), 10)
}

// reft_go_step runs in user_init of a step (slurmstepd, euid = the user).
// Phase 0: if the job's agent answers, use it; otherwise return 2 with an
// agent plan in out (the shim starts an agent; the job's lock makes sure only
// one runs per node) and the shim calls again with phase 1 to wait for it. On success, out holds the
// task environment (KEY=VALUE, NUL-separated) and the result is 1. 0 means
// reft is off for this step. -1: errb holds the message the tasks print.
//
//export reft_go_step
func reft_go_step(cfgPath, stateDir, specIn *C.char, job, step, uid C.uint32_t, node *C.char, restart C.int, phase C.int,
	out *C.char, outlen C.int, errb *C.char, errlen C.int) (rc C.int) {
	defer guard(errb, errlen, &rc)
	n := C.GoString(node)
	fail := func(format string, a ...any) C.int {
		put(errb, errlen, fmt.Sprintf("node %s: ", n)+fmt.Sprintf(format, a...))
		return -1
	}
	s, err := spec.Parse(C.GoString(specIn))
	if err != nil {
		return fail("%v", err)
	}
	if !s.Enabled() {
		return 0
	}
	cp := C.GoString(cfgPath)
	cfg, err := config.Load(cp, false)
	if err != nil {
		return fail("reft cannot start: %v", err)
	}
	j := strconv.FormatUint(uint64(job), 10)
	sock := runpath.SocketPath(cfg.Agent.RunDir, j)
	// No answer: start an agent from this step. If the extern step's agent
	// is still starting, or another step is starting one, the new agent
	// finds the job's lock taken and exits at once; then we just wait.
	if phase == 0 && !answers(sock, 200*time.Millisecond) {
		if err := putList(out, outlen, plan(cp, cfg, s.String(), j, uint32(uid), n, int(restart), "step "+stepName(uint32(step)))); err != nil {
			return fail("%v", err)
		}
		return 2
	}
	hr, err := waitAgent(sock, filepath.Join(runpath.JobRunDir(cfg.Agent.RunDir, j), runpath.ErrorName), cfg.Agent.StartTimeout.D())
	if err != nil {
		return fail("%v", err)
	}
	_ = hr
	keepStepConn(sock)
	env := []string{
		"REFT_AGENT_SOCKET=" + sock,
		"REFT_SPEC=" + s.String(),
		"REFT_JOB_ID=" + j,
		"REFT_STEP_ID=" + stepName(uint32(step)),
		"REFT_RESTART_COUNT=" + strconv.Itoa(int(restart)),
		"REFT_NODE=" + n,
		"REFT_VERSION=" + version.Version,
	}
	if err := putList(out, outlen, env); err != nil {
		return fail("%v", err)
	}
	return 1
}

// answers reports whether an agent answers hello on sock within d.
func answers(sock string, d time.Duration) bool {
	_, err := hello(sock, d)
	return err == nil
}

func hello(sock string, d time.Duration) (proto.HelloReply, error) {
	var hr proto.HelloReply
	c, err := net.DialTimeout("unix", sock, d)
	if err != nil {
		return hr, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(d))
	err = proto.Call(c, proto.THello, 1, proto.Hello{Client: "reft-spank/" + version.Version, PID: os.Getpid()}, &hr)
	return hr, err
}

// waitAgent waits until the agent answers hello, or reports why it did not.
func waitAgent(sock, errFile string, timeout time.Duration) (proto.HelloReply, error) {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		hr, err := hello(sock, time.Second)
		if err == nil {
			return hr, nil
		}
		var pe *proto.Error
		if errors.As(err, &pe) {
			return hr, fmt.Errorf("the reft agent refused this step: %v", pe)
		}
		last = err
		if b, rerr := os.ReadFile(errFile); rerr == nil && len(b) > 0 {
			return hr, fmt.Errorf("the reft agent failed to start: %s", strings.TrimSpace(string(b)))
		}
		if time.Now().After(deadline) {
			return hr, fmt.Errorf("the reft agent did not answer on %s within %s (agent.start_timeout): %v", sock, timeout, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// reft_go_extern_exit runs when the extern step ends (root): it stops the
// job's agent on this node and removes its socket, run directory and marker.
// Returns 0, or -1 with a message to log.
//
//export reft_go_extern_exit
func reft_go_extern_exit(cfgPath, stateDir *C.char, job, uid C.uint32_t, errb *C.char, errlen C.int) (rc C.int) {
	defer guard(errb, errlen, &rc)
	cfg, err := config.Load(C.GoString(cfgPath), false)
	if err != nil {
		put(errb, errlen, err.Error())
		return -1
	}
	if err := externExit(cfg, C.GoString(stateDir), strconv.FormatUint(uint64(job), 10), uint32(uid), jobGoesOnHere); err != nil {
		put(errb, errlen, err.Error())
		return -1
	}
	return 0
}

// externExit is reft_go_extern_exit's work; goesOn is jobGoesOnHere (a
// parameter for the tests).
func externExit(cfg config.Config, stateDir, j string, uid uint32, goesOn func(config.Config, string) bool) error {
	var msgs []string
	if err := stopAgent(runpath.SocketPath(cfg.Agent.RunDir, j), j, uid, 3*time.Second); err != nil {
		msgs = append(msgs, err.Error())
	}
	rd, err := rootfs.OpenRootDir(cfg.Agent.RunDir, false, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			err = nil
		} else {
			msgs = append(msgs, fmt.Sprintf("agent.run_dir: %v", err))
		}
	}
	// The extern step also ends when a --no-kill job shrinks, and the job
	// goes on: the agent is stopped all the same (the survivors' agents
	// restart on the new allocation, which sets their peer ports), but the
	// directory stays for the agent a step starts (maybe starting now,
	// waiting for the old one's lock).
	taken := false
	if rd != nil {
		defer rd.Close()
		var terr error
		if taken, terr = takenOver(rd, j, uid); terr != nil {
			msgs = append(msgs, terr.Error())
		}
	}
	if !taken && !goesOn(cfg, j) {
		if rd != nil {
			if err := rd.RemoveUserDir(j, uid, runpath.RunDirFiles); err != nil {
				msgs = append(msgs, err.Error())
			}
		}
		if sd, err := rootfs.OpenRootDir(stateDir, false, 0); err == nil {
			if err := sd.Remove(markerName(j)); err != nil {
				msgs = append(msgs, err.Error())
			}
			sd.Close()
		} else if !errors.Is(err, os.ErrNotExist) {
			msgs = append(msgs, fmt.Sprintf("plugin state directory: %v", err))
		}
	}
	if len(msgs) > 0 {
		return errors.New(strings.Join(msgs, "; "))
	}
	return nil
}

// reft_go_step_end runs in slurmstepd (root) as a reft step ends on this
// node after one of its tasks failed, before slurmstepd reports the step
// complete: if the agents find a node of the step lost, the report waits
// until that node has left the job, so that slurmctld ends the step
// (spank/stepend says why). Returns 0 (no hold), 1 (held: out says how
// long and why) or -1 with a message.
//
//export reft_go_step_end
func reft_go_step_end(cfgPath *C.char, job, step C.uint32_t, out *C.char, outlen C.int, errb *C.char, errlen C.int) (rc C.int) {
	defer guard(errb, errlen, &rc)
	cfg, err := config.Load(C.GoString(cfgPath), false)
	if err != nil {
		put(errb, errlen, err.Error())
		return -1
	}
	if !cfg.Detect.Enabled {
		return 0 // no verdicts to wait for
	}
	j := strconv.FormatUint(uint64(job), 10)
	sl := slurmjob.Slurm{Job: j, Conf: cfg.Agent.SlurmConf}
	if _, err := exec.LookPath("scontrol"); err != nil {
		sl.Scontrol = "/usr/bin/scontrol"
	}
	h := stepend.Hold{
		Verdict:  cfg.Detect.Timeout.D() + cfg.Detect.Confirm.D() + 500*time.Millisecond,
		Settle:   stepEndSettle,
		Max:      stepEndMax,
		Lost:     stepLostNodes,
		JobNodes: sl.JobNodes,
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.Verdict+h.Max+5*time.Second)
	defer cancel()
	if h.StepNodes, err = sl.StepNodes(ctx, stepName(uint32(step))); err != nil {
		put(errb, errlen, fmt.Sprintf("step %s.%s: %v", j, stepName(uint32(step)), err))
		return -1
	}
	r := h.Run(ctx)
	if len(r.Lost) == 0 {
		return 0
	}
	put(out, outlen, r.String())
	return 1
}

// stepEndMax bounds a step-end hold: reft run gives a lost node back
// within about a second of the agents' verdict. stepEndSettle is how long
// after the first verdict others still join it, as in reft run
// (launcher/run's verdictSettle).
const (
	stepEndMax    = 15 * time.Second
	stepEndSettle = 2 * time.Second
)

// stepConn is this slurmstepd's connection to the job's agent, opened in
// user_init as the job's user: the agent answers only that uid (root gets
// no exception, docs/PROTOCOL.md), and the step-end hold runs as root.
var stepConn struct {
	sync.Mutex
	c  net.Conn
	id uint32
}

func keepStepConn(sock string) {
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err != nil {
		return // no hold at the step's end, nothing else lost
	}
	stepConn.Lock()
	stepConn.c = c
	stepConn.Unlock()
}

// stepLostNodes asks the agent, on stepConn, for the nodes its failure
// detector published lost.
func stepLostNodes(ctx context.Context) ([]string, error) {
	stepConn.Lock()
	defer stepConn.Unlock()
	if stepConn.c == nil {
		return nil, errors.New("no connection to the job's agent from this step")
	}
	stepConn.id++
	stepConn.c.SetDeadline(time.Now().Add(2 * time.Second))
	var st proto.Status
	if err := proto.Call(stepConn.c, proto.TStatus, stepConn.id, nil, &st); err != nil {
		stepConn.c.Close()
		stepConn.c = nil
		return nil, err
	}
	return st.LostNodes, nil
}

// jobGoesOnHere reports whether slurmctld still runs the job on this node
// (RUNNING or RESIZING, this node in its NodeList). Any doubt (scontrol
// missing or failing) says no: the job's files are removed as at its end.
func jobGoesOnHere(cfg config.Config, job string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	sl := slurmjob.Slurm{Job: job, Conf: cfg.Agent.SlurmConf}
	if _, err := exec.LookPath("scontrol"); err != nil {
		sl.Scontrol = "/usr/bin/scontrol"
	}
	state, gone, err := sl.JobState(ctx)
	if err != nil || gone || (state != "RUNNING" && state != "RESIZING") {
		return false
	}
	topo, err := sl.Topology(ctx)
	if err != nil {
		return false
	}
	node := os.Getenv("SLURMD_NODENAME")
	if node == "" {
		node, _ = os.Hostname()
	}
	_, ok := topo.Node(node)
	return ok
}

// takenOver reports whether a live agent holds the job's lock (after the
// one that served the socket was stopped). The lock is the user's file in
// the user's directory: it is opened through the verified run directory,
// never following a symlink, without blocking on a FIFO, and used only if
// fstat says it is a regular file of the job's uid.
func takenOver(rd *rootfs.Dir, job string, uid uint32) (bool, error) {
	u, err := rd.OpenUserDir(job, uid)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer u.Close()
	f, err := u.OpenUserFile(runpath.LockName, uid)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return errors.Is(err, unix.EWOULDBLOCK), nil
	}
	unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return false, nil
}

// stopAgent stops the process that listens on the job's socket, if it runs
// as the job's uid: SIGTERM, then SIGKILL after grace. It signals through a
// pidfd, opened once the pid is known and checked (uid, and a start before
// the connection that found it) while the pidfd pins the process, so no
// later process that reuses the pid is ever signalled.
func stopAgent(sock, job string, uid uint32, grace time.Duration) error {
	before := bootTicks()
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err != nil {
		return nil // no agent listens
	}
	cred, err := runpath.PeerCred(c.(*net.UnixConn))
	c.Close()
	if err != nil {
		return fmt.Errorf("job %s: SO_PEERCRED on %s: %w", job, sock, err)
	}
	if cred.Uid != uid {
		return fmt.Errorf("socket of job %s is held by uid %d, not the job's uid %d: not signalled", job, cred.Uid, uid)
	}
	return stopPID(int(cred.Pid), uid, before, grace)
}

// stopPID signals pid through a pidfd if it runs as uid and started no
// later than notAfter (clock ticks since boot, as /proc/PID/stat counts).
func stopPID(pid int, uid uint32, notAfter uint64, grace time.Duration) error {
	pfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil // gone
		}
		return fmt.Errorf("pidfd_open(%d): %w", pid, err)
	}
	defer unix.Close(pfd)
	puid, start, err := procIdentity(pid)
	// still alive through the pidfd: what /proc said was about its process
	if serr := unix.PidfdSendSignal(pfd, 0, nil, 0); serr != nil {
		return nil
	}
	if err != nil {
		return fmt.Errorf("agent pid %d: %w: not signalled", pid, err)
	}
	if puid != uid || start > notAfter {
		return fmt.Errorf("pid %d is not the job's agent any more (uid %d, started at tick %d, after tick %d): not signalled",
			pid, puid, start, notAfter)
	}
	if err := unix.PidfdSendSignal(pfd, unix.SIGTERM, nil, 0); err != nil {
		return nil // exited meanwhile
	}
	if exited(pfd, grace) {
		return nil
	}
	if err := unix.PidfdSendSignal(pfd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("SIGKILL agent %d: %w", pid, err)
	}
	return nil
}

// exited waits up to d for the pidfd's process to exit.
func exited(pfd int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		fds := []unix.PollFd{{Fd: int32(pfd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(left/time.Millisecond)+1)
		if err == nil && n > 0 {
			return true
		}
		if err != nil && !errors.Is(err, unix.EINTR) {
			return false
		}
	}
}

// procIdentity reads a process's real and effective uid (they must agree)
// and its start time in clock ticks since boot.
func procIdentity(pid int) (uid uint32, start uint64, err error) {
	p := "/proc/" + strconv.Itoa(pid)
	st, err := os.ReadFile(p + "/stat")
	if err != nil {
		return 0, 0, err
	}
	s := string(st)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("%s/stat: no command field", p)
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state); start time is field 22
	if len(f) < 20 {
		return 0, 0, fmt.Errorf("%s/stat: %d fields", p, len(f)+2)
	}
	if start, err = strconv.ParseUint(f[19], 10, 64); err != nil {
		return 0, 0, fmt.Errorf("%s/stat: start time: %w", p, err)
	}
	status, err := os.ReadFile(p + "/status")
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if ids, ok := strings.CutPrefix(line, "Uid:"); ok {
			u := strings.Fields(ids)
			if len(u) < 2 || u[0] != u[1] {
				return 0, 0, fmt.Errorf("%s/status: real and effective uid differ: %q", p, ids)
			}
			v, err := strconv.ParseUint(u[0], 10, 32)
			return uint32(v), start, err
		}
	}
	return 0, 0, fmt.Errorf("%s/status: no Uid line", p)
}

// bootTicks is the time since boot in the clock ticks of /proc/PID/stat
// (USER_HZ, 100 on Linux).
func bootTicks() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return ^uint64(0) // no check possible: any start time passes
	}
	return uint64(ts.Sec)*100 + uint64(ts.Nsec)/10_000_000
}
