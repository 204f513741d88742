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
 * Go never runs in a child forked after this process loaded it:
 * slurm_spank_task_init runs in the task after fork and is plain C here, and
 * the agent is started with fork/exec from C. (The one child that runs Go,
 * extern_exit_in_child, is forked by a process that never loaded it.)
 * Nothing here fails in slurmd context, and nothing depends on dlclose.
 * spank/README.md says which callback does what, where and why.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
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

/* Built with -fvisibility=hidden: only what Slurm looks up is visible (this
 * stamp, and the callbacks after "SPANK callbacks" below), and the version
 * script spank/shim.map exports only those. */
#pragma GCC visibility push(default)
SPANK_PLUGIN(reft, 1);
#pragma GCC visibility pop

/* Node-local plugin state (one "<jobid>.spec" file per reft job), root's
 * only: root:root 0700 under a root-owned directory outside every
 * world-writable one, verified component by component before each use
 * (open_root_dir, spank/rootfs). Fixed at build time (make
 * REFT_STATE_DIR=...) so that the shim can tell a reft job without loading Go
 * or parsing TOML. The plugin creates it at slurmd start, and make install
 * ships a tmpfiles.d entry for it. */
#ifndef REFT_STATE_DIR
#define REFT_STATE_DIR "/run/reft/.plugin"
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

/* Why a job of root cannot use reft, and what to do. */
#define ROOT_JOB_MSG "jobs of root cannot use reft: the reft agent runs as the job's user and refuses root " \
	"(a root agent would hold snapshot memory and files outside every user's limits). Submit the job as " \
	"a regular user, or run it without --reft"

static struct spank_option reft_option = {
	"reft", "SPEC",
	"Enable reft in-memory fault tolerance. SPEC is off, or modes arc, aec, "
	"aec:K (K>=1), aor joined by '+', then optional ,key=value: dp= pp= tp= "
	"every= persist=(steps|duration|auto|off) spares= persist_dir=, and the flag strict. "
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

/* ---- root's directories ------------------------------------------------ */

/*
 * Root opens its directories component by component from "/" with
 * openat(O_DIRECTORY|O_NOFOLLOW), so it never follows a symlink, and checks
 * each one with fstat: owned by root and not writable by group or other. An
 * ancestor may be a root-owned sticky directory (/tmp, /dev/shm): other users
 * can neither rename nor remove root's entries in it. Everything after that
 * is relative to the verified fd (mkdirat, openat with O_NOFOLLOW|O_EXCL,
 * fchown/fchmod on fds). The same rules as spank/rootfs (Go); see
 * docs/SECURITY.md.
 *
 * These run between fork and exec in spawn_agent, so they use only
 * async-signal-safe calls: no snprintf, no malloc. Messages are built with
 * msg_cat into a caller's buffer.
 */

/* msg_cat appends the strings (until NULL) to buf of size n. */
static void msg_cat(char *buf, size_t n, ...)
{
	va_list ap;
	size_t len = strnlen(buf, n);
	va_start(ap, n);
	for (const char *s; (s = va_arg(ap, const char *)) != NULL;)
		for (; *s && len + 1 < n; s++)
			buf[len++] = *s;
	va_end(ap);
	if (n)
		buf[len < n ? len : n - 1] = '\0';
}

/* fmt_num writes v in base (8 or 10) into b[24]. */
static const char *fmt_num(char *b, unsigned long v, unsigned base)
{
	char t[24];
	int i = 0, j = 0;
	do {
		t[i++] = (char) ('0' + v % base);
		v /= base;
	} while (v && i < 23);
	while (i)
		b[j++] = t[--i];
	b[j] = '\0';
	return b;
}

#define DIR_OPEN (O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
#define REFUSE ": refusing it (root never uses a path another user could have planted)"

/* Explains why openat(dirfd, name, DIR_OPEN) failed. */
static void why_open(int dirfd, const char *name, const char *path, int e, char *err, size_t errlen)
{
	struct stat st;
	if ((e == ELOOP || e == ENOTDIR) && fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0)
		msg_cat(err, errlen, path, S_ISLNK(st.st_mode) ? " is a symlink" : " is not a directory", REFUSE, NULL);
	else
		msg_cat(err, errlen, "cannot open ", path, ": ", strerror(e), NULL);
}

/* Checks an opened directory: root's, not writable by group or other
 * (unless sticky and sticky_ok). */
static int check_root_dir(int fd, const char *path, int sticky_ok, char *err, size_t errlen)
{
	struct stat st;
	char n[24];
	if (fstat(fd, &st) != 0) {
		msg_cat(err, errlen, "cannot stat ", path, ": ", strerror(errno), NULL);
		return -1;
	}
	if (st.st_uid != 0) {
		msg_cat(err, errlen, path, " is owned by uid ", fmt_num(n, st.st_uid, 10), ", not root", REFUSE, NULL);
		return -1;
	}
	if ((st.st_mode & 022) && !(sticky_ok && (st.st_mode & S_ISVTX))) {
		msg_cat(err, errlen, path, " is writable by group or other (mode ", fmt_num(n, st.st_mode & 07777, 8), ")",
			REFUSE, NULL);
		return -1;
	}
	return 0;
}

/*
 * Opens the relative path rel under the verified directory fd at (or, with
 * at < 0, the absolute path rel from "/"), checking every component; with
 * create, missing ones are made by root, 0755, the last one with mode.
 * sticky_last accepts a root-owned sticky last component (a 1777 mount like
 * a hugetlbfs or a shared log directory). Returns a new fd or -1 with err.
 */
static int open_root_dir(int at, const char *rel, int create, mode_t mode, int sticky_last, char *err, size_t errlen)
{
	char buf[PATH_MAX], path[PATH_MAX] = "";
	size_t n = strlen(rel);
	int fd;

	if (n >= sizeof(buf)) {
		msg_cat(err, errlen, "path too long: ", rel, NULL);
		return -1;
	}
	memcpy(buf, rel, n + 1);
	if (at < 0) {
		if (buf[0] != '/') {
			msg_cat(err, errlen, rel, " is not an absolute path", NULL);
			return -1;
		}
		fd = open("/", DIR_OPEN);
		if (fd < 0) {
			msg_cat(err, errlen, "cannot open /: ", strerror(errno), NULL);
			return -1;
		}
		if (check_root_dir(fd, "/", 1, err, errlen) != 0) {
			close(fd);
			return -1;
		}
	} else {
		fd = fcntl(at, F_DUPFD_CLOEXEC, 3);
		if (fd < 0) {
			msg_cat(err, errlen, "dup: ", strerror(errno), NULL);
			return -1;
		}
	}
	char *p = buf;
	while (*p) {
		while (*p == '/')
			p++;
		if (!*p)
			break;
		char *comp = p;
		while (*p && *p != '/')
			p++;
		int last = 1;
		for (char *q = p; *q; q++)
			if (*q != '/') {
				last = 0;
				break;
			}
		if (*p)
			*p++ = '\0';
		msg_cat(path, sizeof(path), "/", comp, NULL);
		if ((comp[0] == '.' && comp[1] == '\0') || (comp[0] == '.' && comp[1] == '.' && comp[2] == '\0')) {
			msg_cat(err, errlen, rel, ": . or .. in the path", NULL);
			close(fd);
			return -1;
		}
		mode_t m = last ? mode : 0755;
		int made = create && mkdirat(fd, comp, m) == 0;
		if (create && !made && errno != EEXIST) {
			msg_cat(err, errlen, "cannot create ", path, ": ", strerror(errno), NULL);
			close(fd);
			return -1;
		}
		int next = openat(fd, comp, DIR_OPEN);
		if (next < 0) {
			why_open(fd, comp, path, errno, err, errlen);
			close(fd);
			return -1;
		}
		close(fd);
		fd = next;
		if (made && fchmod(fd, m) != 0) {
			msg_cat(err, errlen, "cannot chmod ", path, ": ", strerror(errno), NULL);
			close(fd);
			return -1;
		}
		if (check_root_dir(fd, path, !last || sticky_last, err, errlen) != 0) {
			close(fd);
			return -1;
		}
	}
	return fd;
}

/*
 * Makes name under the verified root directory dirfd the user's directory,
 * 0700. An existing one is accepted if it is a directory (not a symlink)
 * owned by uid or by root (only root can create entries in dirfd); anything
 * else is refused. Ownership and mode are set on the opened fd.
 */
static int user_dir_at(int dirfd, const char *dirpath, const char *name, uid_t uid, gid_t gid, char *err, size_t errlen)
{
	char path[PATH_MAX] = "", n1[24], n2[24];
	struct stat st;

	msg_cat(path, sizeof(path), dirpath, "/", name, NULL);
	if (mkdirat(dirfd, name, 0700) != 0 && errno != EEXIST) {
		msg_cat(err, errlen, "cannot create ", path, ": ", strerror(errno), NULL);
		return -1;
	}
	int fd = openat(dirfd, name, DIR_OPEN);
	if (fd < 0) {
		why_open(dirfd, name, path, errno, err, errlen);
		return -1;
	}
	if (fstat(fd, &st) != 0) {
		msg_cat(err, errlen, "cannot stat ", path, ": ", strerror(errno), NULL);
		close(fd);
		return -1;
	}
	if (st.st_uid != uid && st.st_uid != 0) {
		msg_cat(err, errlen, path, " is owned by uid ", fmt_num(n1, st.st_uid, 10), ", not the job's uid ",
			fmt_num(n2, uid, 10), REFUSE, NULL);
		close(fd);
		return -1;
	}
	if (fchown(fd, uid, gid) != 0 || fchmod(fd, 0700) != 0) {
		msg_cat(err, errlen, "cannot give ", path, " to uid ", fmt_num(n1, uid, 10), ": ", strerror(errno), NULL);
		close(fd);
		return -1;
	}
	close(fd);
	return 0;
}

/* Writes "<spec>\n" as name in the verified directory dirfd, root 0600:
 * name.tmp is created with O_EXCL|O_NOFOLLOW and renamed over name. */
static int write_marker_at(int dirfd, const char *name, const char *spec, char *err, size_t errlen)
{
	char tmp[PATH_MAX] = "";
	msg_cat(tmp, sizeof(tmp), name, ".tmp", NULL);
	unlinkat(dirfd, tmp, 0);
	int fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0) {
		msg_cat(err, errlen, "cannot create the job marker ", REFT_STATE_DIR, "/", tmp, ": ", strerror(errno), NULL);
		return -1;
	}
	size_t n = strlen(spec);
	if (write(fd, spec, n) != (ssize_t) n || write(fd, "\n", 1) != 1 || close(fd) != 0 ||
	    renameat(dirfd, tmp, dirfd, name) != 0) {
		msg_cat(err, errlen, "cannot write the job marker ", REFT_STATE_DIR, "/", name, ": ", strerror(errno), NULL);
		unlinkat(dirfd, tmp, 0);
		return -1;
	}
	return 0;
}

/* ---- starting the agent ------------------------------------------------ */

/* The agent plan from Go (reft_go_extern_plan, reft_go_step), NUL-separated:
 * run_dir, job, tmpfs_root, uid, hugetlbfs (or ""), log dir (or ""), binary,
 * args... */
enum { P_RUN_DIR, P_JOB, P_TMPFS_ROOT, P_UID, P_HUGETLBFS, P_LOG_DIR, P_BINARY, P_N };

/* The job's groups: the supplementary groups Slurm gives (the job's
 * credential), else the gid alone. Read in the parent: NSS lookups must not
 * run between fork and exec. */
struct groups {
	gid_t gid[NGROUPS_MAX + 1];
	int n;
};

static void job_groups(spank_t sp, gid_t gid, struct groups *g)
{
	gid_t *sup = NULL;
	int n = 0;
	g->gid[0] = gid;
	g->n = 1;
	if (spank_get_item(sp, S_JOB_SUPPLEMENTARY_GIDS, &sup, &n) == ESPANK_SUCCESS && sup && n > 0) {
		for (int i = 0; i < n && g->n < NGROUPS_MAX + 1; i++)
			if (sup[i] != gid)
				g->gid[g->n++] = sup[i];
		return;
	}
	/* Slurm gave none (an older slurmd, or a step without them): the
	 * user's groups from NSS, as initgroups(3) would set them */
	uid_t uid;
	struct passwd pw, *res = NULL;
	char buf[16384];
	int cnt = NGROUPS_MAX + 1;
	if (spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS ||
	    getpwuid_r(uid, &pw, buf, sizeof(buf), &res) != 0 || !res ||
	    getgrouplist(pw.pw_name, gid, g->gid, &cnt) < 0) {
		g->gid[0] = gid; /* gid alone */
		return;
	}
	g->n = cnt;
}

/* Child's part of spawn_agent until exec; returns only on failure, with
 * err set and the exit status to use. Warnings (not fatal) go to warn. */
static int agent_child(int msgfd, const char *const *item, char *const *argv, uid_t uid, gid_t gid,
		       const struct groups *g, const char *marker, const char *spec, char *err, size_t errlen,
		       char *warn, size_t warnlen)
{
	char n1[24], n2[24];
	int fd, logfd = -1;

	if (geteuid() != 0 && seteuid(0) != 0) {
		msg_cat(err, errlen, "cannot regain root to prepare directories", NULL);
		return 120;
	}
	if (setegid(0) != 0) {
		msg_cat(err, errlen, "cannot regain root's group to prepare directories", NULL);
		return 120;
	}
	umask(022);
	/* <run_dir>/<job>: the socket, the lock */
	if ((fd = open_root_dir(-1, item[P_RUN_DIR], 1, 0755, 0, err, errlen)) < 0)
		return 121;
	if (user_dir_at(fd, item[P_RUN_DIR], item[P_JOB], uid, gid, err, errlen) != 0)
		return 121;
	close(fd);
	/* <tmpfs_root>/<uid>: the user's stores */
	if ((fd = open_root_dir(-1, item[P_TMPFS_ROOT], 1, 0755, 0, err, errlen)) < 0)
		return 122;
	if (user_dir_at(fd, item[P_TMPFS_ROOT], item[P_UID], uid, gid, err, errlen) != 0)
		return 122;
	close(fd);
	/* <hugetlbfs><tmpfs_root>/<uid>: where the arenas' files go */
	if (item[P_HUGETLBFS][0]) {
		char path[PATH_MAX] = "";
		int mnt = open_root_dir(-1, item[P_HUGETLBFS], 0, 0, 1, err, errlen);
		if (mnt < 0)
			return 122;
		fd = open_root_dir(mnt, item[P_TMPFS_ROOT], 1, 0755, 0, err, errlen);
		close(mnt);
		if (fd < 0)
			return 122;
		msg_cat(path, sizeof(path), item[P_HUGETLBFS], item[P_TMPFS_ROOT], NULL);
		if (user_dir_at(fd, path, item[P_UID], uid, gid, err, errlen) != 0)
			return 122;
		close(fd);
	}
	if (marker) {
		if ((fd = open_root_dir(-1, REFT_STATE_DIR, 1, 0700, 0, err, errlen)) < 0)
			return 123;
		if (write_marker_at(fd, marker, spec, err, errlen) != 0)
			return 123;
		close(fd);
	}
	/* The log directory, shared by all users (1777, or made so here): the
	 * job's own directory in it is made below as the user. */
	if (item[P_LOG_DIR][0] &&
	    (logfd = open_root_dir(-1, item[P_LOG_DIR], 1, 01777, 1, warn, warnlen)) < 0)
		msg_cat(warn, warnlen, "; the agent's log directory is not prepared", NULL);
	/* A <log dir>/<job> that is not the user's own 0700 directory was made
	 * by someone else (the log directory is shared and sticky): still
	 * root, move it aside, without following it (renameat moves the name,
	 * never what a link names; NOREPLACE never clobbers a planted target),
	 * so the job gets a fresh directory of its own below and the squatter
	 * neither stops the agent nor reads or forges its logs. */
	if (logfd >= 0) {
		struct stat st;
		char aside[64] = "", path[PATH_MAX] = "";
		if (fstatat(logfd, item[P_JOB], &st, AT_SYMLINK_NOFOLLOW) == 0 &&
		    (!S_ISDIR(st.st_mode) || st.st_uid != uid || (st.st_mode & 07777) != 0700)) {
			msg_cat(path, sizeof(path), item[P_LOG_DIR], "/", item[P_JOB], NULL);
			msg_cat(aside, sizeof(aside), ".squatted-", item[P_JOB], "-", fmt_num(n1, (unsigned long) getpid(), 10), NULL);
			if (S_ISLNK(st.st_mode))
				msg_cat(warn, warnlen, "the agent's log directory ", path, " is a symlink (planted by another user?)", NULL);
			else
				msg_cat(warn, warnlen, "the agent's log directory ", path, " exists with owner uid ",
					fmt_num(n1, st.st_uid, 10), " and mode ", fmt_num(n2, st.st_mode & 07777, 8),
					", not the job's uid and 0700 (planted by another user?)", NULL);
			if (renameat2(logfd, item[P_JOB], logfd, aside, RENAME_NOREPLACE) == 0)
				msg_cat(warn, warnlen, ": moved aside to ", aside, "; the job gets its own", NULL);
			else
				msg_cat(warn, warnlen, ": cannot move it aside (", strerror(errno), ")", NULL);
		}
	}
	setsid();
	if (setgroups((size_t) g->n, g->gid) != 0 || setresgid(gid, gid, gid) != 0 ||
	    setresuid(uid, uid, uid) != 0 || getuid() != uid || geteuid() != uid) {
		msg_cat(err, errlen, "cannot switch to the job's user (uid ", fmt_num(n1, uid, 10), "): ", strerror(errno), NULL);
		return 124;
	}
	/* <log dir>/<job>, as the user, 0700. One that exists must be the
	 * user's own 0700 directory (another node of the job made it on a
	 * shared log directory); anything else was planted by someone else, and
	 * is left alone. */
	if (logfd >= 0) {
		struct stat st;
		char path[PATH_MAX] = "";
		msg_cat(path, sizeof(path), item[P_LOG_DIR], "/", item[P_JOB], NULL);
		if (mkdirat(logfd, item[P_JOB], 0700) != 0 && errno != EEXIST) {
			msg_cat(warn, warnlen, "cannot create the agent's log directory ", path, " as uid ",
				fmt_num(n1, uid, 10), ": ", strerror(errno), NULL);
		} else if ((fd = openat(logfd, item[P_JOB], DIR_OPEN)) < 0) {
			why_open(logfd, item[P_JOB], path, errno, warn, warnlen);
			msg_cat(warn, warnlen, "; the agent's log directory is not used", NULL);
		} else {
			if (fstat(fd, &st) != 0 || st.st_uid != uid || (st.st_mode & 07777) != 0700)
				msg_cat(warn, warnlen, "the agent's log directory ", path, " exists with owner uid ",
					fmt_num(n1, st.st_uid, 10), " and mode ", fmt_num(n2, st.st_mode & 07777, 8),
					", not the job's uid and 0700 (planted by another user?)",
					": not used", NULL);
			close(fd);
		}
		close(logfd);
	}
	/* the warning goes out now: the grandchild execs, and the parent
	 * reads the pipe once this process has exited */
	if (warn[0]) {
		if (write(msgfd, "W", 1) != 1 || write(msgfd, warn, strlen(warn)) < 0 || write(msgfd, "\n", 1) != 1)
			warn[0] = '\0';
		warn[0] = '\0';
	}
	pid_t p2 = fork();
	if (p2 < 0) {
		msg_cat(err, errlen, "fork failed: ", strerror(errno), NULL);
		return 125;
	}
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
	for (int i = 3; i < 4096; i++)
		close(i);
	char *const envp[] = { "PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C", NULL };
	execve(argv[0], argv, envp);
	_exit(127);
}

/*
 * Start the agent as uid:gid (and the job's groups) from a plan written by Go.
 * The child becomes root again if needed (user_init runs with only the
 * effective uid dropped), creates the directories (verified, see above),
 * optionally writes the job's marker, drops to the user for good, creates the
 * job's log directory as the user, detaches (setsid, second fork), and
 * execs. Only async-signal-safe calls run between fork and exec: no Go. The
 * child sends its message, fatal or a warning, back on a pipe.
 * Returns 0 once the intermediate child has exited (warn may hold a line to
 * log), or -1 with err.
 */
static int spawn_agent(const char *plan, uid_t uid, gid_t gid, const struct groups *g, const char *marker,
		       const char *spec, char *err, size_t errlen, char *warn, size_t warnlen)
{
	const char *item[64];
	int n = 0, pfd[2];
	/* the hugetlbfs and log dir items may be empty; the empty item after
	 * the arguments ends the plan */
	for (const char *p = plan; n < 63; p += strlen(p) + 1) {
		if (!*p && n >= P_BINARY)
			break;
		item[n++] = p;
	}
	item[n] = NULL;
	warn[0] = '\0';
	if (n < P_N) {
		snprintf(err, errlen, "internal: short agent plan (%d items)", n);
		return -1;
	}
	char *const *argv = (char *const *) &item[P_BINARY];
	if (pipe2(pfd, O_CLOEXEC) != 0) {
		snprintf(err, errlen, "pipe: %s", strerror(errno));
		return -1;
	}

	pid_t pid = fork();
	if (pid < 0) {
		snprintf(err, errlen, "fork: %s", strerror(errno));
		close(pfd[0]);
		close(pfd[1]);
		return -1;
	}
	if (pid == 0) {
		static char cerr[2048], cwarn[2048];
		sigset_t none;
		sigemptyset(&none);
		for (int s = 1; s < NSIG; s++)
			if (s != SIGKILL && s != SIGSTOP)
				signal(s, SIG_DFL);
		sigprocmask(SIG_SETMASK, &none, NULL);
		close(pfd[0]);
		cerr[0] = cwarn[0] = '\0';
		int code = agent_child(pfd[1], item, argv, uid, gid, g, marker, spec, cerr, sizeof(cerr), cwarn,
				       sizeof(cwarn));
		/* only on failure: a warning, then the error */
		if (cwarn[0] && (write(pfd[1], "W", 1) != 1 || write(pfd[1], cwarn, strlen(cwarn)) < 0 ||
				 write(pfd[1], "\n", 1) != 1))
			_exit(code);
		if (write(pfd[1], "E", 1) == 1 && write(pfd[1], cerr, strlen(cerr)) < 0)
			_exit(code);
		_exit(code);
	}
	close(pfd[1]);
	int status = 0;
	while (waitpid(pid, &status, 0) < 0) {
		if (errno != EINTR) {
			snprintf(err, errlen, "waitpid: %s", strerror(errno));
			close(pfd[0]);
			return -1;
		}
	}
	char msg[4096];
	ssize_t k, got = 0;
	while (got < (ssize_t) sizeof(msg) - 1 && (k = read(pfd[0], msg + got, sizeof(msg) - 1 - got)) > 0)
		got += k;
	msg[got < 0 ? 0 : got] = '\0';
	close(pfd[0]);
	/* "W<warning>\n" and/or "E<error>" */
	char *w = msg[0] == 'W' ? msg + 1 : NULL, *e = msg[0] == 'E' ? msg + 1 : NULL;
	if (w) {
		char *nl = strchr(w, '\n');
		if (nl) {
			*nl = '\0';
			if (nl[1] == 'E')
				e = nl + 2;
		}
		snprintf(warn, warnlen, "%.1500s", w);
	}
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		snprintf(err, errlen, "starting the reft agent %.500s failed: %.1500s", argv[0],
			 e && *e ? e : WIFEXITED(status) ? "the child exited early" : "killed by a signal");
		return -1;
	}
	return 0;
}

/* ---- SPANK callbacks --------------------------------------------------- */

/* Everything from here to the end of the file has default visibility: the
 * slurm_spank_* callbacks that Slurm looks up (shim.map exports those and
 * nothing else; the static helpers here are not exported anyway). */
#pragma GCC visibility push(default)

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
	/* slurmd (root, at start): make the plugin's state directory, or say
	 * once why it is unsafe. The prolog and the steps check it again. */
	if (spank_context() == S_CTX_SLURMD && geteuid() == 0) {
		char why[1024] = "";
		int fd = open_root_dir(-1, REFT_STATE_DIR, 1, 0700, 0, why, sizeof(why));
		if (fd < 0)
			slurm_error("reft: state directory %s: %s; reft jobs cannot start on this node until it is fixed",
				    REFT_STATE_DIR, why);
		else
			close(fd);
	}
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
	if (!is_off(optarg) && getuid() == 0) {
		slurm_error("--reft=%s: %s", optarg, ROOT_JOB_MSG);
		return -1;
	}
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
	uid_t uid = 1;
	if (spank_get_item(sp, S_JOB_UID, &uid) == ESPANK_SUCCESS && uid == 0) {
		/* no marker, so no agent; a default= SPEC is simply not applied */
		if (s != g_default)
			slurm_info("reft: job %u: %s (no agent; its reft steps fail with this message)", job, ROOT_JOB_MSG);
		return 0;
	}
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
	char marker[PATH_MAX], node[256], err[2048] = "", warn[2048];
	static char plan[16384];
	static struct groups groups;

	if (!spank_remote(sp) || spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS || step != EXTERN_STEP)
		return 0;
	if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_GID, &gid) != ESPANK_SUCCESS)
		return 0;
	marker_path(job, marker, sizeof(marker));
	if (access(marker, F_OK) != 0 || uid == 0)
		return 0; /* not a reft job (the prolog writes no marker for root): Go is never loaded */
	node_name(sp, node, sizeof(node));
	if (load_go(err, sizeof(err)) != 0) {
		slurm_error("reft: job %u: %s", job, err);
		return 0;
	}
	int rc = CALL_GO(go.extern_plan(g_config, REFT_STATE_DIR, job, uid, node, plan, sizeof(plan), err, sizeof(err)));
	if (rc < 0)
		slurm_error("reft: job %u: cannot plan the agent: %s", job, err);
	else if (rc == 1) {
		job_groups(sp, gid, &groups);
		if (spawn_agent(plan, uid, gid, &groups, NULL, NULL, err, sizeof(err), warn, sizeof(warn)) != 0)
			slurm_error("reft: job %u: %s", job, err);
		if (warn[0])
			slurm_error("reft: job %u: %s", job, warn);
	}
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
	char node[256], marker[64], canon[1024], err[4096] = "", warn[2048];
	static char out[16384];
	static struct groups groups;
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
	if (uid == 0) {
		if (!g_opt) {
			/* reft came from default=: root's job runs without it */
			for (const char **e = reft_env_names; *e; e++)
				spank_unsetenv(sp, *e);
			return 0;
		}
		snprintf(g_task_error, sizeof(g_task_error), "node %s: --reft=%s: %s", node, s, ROOT_JOB_MSG);
		return 0;
	}
	int restart = restart_count(sp);
	int rc = CALL_GO(go.step(g_config, REFT_STATE_DIR, (char *) s, job, step, uid, node, restart, 0,
				 out, sizeof(out), err, sizeof(err)));
	if (rc == 2) {
		/* no agent and no extern step started one: this step starts it */
		snprintf(marker, sizeof(marker), "%u.spec", job);
		job_groups(sp, gid, &groups);
		if (CALL_GO(go.normalize((char *) s, canon, sizeof(canon), err, sizeof(err))) != 0 ||
		    spawn_agent(out, uid, gid, &groups, marker, canon, err, sizeof(err), warn, sizeof(warn)) != 0) {
			snprintf(g_task_error, sizeof(g_task_error), "node %s: %s", node, err);
			return 0;
		}
		if (warn[0])
			slurm_error("reft: job %u: %s", job, warn);
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

/* The extern step's cleanup when this process has not loaded Go: the
 * marker appeared after task_post_fork looked (seen on Slurm 24.11: a node
 * whose agent a step started, such as a spare), and loading Go here can hang
 * this slurmstepd for good. Its dlopen must set up the library's static TLS
 * in every thread (glibc takes dl_stack_cache_lock, holding
 * dl_load_tls_lock) while the job is being torn down, when 24.11's worker
 * threads drop privileges (seteuid: glibc's setxid holds dl_stack_cache_lock
 * and waits for a thread still being created) and its message thread creates
 * threads (pthread_create waits for dl_load_tls_lock): a three-thread
 * deadlock, seen in gdb with the job COMPLETING until the test gave up. So
 * a child does it: fork leaves it one thread and fresh loader locks, it
 * loads Go, runs the cleanup, reports on a pipe and exits; the parent waits
 * a bounded time and kills a child that outlives it. Nothing in the child
 * calls Slurm (its locks may be held by threads the fork left behind). */
static void extern_exit_in_child(uint32_t job, uint32_t uid, const char *marker)
{
	char err[2048] = "";
	int fds[2];

	/* Non-blocking: the parent's wait is bounded even if the child
	 * writes nothing; the message (under 2 KiB) fits the pipe. */
	if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
		slurm_error("reft: job %u cleanup: pipe: %s; the job's agent and files on this node were not cleaned up", job, strerror(errno));
		return;
	}
	pid_t pid = fork();
	if (pid < 0) {
		slurm_error("reft: job %u cleanup: fork: %s; the job's agent and files on this node were not cleaned up", job, strerror(errno));
		close(fds[0]);
		close(fds[1]);
		return;
	}
	if (pid == 0) {
		close(fds[0]);
		/* Root again if the fork caught a Slurm worker's seteuid to the
		 * job's user (process-wide in glibc): the cleanup is root's. */
		int rc = 0;
		if (geteuid() != 0 && seteuid(0) != 0)
			rc = -1;
		if (rc == 0 && ((getegid() != 0 && setegid(0) != 0) || setgroups(0, NULL) != 0))
			rc = -1;
		if (rc != 0)
			snprintf(err, sizeof(err), "the cleanup process cannot act as root: %s", strerror(errno));
		else
			rc = load_go(err, sizeof(err));
		if (rc != 0 && go.handle == NULL && geteuid() == 0)
			unlink(marker);
		else if (rc == 0)
			rc = CALL_GO(go.extern_exit(g_config, REFT_STATE_DIR, job, uid, err, sizeof(err)));
		if (rc != 0) {
			size_t n = strnlen(err, sizeof(err)), off = 0;
			while (off < n) {
				ssize_t w = write(fds[1], err + off, n - off);
				if (w <= 0)
					break;
				off += (size_t) w;
			}
		}
		_exit(rc != 0);
	}
	close(fds[1]);
	/* The cleanup's own bounds: the agent's 3 s grace, two scontrol
	 * calls of 3 s, and a Go runtime's start. */
	size_t got = 0;
	int status = 0, done = 0;
	for (int waited_ms = 0; waited_ms < 30000 && !done; waited_ms += 50) {
		ssize_t r = read(fds[0], err + got, sizeof(err) - 1 - got);
		if (r > 0)
			got += (size_t) r;
		pid_t w = waitpid(pid, &status, WNOHANG);
		if (w == pid)
			done = 1;
		else if (w < 0 && errno == ECHILD)
			done = 2; /* reaped by another thread: the pipe alone tells */
		else if (r <= 0)
			usleep(50 * 1000);
	}
	if (!done) {
		kill(pid, SIGKILL);
		waitpid(pid, &status, 0);
		slurm_error("reft: job %u cleanup: the cleanup process outlived 30 s and was killed", job);
	}
	while (got < sizeof(err) - 1) {
		ssize_t r = read(fds[0], err + got, sizeof(err) - 1 - got);
		if (r <= 0)
			break;
		got += (size_t) r;
	}
	err[got] = '\0';
	close(fds[0]);
	if ((done == 1 && (!WIFEXITED(status) || WEXITSTATUS(status) != 0)) || (done == 2 && err[0]))
		slurm_error("reft: job %u cleanup: %s", job, err[0] ? err : "the cleanup process failed without a message");
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
	if (!go.handle) {
		extern_exit_in_child(job, uid, marker);
		return 0;
	}
	/* The cleanup is root's, but a Slurm 24.11 worker thread can hold the
	 * whole process at the job user's euid for a moment (glibc's seteuid
	 * is process-wide): seen as "permission denied" on the run directory
	 * and the plugin's state directory. Wait for root, at most 2 s. */
	for (int i = 0; geteuid() != 0 && i < 40; i++)
		usleep(50 * 1000);
	if (geteuid() != 0) {
		slurm_error("reft: job %u cleanup: this slurmstepd still ran as uid %u, not root, after 2 s: the job's agent and files on this node were not cleaned up",
			    job, (unsigned) geteuid());
		return 0;
	}
	if (CALL_GO(go.extern_exit(g_config, REFT_STATE_DIR, job, uid, err, sizeof(err))) != 0)
		slurm_error("reft: job %u cleanup: %s", job, err);
	return 0;
}

/* ---- job epilog: free the job's snapshot store (issue 14, finding 6) -- */

typedef int (*job_epilog_fn)(char *, uint32_t, uint32_t, char *, int, char *, int);

/* Job epilog (slurmd runs it as root, in its own `slurmstepd spank epilog`
 * process, on every node of the job as the job ends there): remove the
 * job's store on this node unless Slurm requeued the job, and every store
 * past store.max_age (reft_go_job_epilog, spank/plugin/epilog.go). Runs for
 * every job: a step's --reft leaves a store the job's option does not
 * show. Never fails: a failing epilog drains the node. */
int slurm_spank_job_epilog(spank_t sp, int ac, char **av)
{
	uint32_t job = 0, uid = 0;
	char out[1024] = "", err[2048] = "";
	job_epilog_fn fn;

	parse_args(ac, av); /* no slurm_spank_init in this context */
	if (g_disabled[0])
		return 0; /* logged by parse_args */
	if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS)
		return 0;
	if (load_go(err, sizeof(err)) != 0) {
		slurm_error("reft: job %u epilog: %s", job, err);
		return 0;
	}
	fn = (job_epilog_fn) dlsym(go.handle, "reft_go_job_epilog");
	if (!fn) {
		slurm_error("reft: job %u epilog: %s lacks reft_go_job_epilog: plugin and library are from different builds",
			    job, GO_LIB_NAME);
		return 0;
	}
	if (CALL_GO(fn(g_config, job, uid, out, sizeof(out), err, sizeof(err))) != 0)
		slurm_error("reft: job %u epilog: %s%s%s", job, out, out[0] ? "; " : "", err);
	else if (out[0])
		slurm_info("reft: job %u epilog: %s", job, out);
	return 0;
}

#pragma GCC visibility pop
