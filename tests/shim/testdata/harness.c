/*
 * Test harness for spank/shim.c's root code outside Slurm: it includes the
 * shim, stubs the few Slurm functions it calls, and runs one operation from
 * the command line (shim_test.go drives it, as root):
 *
 *   harness open PATH CREATE STICKY_LAST     open_root_dir(PATH)
 *   harness spawn UID GID MARKER_DIR PLAN...  spawn_agent(PLAN) with the
 *                                             marker <job>.spec ("-": none)
 */
#include "../../../spank/shim.c"

spank_err_t spank_option_register(spank_t s, struct spank_option *o) { (void) s; (void) o; return ESPANK_SUCCESS; }
spank_err_t spank_option_getopt(spank_t s, struct spank_option *o, char **a) { (void) s; (void) o; (void) a; return ESPANK_ERROR; }
spank_err_t spank_get_item(spank_t s, spank_item_t i, ...) { (void) s; (void) i; return ESPANK_ERROR; }
spank_err_t spank_getenv(spank_t s, const char *v, char *b, int l) { (void) s; (void) v; (void) b; (void) l; return ESPANK_ERROR; }
spank_err_t spank_setenv(spank_t s, const char *v, const char *x, int o) { (void) s; (void) v; (void) x; (void) o; return ESPANK_SUCCESS; }
spank_err_t spank_unsetenv(spank_t s, const char *v) { (void) s; (void) v; return ESPANK_SUCCESS; }
spank_context_t spank_context(void) { return S_CTX_REMOTE; }
int spank_remote(spank_t s) { (void) s; return 1; }
void slurm_info(const char *f, ...) { (void) f; }
void slurm_error(const char *f, ...) { (void) f; }

int main(int argc, char **argv)
{
	char err[4096] = "", warn[2048] = "";
	if (argc == 5 && strcmp(argv[1], "open") == 0) {
		int fd = open_root_dir(-1, argv[2], atoi(argv[3]), 0700, atoi(argv[4]), err, sizeof(err));
		if (fd < 0) {
			printf("refused: %s\n", err);
			return 1;
		}
		printf("ok\n");
		return 0;
	}
	if (argc > 5 && strcmp(argv[1], "spawn") == 0) {
		static char plan[16384];
		size_t n = 0;
		for (int i = 5; i < argc; i++) {
			size_t l = strlen(argv[i]) + 1;
			memcpy(plan + n, argv[i], l);
			n += l;
		}
		plan[n] = '\0';
		struct groups g = { .gid = { (gid_t) atoi(argv[3]) }, .n = 1 };
		const char *marker = strcmp(argv[4], "-") ? argv[4] : NULL;
		int rc = spawn_agent(plan, (uid_t) atoi(argv[2]), (gid_t) atoi(argv[3]), &g, marker, "arc", err, sizeof(err),
				     warn, sizeof(warn));
		printf("rc=%d\nerr=%s\nwarn=%s\n", rc, err, warn);
		return rc == 0 ? 0 : 1;
	}
	fprintf(stderr, "usage: harness open PATH CREATE STICKY_LAST | spawn UID GID MARKER PLAN...\n");
	return 2;
}
