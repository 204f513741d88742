/* fencetrace.so: LD_PRELOAD into an MPI rank to log each PMIx fence it
 * enters and the moment its release arrives, with CLOCK_REALTIME stamps
 * (every node of the test cluster shares one kernel, so the stamps of all
 * ranks compare). tests/lane/mpicrash/count's fence check reads the lines
 * "fencetrace rank R fence K enter|release T [status S]" and reports any
 * fence that released a rank before every rank had entered it: a broken
 * barrier, which lets Open MPI's ob1 receive a message on MPI_COMM_WORLD
 * before MPI_Init has added the communicator to the PML. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int fence_no;

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static const char *rank(void) {
	const char *r = getenv("SLURM_PROCID");
	return r ? r : "?";
}

struct wrap { pmix_op_cbfunc_t cb; void *cbdata; int k; };

static void release(pmix_status_t status, void *cbdata) {
	struct wrap *w = cbdata;
	dprintf(2, "fencetrace rank %s fence %d release %.6f status %d\n", rank(), w->k, now(), status);
	w->cb(status, w->cbdata);
	free(w);
}

pmix_status_t PMIx_Fence_nb(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[],
			    size_t ninfo, pmix_op_cbfunc_t cbfunc, void *cbdata) {
	static pmix_status_t (*real)(const pmix_proc_t[], size_t, const pmix_info_t[], size_t, pmix_op_cbfunc_t, void *);
	if (!real)
		real = dlsym(RTLD_NEXT, "PMIx_Fence_nb");
	struct wrap *w = malloc(sizeof *w);
	w->cb = cbfunc;
	w->cbdata = cbdata;
	w->k = ++fence_no;
	dprintf(2, "fencetrace rank %s fence %d enter %.6f nb\n", rank(), w->k, now());
	return real(procs, nprocs, info, ninfo, release, w);
}

pmix_status_t PMIx_Fence(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[], size_t ninfo) {
	static pmix_status_t (*real)(const pmix_proc_t[], size_t, const pmix_info_t[], size_t);
	if (!real)
		real = dlsym(RTLD_NEXT, "PMIx_Fence");
	int k = ++fence_no;
	dprintf(2, "fencetrace rank %s fence %d enter %.6f blocking\n", rank(), k, now());
	pmix_status_t rc = real(procs, nprocs, info, ninfo);
	dprintf(2, "fencetrace rank %s fence %d release %.6f status %d\n", rank(), k, now(), rc);
	return rc;
}
