/* Holds the process at the system's limit of mappings (vm.max_map_count) while uswap's
 * threads scan its memory: one page in two of a shared anonymous mapping made read-only, a
 * mapping of its own each, until the kernel refuses to split it further, then one mapping
 * more, so that no new mapping and no growth of the break can be had (what stress-ng's brk
 * stressor reaches). The split pages are never touched: they hold no memory, and the
 * mappings are what counts. Meanwhile it writes and reads a buffer of argv[1] MiB, over the
 * limit, so that the pager works. After argv[2] seconds it gives the mappings back and
 * checks every byte of the buffer.
 * Prints "ok MAPPINGS" and exits 0, or says what was wrong and exits 1. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096L

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    long buf_bytes = (argc > 1 ? atol(argv[1]) : 64) << 20;
    double hold_s = argc > 2 ? atof(argv[2]) : 3;
    long pages = 70000;
    FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
    if (f) {
        long max = 0;
        if (fscanf(f, "%ld", &max) == 1 && max + 5000 > pages) pages = max + 5000;
        fclose(f);
    }
    unsigned char *buf = malloc(buf_bytes);
    if (!buf) return printf("wrong: malloc of the buffer\n"), 1;
    for (long i = 0; i < buf_bytes; i++) buf[i] = (unsigned char)(i * 131 + 7);
    char *split = mmap(NULL, 2 * pages * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (split == MAP_FAILED) return printf("wrong: mmap (errno %d)\n", errno), 1;
    long made = 0;
    for (; made < pages; made++) {
        if (mprotect(split + 2 * made * PAGE, PAGE, PROT_READ) != 0) break;
    }
    if (made == pages) return printf("wrong: %ld mappings and no limit met\n", made), 1;
    /* Past the limit of splits, one mapping more is still allowed; after it, none. */
    void *extra = mmap(NULL, PAGE, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    double until = now() + hold_s;
    unsigned long sum = 0;
    for (long round = 0; now() < until; round++)
        for (long i = round % 64 * PAGE; i < buf_bytes; i += 64 * PAGE) sum += buf[i];
    if (extra != MAP_FAILED) munmap(extra, PAGE);
    munmap(split, 2 * pages * PAGE);
    for (long i = 0; i < buf_bytes; i++)
        if (buf[i] != (unsigned char)(i * 131 + 7)) return printf("wrong: buffer byte %ld\n", i), 1;
    printf("ok %ld %d\n", made, sum > 0);
    return 0;
}
