/*
 * spank_reft.so: the C half of the reft SPANK plugin.
 *
 * This file holds everything Slurm calls: the version stamp, the --reft
 * option (registered with spank_option_register in slurm_spank_init, so that
 * srun, sbatch, salloc and #SBATCH accept it), and trampolines into the Go
 * library libreft_spank.so, which sits next to this file and is loaded
 * lazily, only when a job asks for reft, with asynchronous signals blocked so
 * that no Go thread ever receives one (Slurm's handlers lack SA_ONSTACK).
 *
 * Go never runs in a forked child: slurm_spank_task_init runs in the task
 * after fork and is plain C here, and the agent is started with fork/exec
 * from C. Nothing here fails in slurmd context, and nothing depends on
 * dlclose. spank/README.md says which callback does what, where and why.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

SPANK_PLUGIN(reft, 1);

/* Node-local plugin state (one "<jobid>.spec" file per reft job). Fixed here
 * so that the shim can tell a reft job without loading Go or parsing TOML. */
#ifndef REFT_STATE_DIR
#define REFT_STATE_DIR "/dev/shm/.reft-spank"
#endif
#define GO_LIB_NAME "libreft_spank.so"

#define EXTERN_STEP 0xfffffffcU /* SLURM_EXTERN_CONT */
#define BATCH_STEP 0xfffffffbU  /* SLURM_BATCH_SCRIPT */

static char g_config[PATH_MAX] = "/etc/reft/reft.toml";
static char g_default[1024] = "off";
static char g_disabled[2048];  /* why the plugin refuses reft, or "" */
static char *g_opt;            /* last --reft value seen in this process */
static char g_task_error[4096]; /* printed by every task of the step */

static int reft_opt_cb(int val, const char *optarg, int remote);

static struct spank_option reft_option = {
	"reft", "SPEC",
	"Enable reft in-memory fault tolerance. SPEC is off, or modes arc, aec, "
	"aec:K (K>=1), aor joined by '+', then optional ,key=value: dp= pp= tp= "
	"every= persist=(steps|duration|auto|off) spares= persist_dir=. "
	"Example: --reft=arc+aec,dp=4",
	1, 0, reft_opt_cb
};

/* ---- the Go library ---------------------------------------------------- */

typedef int (*normalize_fn)(char *, char *, int, char *, int);
typedef int (*prolog_fn)(char *, char *, char *, uint32_t, char *, int);
typedef int (*extern_plan_fn)(char *, char *, uint32_t, uint32_t, char *, char *, int, char *, int);
typedef int (*step_fn)(char *, char *, char *, uint32_t, uint32_t, uint32_t, char *, int, int, char *, int, char *, int);
typedef int (*extern_exit_fn)(char *, char *, uint32_t, uint32_t, char *, int);
typedef int (*step_end_fn)(char *, uint32_t, uint32_t, char *, int, char *, int);

static struct {
	void *handle;
	normalize_fn normalize;
	prolog_fn prolog;
	extern_plan_fn extern_plan;
	step_fn step;
	extern_exit_fn extern_exit;
	step_end_fn step_end;
} go;

/* Block every asynchronous signal in the calling thread. Threads that Go
 * creates inherit this mask, and the Go runtime in a c-shared library never
 * unblocks them (only its synchronous and preemption signals), so Slurm's
 * SIGINT/SIGTERM/SIGCHLD/... handlers never run on a Go thread. */
static void block_async(sigset_t *old)
{
	sigset_t all;
	sigfillset(&all);
	sigdelset(&all, SIGSEGV);
	sigdelset(&all, SIGBUS);
	sigdelset(&all, SIGFPE);
	sigdelset(&all, SIGILL);
	sigdelset(&all, SIGTRAP);
	pthread_sigmask(SIG_BLOCK, &all, old);
}

static void restore_mask(const sigset_t *old)
{
	pthread_sigmask(SIG_SETMASK, old, NULL);
}

/* Calls into Go run with asynchronous signals blocked too: while a C thread
 * runs Go code it is on a Go stack, where a handler without SA_ONSTACK must
 * not run. Signals stay pending and are handled right after. */
#define CALL_GO(expr) ({ sigset_t _o; block_async(&_o); int _r = (expr); restore_mask(&_o); _r; })

static int load_go(char *err, size_t errlen)
{
	Dl_info info;
	char path[PATH_MAX], dir[PATH_MAX];
	sigset_t old;

	if (go.handle)
		return 0;
	if (!dladdr((void *) &load_go, &info) || !info.dli_fname) {
		snprintf(err, errlen, "cannot find the path of spank_reft.so");
		return -1;
	}
	snprintf(dir, sizeof(dir), "%s", info.dli_fname);
	snprintf(path, sizeof(path), "%s/%s", dirname(dir), GO_LIB_NAME);

	block_async(&old);
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	restore_mask(&old);
	if (!h) {
		snprintf(err, errlen, "cannot load %s: %s (install it next to spank_reft.so with `make install`)", path, dlerror());
		return -1;
	}
	go.normalize = (normalize_fn) dlsym(h, "reft_go_normalize");
	go.prolog = (prolog_fn) dlsym(h, "reft_go_prolog");
	go.extern_plan = (extern_plan_fn) dlsym(h, "reft_go_extern_plan");
	go.step = (step_fn) dlsym(h, "reft_go_step");
	go.extern_exit = (extern_exit_fn) dlsym(h, "reft_go_extern_exit");
	go.step_end = (step_end_fn) dlsym(h, "reft_go_step_end");
	if (!go.normalize || !go.prolog || !go.extern_plan || !go.step || !go.extern_exit || !go.step_end) {
		snprintf(err, errlen, "%s lacks a reft_go_* symbol: plugin and library are from different builds", path);
		return -1;
	}
	go.handle = h; /* never dlclosed: a Go runtime cannot be unloaded */
	return 0;
}

/* ---- helpers ----------------------------------------------------------- */

static const char *context_name(void)
{
	switch (spank_context()) {
	case S_CTX_LOCAL: return "local";
	case S_CTX_REMOTE: return "remote";
	case S_CTX_ALLOCATOR: return "allocator";
	case S_CTX_SLURMD: return "slurmd";
	case S_CTX_JOB_SCRIPT: return "job_script";
	default: return "unknown";
	}
}

static int is_off(const char *s)
{
	return s == NULL || strcmp(s, "off") == 0;
}

/* The SPEC that applies here: the option, else the plugstack default. */
static const char *effective_spec(void)
{
	return g_opt ? g_opt : g_default;
}

static void node_name(spank_t sp, char *buf, size_t len)
{
	const char *e;
	(void) sp;
	buf[0] = '\0';
	/* slurmstepd sets SLURMD_NODENAME in its own environment, and slurmd in
	 * the prolog's. Not the job's environment: in a batch job it carries
	 * the batch host's name to every node. */
	if ((e = getenv("SLURMD_NODENAME")) && *e) {
		snprintf(buf, len, "%s", e);
		return;
	}
	if (gethostname(buf, len) != 0)
		snprintf(buf, len, "unknown");
	buf[len - 1] = '\0';
	char *dot = strchr(buf, '.');
	if (dot)
		*dot = '\0';
}

static int restart_count(spank_t sp)
{
	char buf[32];
	if (spank_getenv(sp, "SLURM_RESTART_COUNT", buf, sizeof(buf)) == ESPANK_SUCCESS)
		return atoi(buf);
	return 0;
}

static void marker_path(uint32_t job, char *buf, size_t len)
{
	snprintf(buf, len, "%s/%u.spec", REFT_STATE_DIR, job);
}

static const char *reft_env_names[] = {
	"REFT_AGENT_SOCKET", "REFT_SPEC", "REFT_JOB_ID", "REFT_STEP_ID",
	"REFT_RESTART_COUNT", "REFT_NODE", "REFT_VERSION", NULL
};

/* ---- starting the agent ------------------------------------------------ */

/* mkdir -p with mode for missing parts; only async-signal-safe calls. */
static int mkdir_p(const char *path, mode_t mode)
{
	char buf[PATH_MAX];
	size_t n = strlen(path);
	if (n == 0 || n >= sizeof(buf))
		return -1;
	memcpy(buf, path, n + 1);
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(buf, mode) != 0 && errno != EEXIST)
			return -1;
		*p = '/';
	}
	if (mkdir(buf, mode) != 0 && errno != EEXIST)
		return -1;
	return 0;
}

static int user_dir(const char *path, uid_t uid, gid_t gid)
{
	struct stat st;
	if (mkdir(path, 0700) != 0 && errno != EEXIST)
		return -1;
	if (lstat(path, &st) != 0 || !S_ISDIR(st.st_mode))
		return -1;
	if (lchown(path, uid, gid) != 0 || chmod(path, 0700) != 0)
		return -1;
	return 0;
}

/*
 * Start the agent as uid:gid from a plan written by Go:
 *   run_dir, job run dir, tmpfs_root, store dir, binary, args..., "".
 * The child becomes root again if needed (user_init runs with only the
 * effective uid dropped), creates the directories, optionally writes the
 * job's marker, drops to the user for good, detaches (setsid, second fork),
 * and execs. Only async-signal-safe calls run between fork and exec: no Go.
 * Returns 0 once the intermediate child has exited, or -1.
 */
static int spawn_agent(const char *plan, uid_t uid, gid_t gid, const char *marker,
		       const char *spec, char *err, size_t errlen)
{
	const char *item[64];
	int n = 0;
	for (const char *p = plan; *p && n < 63; p += strlen(p) + 1)
		item[n++] = p;
	item[n] = NULL;
	if (n < 6) {
		snprintf(err, errlen, "internal: short agent plan (%d items)", n);
		return -1;
	}
	char *const *argv = (char *const *) &item[4];
	char *const envp[] = { "PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C", NULL };

	pid_t pid = fork();
	if (pid < 0) {
		snprintf(err, errlen, "fork: %s", strerror(errno));
		return -1;
	}
	if (pid == 0) {
		sigset_t none;
		sigemptyset(&none);
		for (int s = 1; s < NSIG; s++)
			if (s != SIGKILL && s != SIGSTOP)
				signal(s, SIG_DFL);
		sigprocmask(SIG_SETMASK, &none, NULL);
		if (geteuid() != 0 && seteuid(0) != 0)
			_exit(120);
		if (setegid(0) != 0)
			_exit(120);
		umask(022);
		if (mkdir_p(item[0], 0755) != 0 || user_dir(item[1], uid, gid) != 0)
			_exit(121);
		if (mkdir_p(item[2], 0755) != 0 || user_dir(item[3], uid, gid) != 0)
			_exit(122);
		if (marker) {
			if (mkdir_p(REFT_STATE_DIR, 0755) != 0)
				_exit(123);
			int fd = open(marker, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
			if (fd < 0)
				_exit(123);
			if (write(fd, spec, strlen(spec)) < 0 || write(fd, "\n", 1) < 0)
				_exit(123);
			close(fd);
		}
		setsid();
		if (setgroups(1, &gid) != 0 || setresgid(gid, gid, gid) != 0 ||
		    setresuid(uid, uid, uid) != 0 || getuid() != uid || geteuid() != uid)
			_exit(124);
		pid_t p2 = fork();
		if (p2 < 0)
			_exit(125);
		if (p2 > 0)
			_exit(0);
		if (chdir("/") != 0)
			_exit(126);
		int nul = open("/dev/null", O_RDWR);
		if (nul >= 0) {
			dup2(nul, 0);
			dup2(nul, 1);
			dup2(nul, 2);
		}
		for (int fd = 3; fd < 4096; fd++)
			close(fd);
		execve(argv[0], argv, envp);
		_exit(127);
	}
	int status = 0;
	while (waitpid(pid, &status, 0) < 0) {
		if (errno != EINTR) {
			snprintf(err, errlen, "waitpid: %s", strerror(errno));
			return -1;
		}
	}
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		static const char *why[] = {
			[120] = "cannot regain root to prepare directories",
			[121] = "cannot create agent.run_dir or the job's run directory",
			[122] = "cannot create store.tmpfs_root or the job's store directory",
			[123] = "cannot write the job marker in " REFT_STATE_DIR,
			[124] = "cannot switch to the job's user",
			[125] = "fork failed",
			[126] = "chdir / failed",
		};
		int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
		snprintf(err, errlen, "starting the reft agent %s failed: %s", argv[0],
			 (code >= 120 && code <= 126) ? why[code] : "killed by a signal");
		return -1;
	}
	return 0;
}

/* ---- SPANK callbacks --------------------------------------------------- */

/* Log a plugstack.conf problem where the administrator looks: slurmd's log
 * (slurmd, slurmstepd and the prolog write there). srun, sbatch and salloc
 * say it only to a user who asks for reft (reft_opt_cb), so that commands
 * without --reft print nothing new. */
static void log_disabled(void)
{
	int ctx = spank_context();
	if (ctx != S_CTX_LOCAL && ctx != S_CTX_ALLOCATOR)
		slurm_error("reft: %s; reft is disabled until it is fixed", g_disabled);
}

/* Parses the plugstack arguments, once per process. Slurm 22.05 calls no
 * slurm_spank_init in the prolog (job_script context): there
 * slurm_spank_job_prolog parses them. */
static void parse_args(int ac, char **av)
{
	static int parsed;
	if (parsed)
		return;
	parsed = 1;
	for (int i = 0; i < ac; i++) {
		if (strncmp(av[i], "config=", 7) == 0 && av[i][7] == '/') {
			snprintf(g_config, sizeof(g_config), "%s", av[i] + 7);
		} else if (strncmp(av[i], "default=", 8) == 0 && av[i][8] &&
			   strlen(av[i] + 8) < sizeof(g_default)) {
			snprintf(g_default, sizeof(g_default), "%s", av[i] + 8);
		} else if (!g_disabled[0]) {
			snprintf(g_disabled, sizeof(g_disabled),
				 "plugstack.conf argument \"%s\" is unknown or malformed "
				 "(valid: config=/ABSOLUTE/PATH, default=SPEC)", av[i]);
			log_disabled();
		}
	}
}

/*
 * default= is a SPEC, and only Go knows the grammar (spank/spec), so it is
 * checked where Go may load: in a step's slurmstepd at init, in the prolog,
 * and in srun/sbatch/salloc when the user asks for reft; never in slurmd,
 * which must not carry a Go runtime. A bad default disables reft like an
 * unknown argument: a job that asks for reft is refused with the reason, and
 * a job that gives no --reft runs without reft, as if default=off.
 * Call with Go loaded.
 */
static void check_default(void)
{
	static int checked;
	char canon[1024], err[1024] = "", prefix[1100];

	if (checked || g_disabled[0] || is_off(g_default))
		return;
	checked = 1;
	if (CALL_GO(go.normalize(g_default, canon, sizeof(canon), err, sizeof(err))) == 0)
		return;
	/* Go's message starts "--reft=SPEC: "; here the SPEC came from plugstack */
	const char *why = err;
	snprintf(prefix, sizeof(prefix), "--reft=%s: ", g_default);
	if (strncmp(err, prefix, strlen(prefix)) == 0)
		why = err + strlen(prefix);
	snprintf(g_disabled, sizeof(g_disabled), "plugstack.conf argument \"default=%.200s\" is invalid: %.1500s",
		 g_default, why);
	log_disabled();
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	char err[1024];

	parse_args(ac, av);
	/* The Slurm release whose headers built this plugin (SPANK_PLUGIN
	 * stamps it as plugin_version; Slurm loads only a plugin of its own
	 * release): logged once, by slurmd at its start. */
	if (spank_context() == S_CTX_SLURMD)
		slurm_info("reft: SPANK plugin built for Slurm %d.%02d.%d",
			   (int) SLURM_VERSION_MAJOR(SLURM_VERSION_NUMBER),
			   (int) SLURM_VERSION_MINOR(SLURM_VERSION_NUMBER),
			   (int) SLURM_VERSION_MICRO(SLURM_VERSION_NUMBER));
	/* A step's slurmstepd checks default= now, before the job's I/O is
	 * set up: from user_init on, an error would also reach the user's
	 * stderr, in jobs that never asked for reft. It loads Go for that
	 * only when default= is set, and then most steps use reft anyway.
	 * If Go cannot load, user_init reports it to a step that uses reft. */
	if (spank_context() == S_CTX_REMOTE && !g_disabled[0] && !is_off(g_default) &&
	    load_go(err, sizeof(err)) == 0)
		check_default();
	/* In job_script context spank_option_getopt only finds options that
	 * are not registered there; everywhere else, register, so that sbatch,
	 * salloc and #SBATCH accept --reft and slurmstepd receives it. */
	if (spank_context() != S_CTX_JOB_SCRIPT &&
	    spank_option_register(sp, &reft_option) != ESPANK_SUCCESS &&
	    spank_context() != S_CTX_SLURMD)
		slurm_error("reft: cannot register --reft in %s context", context_name());
	return 0;
}

/* Called for --reft on the command line, in #SBATCH lines, and again from
 * the environment that sbatch/salloc export (same value: fine; a different
 * value on an inner srun wins for that step). Locally it validates, so a bad
 * SPEC stops srun/sbatch/salloc before anything is submitted. Remotely it
 * only records the value; user_init acts on it. */
static int reft_opt_cb(int val, const char *optarg, int remote)
{
	(void) val;
	char err[1024] = "", canon[1024];
	if (!optarg)
		optarg = "";
	free(g_opt);
	g_opt = strdup(optarg);
	if (remote)
		return 0;
	if (g_disabled[0] && !is_off(optarg)) {
		slurm_error("--reft=%s: reft is disabled on this cluster: %s", optarg, g_disabled);
		return -1;
	}
	if (load_go(err, sizeof(err)) != 0) {
		slurm_error("--reft: %s", err);
		return -1;
	}
	if (!is_off(optarg)) {
		check_default();
		if (g_disabled[0]) {
			slurm_error("--reft=%s: reft is disabled on this cluster: %s", optarg, g_disabled);
			return -1;
		}
	}
	if (CALL_GO(go.normalize((char *) optarg, canon, sizeof(canon), err, sizeof(err))) != 0) {
		slurm_error("%s", err);
		return -1;
	}
	return 0;
}

/* Job prolog (slurmd runs it as root, once per node, before the extern
 * step): record a reft job's SPEC on this node. Never fails: a failing
 * prolog drains the node. */
int slurm_spank_job_prolog(spank_t sp, int ac, char **av)
{
	char *optarg = NULL, err[2048] = "";
	uint32_t job = 0;
	const char *s;

	parse_args(ac, av); /* no slurm_spank_init in this context */
	s = g_default;
	if (spank_option_getopt(sp, &reft_option, &optarg) == ESPANK_SUCCESS && optarg)
		s = optarg;
	if (is_off(s) || g_disabled[0])
		return 0;
	if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS)
		return 0;
	if (load_go(err, sizeof(err)) != 0) {
		slurm_error("reft: job %u: %s", job, err);
		return 0;
	}
	check_default();
	if (g_disabled[0])
		return 0; /* logged; the job's steps tell a user who asked for reft */
	if (CALL_GO(go.prolog(g_config, REFT_STATE_DIR, (char *) s, job, err, sizeof(err))) < 0)
		slurm_error("reft: job %u prolog: %s", job, err);
	return 0;
}

/* In the extern step (PrologFlags=Contain; lives as long as the
 * allocation), start the job's agent on this node if the prolog marked the
 * job. Runs as root in slurmstepd. */
int slurm_spank_task_post_fork(spank_t sp, int ac, char **av)
{
	(void) ac; (void) av;
	uint32_t job = 0, step = 0, uid = 0, gid = 0;
	char marker[PATH_MAX], node[256], err[2048] = "";
	static char plan[16384];

	if (!spank_remote(sp) || spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS || step != EXTERN_STEP)
		return 0;
	if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_GID, &gid) != ESPANK_SUCCESS)
		return 0;
	marker_path(job, marker, sizeof(marker));
	if (access(marker, F_OK) != 0)
		return 0; /* not a reft job: Go is never loaded */
	node_name(sp, node, sizeof(node));
	if (load_go(err, sizeof(err)) != 0) {
		slurm_error("reft: job %u: %s", job, err);
		return 0;
	}
	int rc = CALL_GO(go.extern_plan(g_config, REFT_STATE_DIR, job, uid, node, plan, sizeof(plan), err, sizeof(err)));
	if (rc < 0)
		slurm_error("reft: job %u: cannot plan the agent: %s", job, err);
	else if (rc == 1 && spawn_agent(plan, uid, gid, NULL, NULL, err, sizeof(err)) != 0)
		slurm_error("reft: job %u: %s", job, err);
	return 0;
}

/* user_init: slurmstepd of a step (and of the batch script), before the
 * tasks fork, effective uid = the user. Make sure the node's agent answers
 * (starting it if no extern step did) and set REFT_* for the tasks. Any
 * failure is stored and reported by task_init: Slurm does not relay an
 * error from user_init to srun. */
int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	(void) ac; (void) av;
	uint32_t job = 0, step = 0, uid = 0, gid = 0;
	char node[256], marker[PATH_MAX], canon[1024], err[4096] = "";
	static char out[16384];
	const char *s = effective_spec();

	g_task_error[0] = '\0';
	if (!spank_remote(sp))
		return 0;
	if (is_off(s)) {
		/* a batch-level reft must not leak into a step that turned it off */
		for (const char **e = reft_env_names; *e; e++)
			spank_unsetenv(sp, *e);
		return 0;
	}
	node_name(sp, node, sizeof(node));
	if (!g_disabled[0] && load_go(err, sizeof(err)) != 0) {
		snprintf(g_task_error, sizeof(g_task_error), "node %s: %s", node, err);
		return 0;
	}
	if (!g_disabled[0])
		check_default();
	if (g_disabled[0]) {
		if (!g_opt) {
			/* the step gave no --reft: run it without reft, as with
			 * default=off (the reason is in slurmd's log) */
			for (const char **e = reft_env_names; *e; e++)
				spank_unsetenv(sp, *e);
			return 0;
		}
		snprintf(g_task_error, sizeof(g_task_error), "node %s: reft is disabled on this node: %s", node, g_disabled);
		return 0;
	}
	if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_GID, &gid) != ESPANK_SUCCESS) {
		snprintf(g_task_error, sizeof(g_task_error), "node %s: cannot read the job's ids from Slurm", node);
		return 0;
	}
	int restart = restart_count(sp);
	int rc = CALL_GO(go.step(g_config, REFT_STATE_DIR, (char *) s, job, step, uid, node, restart, 0,
				 out, sizeof(out), err, sizeof(err)));
	if (rc == 2) {
		/* no agent and no extern step started one: this step starts it */
		marker_path(job, marker, sizeof(marker));
		if (CALL_GO(go.normalize((char *) s, canon, sizeof(canon), err, sizeof(err))) != 0 ||
		    spawn_agent(out, uid, gid, marker, canon, err, sizeof(err)) != 0) {
			snprintf(g_task_error, sizeof(g_task_error), "node %s: %s", node, err);
			return 0;
		}
		rc = CALL_GO(go.step(g_config, REFT_STATE_DIR, (char *) s, job, step, uid, node, restart, 1,
				     out, sizeof(out), err, sizeof(err)));
	}
	if (rc < 0) {
		snprintf(g_task_error, sizeof(g_task_error), "%s", err);
		return 0;
	}
	if (rc == 1) {
		for (const char *p = out; *p; p += strlen(p) + 1) {
			char kv[sizeof(out)];
			snprintf(kv, sizeof(kv), "%s", p);
			char *eq = strchr(kv, '=');
			if (!eq)
				continue;
			*eq = '\0';
			if (spank_setenv(sp, kv, eq + 1, 1) != ESPANK_SUCCESS)
				slurm_error("reft: cannot set %s for the tasks", kv);
		}
	}
	return 0;
}

/* task_init: in the task, after fork, before exec. Plain C, no Go. Fail the
 * task with the stored cause, on the user's stderr (already the task's). */
int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	(void) sp; (void) ac; (void) av;
	if (!g_task_error[0])
		return 0;
	dprintf(STDERR_FILENO, "reft: %s\n", g_task_error);
	/* Slurm ignores an error from an `optional` plugin, so end the task
	 * here (we are in the task's own process, before exec), as slurmstepd
	 * does when a required plugin fails. */
	_exit(1);
}

/* task_exit: slurmstepd, as each task of a step exits. Plain C: note
 * whether one failed (exit status not 0, or a signal). */
static int g_task_failed;

int slurm_spank_task_exit(spank_t sp, int ac, char **av)
{
	(void) ac; (void) av;
	int status = 0;
	if (spank_remote(sp) && spank_get_item(sp, S_TASK_EXIT_STATUS, &status) == ESPANK_SUCCESS && status != 0)
		g_task_failed = 1;
	return 0;
}

/* A reft step whose task failed on this node: before slurmstepd reports the
 * step complete, wait until a node of the step that the agents found lost
 * has left the job (reft_go_step_end; spank/stepend says why). */
static void hold_step_end(spank_t sp, uint32_t job, uint32_t step)
{
	char out[1024] = "", err[2048] = "", run[16];
	if (!g_task_failed || !go.handle || g_task_error[0] || g_disabled[0] || is_off(effective_spec()))
		return; /* a step that ran without reft never loaded Go */
	/* Only steps of reft run, which gives a lost node back at once: for a
	 * plain srun nobody removes the node within the hold's bound. */
	if (spank_getenv(sp, "REFT_RUN", run, sizeof(run)) != ESPANK_SUCCESS)
		return;
	int rc = CALL_GO(go.step_end(g_config, job, step, out, sizeof(out), err, sizeof(err)));
	if (rc < 0)
		slurm_error("reft: step %u.%u: %s", job, step, err);
	else if (rc == 1)
		slurm_info("reft: step %u.%u: %s", job, step, out);
}

/* exit: when a reft step whose task failed ends, hold_step_end; when the
 * extern step ends (the job ends on this node), stop the agent and remove
 * its socket, run directory and marker. */
int slurm_spank_exit(spank_t sp, int ac, char **av)
{
	(void) ac; (void) av;
	uint32_t job = 0, step = 0, uid = 0;
	char marker[PATH_MAX], err[2048] = "";

	if (spank_context() != S_CTX_REMOTE ||
	    spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS)
		return 0;
	if (step != EXTERN_STEP) {
		if (step != BATCH_STEP)
			hold_step_end(sp, job, step);
		return 0;
	}
	marker_path(job, marker, sizeof(marker));
	if (access(marker, F_OK) != 0)
		return 0;
	if (load_go(err, sizeof(err)) != 0) {
		slurm_error("reft: job %u: %s", job, err);
		unlink(marker);
		return 0;
	}
	if (CALL_GO(go.extern_exit(g_config, REFT_STATE_DIR, job, uid, err, sizeof(err))) != 0)
		slurm_error("reft: job %u cleanup: %s", job, err);
	return 0;
}
