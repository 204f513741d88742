/* A stand-in libcudart for tests, with the two driver calls reft makes.
 * Build with -DDEVICES=n. The device whose primary context is active is
 * $FAKE_CUDA_ACTIVE (none when unset or empty). Every registration and
 * unregistration is appended to $FAKE_CUDA_LOG as
 * "register|unregister <address> <bytes> <flags> <current device>".
 * Like CUDA it refuses a second registration of an address and the
 * unregistration of one not registered; unlike CUDA, a call on a device
 * without an active context fails (999) instead of creating one. With
 * $FAKE_CUDA_REFUSE set, registration fails as if out of memory (2). The
 * current device is per process here, per thread in CUDA. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#define MAXREG 256
static void *regs[MAXREG];
static int cur;

static int active(void) {
	const char *a = getenv("FAKE_CUDA_ACTIVE");
	return a && *a ? atoi(a) : -1;
}

static void logcall(const char *op, void *p, size_t n, unsigned int flags) {
	const char *path = getenv("FAKE_CUDA_LOG");
	FILE *f;
	if (!path || !(f = fopen(path, "a"))) return;
	fprintf(f, "%s %p %zu %u %d\n", op, p, n, flags, cur);
	fclose(f);
}

int cudaGetDeviceCount(int *n) { *n = DEVICES; return 0; }
int cudaGetDevice(int *d) { *d = cur; return 0; }
int cudaSetDevice(int d) { if (d < 0 || d >= DEVICES) return 101; cur = d; return 0; }
int cuDeviceGet(int *d, int i) { if (i < 0 || i >= DEVICES) return 101; *d = i; return 0; }
int cuDevicePrimaryCtxGetState(int d, unsigned int *flags, int *act) { *flags = 0; *act = d == active(); return 0; }

int cudaHostRegister(void *p, size_t n, unsigned int flags) {
	int i, free = -1;
	if (cur != active()) return 999;
	if (getenv("FAKE_CUDA_REFUSE")) return 2;
	for (i = 0; i < MAXREG; i++) {
		if (regs[i] == p) return 712;
		if (!regs[i] && free < 0) free = i;
	}
	if (free < 0) return 2;
	regs[free] = p;
	logcall("register", p, n, flags);
	return 0;
}

int cudaHostUnregister(void *p) {
	int i;
	if (cur != active()) return 999;
	for (i = 0; i < MAXREG; i++) {
		if (regs[i] == p) {
			regs[i] = 0;
			logcall("unregister", p, 0, 0);
			return 0;
		}
	}
	return 713;
}

const char *cudaGetErrorString(int e) {
	switch (e) {
	case 2: return "out of memory";
	case 712: return "part or all of the requested memory range is already mapped";
	case 713: return "pointer does not correspond to a registered memory region";
	case 999: return "fake: the call would have created a context";
	}
	return "unknown error";
}
