package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/agent/detect"
	"github.com/reft-hpc/reft/agent/event"
	"github.com/reft-hpc/reft/agent/logging"
	"github.com/reft-hpc/reft/agent/mesh"
	"github.com/reft-hpc/reft/agent/metrics"
	"github.com/reft-hpc/reft/agent/persist"
	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/agent/runpath"
	"github.com/reft-hpc/reft/agent/runrecord"
	"github.com/reft-hpc/reft/hostmem"
	"github.com/reft-hpc/reft/spank/spec"
	"github.com/reft-hpc/reft/tmpfs"
)

// MinMemoryBudget is the least snapshot memory an agent starts with.
const MinMemoryBudget = 1 << 20

// File names inside the job's run directory (<run_dir>/<jobid>/).
const (
	SocketName = runpath.SocketName
	LockName   = runpath.LockName  // flock held by the live agent; holds its pid
	ErrorName  = runpath.ErrorName // one line: why the agent could not start
)

// Options are the agent's command line.
type Options struct {
	ConfigPath string
	Job        string
	Node       string
	Spec       string
	UID        int // the job's uid: the agent must run as it
	Restart    int
	StartedBy  string // "extern" or "step <id>": for the log
	Version    string
	// GPU starts the GPU health monitor (gpuhealth.StatusFunc in
	// reft-agent) and returns the status reply's gpu section; nil: none.
	// It is injected so that this package, which the SPANK plugin links,
	// never links NVML.
	GPU func(ctx context.Context, enabled bool, log zerolog.Logger) func() *proto.GPU
}

// jobWatchInterval is how often the agent asks slurmctld whether its job
// still runs (watchJob).
const jobWatchInterval = 15 * time.Second

// ErrAlreadyRunning means another agent holds the job's lock on this node.
var ErrAlreadyRunning = errors.New("another agent already serves this job on this node")

// StoreDir is the job's snapshot store directory (tmpfs.JobPath).
func StoreDir(c config.Config, uid int, job string) string {
	return tmpfs.JobPath(c.Store.TmpfsRoot, uid, job)
}

// UserStoreDir is the user's directory under the store root, which the
// plugin creates as root and hands to the user (mode 0700); the agent makes
// the job's directory inside it.
func UserStoreDir(c config.Config, uid int) string { return filepath.Dir(StoreDir(c, uid, "0")) }

// Run starts the agent and serves until ctx is done, the job's run directory
// or socket disappears, or a fatal error. A start-up failure is also written
// to <run_dir>/<jobid>/agent.error, where the steps of the job find it and
// show it on the user's stderr.
func Run(ctx context.Context, o Options) error {
	cfg, jobDir, err := o.check()
	if err != nil {
		return o.startFailed(jobDir, err)
	}
	lock, err := takeLockWait(filepath.Join(jobDir, LockName), filepath.Join(jobDir, SocketName), cfg.Agent.StartTimeout.D())
	if err != nil {
		if errors.Is(err, ErrAlreadyRunning) {
			return err
		}
		return o.startFailed(jobDir, err)
	}
	defer lock.Close()
	_ = os.Remove(filepath.Join(jobDir, ErrorName))

	logger, closer, err := logging.Open(logging.Options{Dir: cfg.Log.Dir, Level: cfg.Log.Level, Console: os.Stderr},
		logging.Fields{Job: o.Job, Step: "agent", Node: o.Node, Restart: o.Restart})
	if err != nil {
		return o.startFailed(jobDir, err)
	}
	defer closer.Close()

	budget, storeDir, err := checkStore(cfg, o.UID, o.Job)
	if err != nil {
		logger.Error().Err(err).Msg("agent cannot start")
		return o.startFailed(jobDir, err)
	}
	s, err := spec.Parse(o.Spec)
	if err != nil { // checked in o.check; keeps s in scope
		return o.startFailed(jobDir, err)
	}
	if err := checkPersistDir(cfg, s); err != nil {
		logger.Error().Err(err).Msg("agent cannot start")
		return o.startFailed(jobDir, err)
	}

	rec, recFile, err := openRunRecord(cfg.Log.Dir, o.Job, o.Node, o.UID)
	if err != nil {
		logger.Error().Err(err).Msg("agent cannot start")
		return o.startFailed(jobDir, err)
	}
	defer recFile.Close()

	sock := filepath.Join(jobDir, SocketName)
	srv, err := Listen(sock, Info{Job: o.Job, Node: o.Node, Spec: s.String(), Version: o.Version,
		Restart: o.Restart, UID: o.UID, MemoryBudget: budget, StoreDir: storeDir}, logger)
	if err != nil {
		logger.Error().Err(err).Msg("agent cannot start")
		return o.startFailed(jobDir, err)
	}
	metricsKick := kickOnFailure(srv)
	carryKick := kickOnFailure(srv)
	srv.AttachRecord(rec)
	var store *tmpfs.Store
	if s.Enabled() {
		pdir, why := persistDir(cfg, s)
		if store, err = openStore(cfg, o.Job, budget, pdir != "", logger); err != nil {
			logger.Error().Err(err).Msg("agent cannot start")
			srv.Close()
			return o.startFailed(jobDir, err)
		}
		defer store.Close()
		srv.AttachStore(store)
		srv.AttachTopology(cfg.Topology)
		peers := startPeering(ctx, cfg, o, store, srv, logger) // in the background: start-up does not wait
		defer peers.Close()                                    // before store.Close: it serves the store
		if pdir == "" {
			logger.Info().Str("event", "persist_off").Msg("persistent checkpoints off: " + why)
		} else {
			per, err := persist.New(persist.Options{Dir: pdir, Job: o.Job, Node: o.Node, UID: o.UID, Policy: s.Persist,
				Restart:            o.Restart,
				FailuresPerNodeDay: cfg.Persist.FailuresPerNodeDay, Store: store, Log: logger})
			if err != nil {
				logger.Error().Err(err).Msg("agent cannot start")
				srv.Close()
				return o.startFailed(jobDir, fmt.Errorf("%w (%s)", err, why))
			}
			defer per.Close() // before store.Close: it reads the store's arenas
			srv.AttachPersist(per)
		}
	}
	sayJITOnly(logger, s)
	logger.Info().Str("event", event.AgentStarted).Str("spec", s.String()).Str("socket", sock).
		Uint64("memory_budget", budget).Str("store_dir", storeDir).Str("started_by", o.StartedBy).
		Int("pid", os.Getpid()).Msg("agent started")

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if o.GPU != nil {
		srv.AttachGPU(o.GPU(ctx, cfg.Agent.GPUHealth, logger)) // in the background: start-up does not wait
	}
	carryDone := carryMetrics(ctx, jobDir, o.Job, o.Node, srv.met, carryKick, logger)
	metricsDone := startMetrics(ctx, cfg.Metrics.TextfileDir, o.Job, o.Node, srv, metricsKick, logger)
	go watchSocket(ctx, cancel, sock, logger)
	go watchJob(ctx, cancel, mesh.Slurm{Job: o.Job, Conf: cfg.Agent.SlurmConf}, jobWatchInterval, logger)
	// In the background: the steps wait for this agent's hello. Its own
	// store is open and locked by now.
	gcDone := make(chan struct{})
	go func() {
		defer close(gcDone)
		collectOnStart(ctx, cfg.Store.TmpfsRoot, cfg.Store.HugeTLBFS, o.UID, o.Job, time.Duration(cfg.Store.MaxAge), logger)
	}()
	err = srv.Serve(ctx)
	srv.Close()
	cancel()
	<-gcDone      // it logs; the log closes when Run returns
	<-metricsDone // its file removed
	<-carryDone   // the counts left for the job's next agent here
	logger.Info().Str("event", "agent_stopped").Msg("agent stopped")
	return err
}

// sayJITOnly logs, under every=0, that the ranks keep no snapshot on the
// step path. Nothing else changes in the agent: the JIT flushes'
// generations are stored, copied and persisted like any other.
func sayJITOnly(logger zerolog.Logger, s spec.Spec) {
	if s.JITOnly() {
		logger.Info().Str("event", "snapshots_jit_only").Msg("every=0: the ranks keep no snapshot on the step path (their saves are progress heartbeats); " +
			"the only generations are their JIT flushes at a failure")
	}
}

// openRunRecord opens the job's run record (agent/runrecord), reft run's
// channel, beside the agent's log in the job's log directory, with the
// same checks (a private directory of uid, no links followed). The caller
// closes the file after the server's last write.
func openRunRecord(logDir, job, node string, uid int) (*runrecord.Writer, *os.File, error) {
	d, err := logging.JobDir(logDir, job, uid)
	if err != nil {
		return nil, nil, fmt.Errorf("the job's run record: %w", err)
	}
	defer d.Close()
	f, err := logging.OpenIn(d, runrecord.FileName(node), os.O_WRONLY|os.O_CREATE|os.O_APPEND, uid)
	if err != nil {
		return nil, nil, fmt.Errorf("the job's run record: %w", err)
	}
	return runrecord.NewWriter(f, node, nil), f, nil
}

func (o Options) check() (config.Config, string, error) {
	if os.Getuid() == 0 || os.Geteuid() == 0 {
		return config.Config{}, "", errors.New("reft-agent refuses to run as root; the plugin starts it as the job's user")
	}
	if o.UID != os.Getuid() {
		return config.Config{}, "", fmt.Errorf("reft-agent runs as uid %d but the job belongs to uid %d", os.Getuid(), o.UID)
	}
	if o.Job == "" || o.Node == "" {
		return config.Config{}, "", errors.New("--job and --node are required")
	}
	cfg, err := config.Load(o.ConfigPath, false)
	if err != nil {
		return config.Config{}, "", err
	}
	jobDir := JobRunDir(cfg.Agent.RunDir, o.Job)
	if _, err := spec.Parse(o.Spec); err != nil {
		return cfg, jobDir, err
	}
	if err := os.Mkdir(jobDir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return cfg, jobDir, fmt.Errorf("creating %s: %w (agent.run_dir must be node-local; the plugin creates it as root)", jobDir, err)
	}
	st, err := os.Stat(jobDir)
	if err != nil {
		return cfg, jobDir, fmt.Errorf("run directory %s: %w", jobDir, err)
	}
	if sys, ok := st.Sys().(*unix.Stat_t); ok && int(sys.Uid) != o.UID {
		return cfg, jobDir, fmt.Errorf("run directory %s is owned by uid %d, not the job's uid %d", jobDir, sys.Uid, o.UID)
	}
	if st.Mode().Perm() != 0o700 {
		if err := os.Chmod(jobDir, 0o700); err != nil {
			return cfg, jobDir, fmt.Errorf("chmod 0700 %s: %w", jobDir, err)
		}
	}
	return cfg, jobDir, nil
}

// startFailed records err where the steps find it and returns it.
func (o Options) startFailed(jobDir string, err error) error {
	if jobDir != "" {
		msg := strings.ReplaceAll(err.Error(), "\n", " ")
		_ = os.WriteFile(filepath.Join(jobDir, ErrorName), []byte(msg+"\n"), 0o600)
	}
	return err
}

// takeLockWait takes the job's lock like takeLock, but while the holder
// serves no socket it waits, up to wait: an agent that is stopping (its
// socket closed, its peers and store still closing) holds the lock for
// moments more, and a step's new agent started then must take over, not
// leave the node without one. While the holder answers on sock (a live
// agent, or the one another step started a moment before) it is
// ErrAlreadyRunning at once.
func takeLockWait(path, sock string, wait time.Duration) (*os.File, error) {
	deadline := time.Now().Add(wait)
	for {
		f, err := takeLock(path)
		if !errors.Is(err, ErrAlreadyRunning) || time.Now().After(deadline) {
			return f, err
		}
		if c, derr := net.DialTimeout("unix", sock, 200*time.Millisecond); derr == nil {
			c.Close()
			return nil, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// takeLock makes sure that one agent serves a job on a node.
func takeLock(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, ErrAlreadyRunning
		}
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return f, nil
}

// openStore opens the job's node-local snapshot store under the memory
// budget; arenas are pinned when RLIMIT_MEMLOCK allows (hostmem says once
// when it does not).
func openStore(cfg config.Config, job string, budget uint64, persisting bool, log zerolog.Logger) (*tmpfs.Store, error) {
	m := new(hostmem.Metrics)
	// The snapshots are charged to the job's cgroup (the agent touches
	// every arena page): its memory limit caps the budget too.
	jobLimit, err := hostmem.CgroupMemoryLimit("/proc/self/cgroup", "/sys/fs/cgroup")
	if err != nil {
		log.Warn().Err(err).Str("event", "job_memory_limit_unknown").
			Msg("cannot read the job's memory limit (its cgroup); the snapshot budget is memory_budget alone")
	}
	b, err := hostmem.NewBudget(hostmem.BudgetConfig{Cap: hostmem.Cap{Bytes: int64(budget)}, Job: jobLimit}, m)
	if err != nil {
		return nil, fmt.Errorf("memory budget: %w", err)
	}
	log.Info().Str("event", "memory_budget").Int64("bytes", b.Limit()).Str("set_by", b.LimitFrom()).
		Msgf("snapshot memory budget on this node: %s, set by %s", hostmem.FormatBytes(b.Limit()), b.LimitFrom())
	// No GPU registrar here: the agent never copies to or from a device.
	// The rank does, so the client registers its own mappings of the
	// arenas (hostmem/cuda); registration is per process and per mapping.
	alloc, err := hostmem.NewAllocator(hostmem.Config{Budget: b, HugeTLBDir: cfg.Store.HugeTLBFS, Log: log, Metrics: m})
	if err != nil {
		return nil, err
	}
	// The persistent writer pins a generation for longer than a few saves:
	// one spare arena per rank keeps saves from allocating meanwhile.
	spare := 0
	if persisting {
		spare = 1
	}
	st, err := tmpfs.Open(tmpfs.Options{Root: cfg.Store.TmpfsRoot, JobID: job, Keep: storeKeep(cfg), Spare: spare, Alloc: alloc, Log: log})
	if err != nil {
		return nil, fmt.Errorf("snapshot store: %w (store.tmpfs_root in reft.toml must be a tmpfs the job's user can use)", err)
	}
	return st, nil
}

// alwaysKept is how many older completed generations the agent keeps
// whatever store.keep says. Ranks commit asynchronously: a rank waits for
// step k's commit only in save(k+1), after step k+1's collectives, so when
// a rank's commit of k fails (its agent or node is lost), the others have
// passed step k+1's collectives with it and go on to commit k+1: they hold
// k+1 while it holds only k-1. k-1 must still be there on every node for
// the job-wide choice (with one kept, a killed agent on the test cluster
// left ranks at {9,10} and {11,12}: no common step, and the relaunch
// started over).
const alwaysKept = 2

// storeKeep is the store's Keep: the generation always kept, plus
// store.keep older ones the site asked for.
func storeKeep(cfg config.Config) int { return alwaysKept + cfg.Store.Keep }

// checkStore resolves the memory budget and checks the job's store directory.
func checkStore(cfg config.Config, uid int, job string) (uint64, string, error) {
	memTotal, err := config.MemTotal()
	if err != nil {
		return 0, "", err
	}
	budget := cfg.Store.MemoryBudget.Resolve(memTotal)
	if budget < MinMemoryBudget {
		return 0, "", fmt.Errorf("no memory budget: store.memory_budget = %s gives %d bytes, below the minimum of %d (raise it in reft.toml)",
			cfg.Store.MemoryBudget, budget, MinMemoryBudget)
	}
	dir := StoreDir(cfg, uid, job)
	var fs unix.Statfs_t
	if err := unix.Statfs(cfg.Store.TmpfsRoot, &fs); err != nil {
		return 0, "", fmt.Errorf("statfs %s: %w", dir, err)
	}
	if free := fs.Bavail * uint64(fs.Bsize); free < MinMemoryBudget {
		return 0, "", fmt.Errorf("no memory budget: %s has %d bytes free, below the minimum of %d", dir, free, MinMemoryBudget)
	}
	return budget, dir, nil
}

// persistDir is the job's persistent checkpoint directory and where it
// comes from; "" and the reason when persistent checkpoints are off.
func persistDir(cfg config.Config, s spec.Spec) (dir, why string) {
	switch {
	case s.Persist.Kind == spec.PersistOff:
		return "", "persist=off in --reft"
	case s.PersistDir != "":
		return s.PersistDir, "persist_dir= in --reft"
	case cfg.Persist.Dir != "":
		return cfg.Persist.Dir, "persist.dir in reft.toml"
	}
	return "", "no persist_dir= in --reft and no [persist] dir in reft.toml"
}

// checkPersistDir checks the persistent checkpoint directory, when one is set.
func checkPersistDir(cfg config.Config, s spec.Spec) error {
	dir, key := persistDir(cfg, s)
	if dir == "" {
		return nil
	}
	st, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("persistent checkpoint directory %s (%s): %w", dir, key, err)
	}
	if !st.IsDir() {
		return fmt.Errorf("persistent checkpoint directory %s (%s) is not a directory", dir, key)
	}
	if err := unix.Access(dir, unix.W_OK|unix.X_OK); err != nil {
		return fmt.Errorf("persistent checkpoint directory %s (%s) is not writable by uid %d", dir, key, os.Getuid())
	}
	return nil
}

// watchSocket stops the agent when its socket is removed or replaced: the
// plugin removes the job's run directory when the job ends, and the agent
// must not outlive it even if its signal was lost.
func watchSocket(ctx context.Context, stop context.CancelFunc, path string, log zerolog.Logger) {
	var first unix.Stat_t
	if err := unix.Stat(path, &first); err != nil {
		return
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil || st.Ino != first.Ino {
			log.Info().Str("event", "socket_gone").Msg("socket removed; the job has ended on this node")
			stop()
			return
		}
	}
}

// startMetrics writes the job's metrics textfile into dir (metrics.
// textfile_dir) every metrics.Every and at every receive from kick until
// ctx ends, then removes it; the returned channel closes once it has. Without a dir it does nothing; a
// dir it cannot use is logged, and the agent runs without metrics.
func startMetrics(ctx context.Context, dir, job, node string, srv *Server, kick <-chan struct{}, log zerolog.Logger) <-chan struct{} {
	done := make(chan struct{})
	if dir == "" {
		close(done)
		return done
	}
	tf, err := metrics.OpenTextfile(dir, job, node)
	if err != nil {
		log.Error().Err(err).Msg("metrics off: the textfile directory is not usable")
		close(done)
		return done
	}
	log.Info().Str("file", tf.Path()).Dur("every", metrics.Every).Msg("metrics textfile on")
	go func() {
		defer close(done)
		metrics.RunKicked(ctx, tf, srv.Status, metrics.Every, kick, log)
	}()
	return done
}

// carryMetrics carries the job's metrics counters over its agents on this
// node (metrics.CarryName in the job's run directory jobDir): it adds what
// the previous agent left to met before returning, then saves met's
// counts at every receive from kick (a failure verdict: reft run may stop
// this agent soon after) and once more when ctx ends; the returned channel
// closes after that last save. A carry it cannot read or write is logged,
// and the counters then start from zero or are not carried on.
func carryMetrics(ctx context.Context, jobDir, job, node string, met *metrics.Recorder, kick <-chan struct{}, log zerolog.Logger) <-chan struct{} {
	done := make(chan struct{})
	fd, err := unix.Open(jobDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		log.Warn().Err(err).Msg("metrics counters not carried across this job's agents on this node: its run directory did not open")
		close(done)
		return done
	}
	dir := os.NewFile(uintptr(fd), jobDir)
	prev, err := metrics.ReadCarry(dir, job, node)
	if err == nil {
		err = met.Carry(prev)
	}
	switch {
	case err != nil:
		log.Warn().Err(err).Msg("the previous agent's metrics counters are not carried: this agent's start from zero (Prometheus sees a counter reset)")
	case prev != nil:
		log.Info().Str("event", "metrics_carried").Msg("metrics counters carried on from this job's previous agent on this node")
	}
	go func() {
		defer close(done)
		defer dir.Close()
		failing := false
		save := func() {
			err := met.SaveCarry(dir, job, node)
			if err != nil && !failing {
				log.Warn().Err(err).Msg("metrics counters not saved for this job's next agent on this node (not said again until a save works)")
			}
			failing = err != nil
		}
		for {
			select {
			case <-ctx.Done():
				save()
				return
			case <-kick:
				save()
			}
		}
	}()
	return done
}

// kickOnFailure is a channel that receives when the agent learns of a
// failure verdict: it goes into the metrics textfile at once, not at the
// next tick, since the agents of a job that shrinks after a node loss are
// stopped seconds later, and their files, with the failure counted, go
// with them. Call it before peering starts the detector.
func kickOnFailure(srv *Server) chan struct{} {
	kick := make(chan struct{}, 1)
	srv.notes.OnPeerFailure(func(detect.Failure) {
		select {
		case kick <- struct{}{}:
		default: // a write is already due
		}
	})
	return kick
}
