/* A clock_gettime that a preloaded library puts in front of the C library's, as libfaketime
 * does: every clock, the monotonic one too, reads as from 2020-01-01 on (its seconds added).
 * Built as a shared library and preloaded. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <time.h>

static int (*real_clock_gettime)(clockid_t, struct timespec *);

__attribute__((constructor)) static void find_real(void) {
    real_clock_gettime = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    int r = real_clock_gettime(id, ts);
    if (r == 0) ts->tv_sec += 1577836800;
    return r;
}
