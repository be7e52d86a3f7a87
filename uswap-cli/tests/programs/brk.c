/* Moves its own break (sbrk, brk, syscall(SYS_brk)) as stress-ng's brk stressor does: a
 * page up at a time, a page down now and then, a page inside unmapped, and back to where it
 * began every so often; meanwhile it reads and writes a buffer of argv[1] MiB, larger than
 * the limit, so that uswap's threads work and allocate. First it checks what the kernel's
 * break promises: contiguous growth, pages that read zero once given back and grown over
 * again, syscall(SYS_brk) and sbrk agreeing, ENOMEM past a data limit.
 * Prints "ok" and exits 0, or says what was wrong and exits 1. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096L

static int fail(const char *what) {
    printf("wrong: %s (errno %d)\n", what, errno);
    return 1;
}

static int check_promises(void) {
    char *start = sbrk(0);
    if ((char *)syscall(SYS_brk, 0) != start) return fail("syscall(SYS_brk, 0) is not sbrk(0)");
    if (sbrk(3 * PAGE) != start || sbrk(0) != start + 3 * PAGE) return fail("sbrk grew elsewhere");
    memset(start, 0xa5, 3 * PAGE);
    if (brk(start + PAGE) != 0 || sbrk(0) != start + PAGE) return fail("brk did not shrink");
    if (sbrk(2 * PAGE) != start + PAGE) return fail("sbrk regrew elsewhere");
    for (long i = PAGE; i < 3 * PAGE; i++)
        if (start[i] != 0) return fail("a page given back kept its bytes");
    if (start[PAGE - 1] != (char)0xa5) return fail("a kept page lost its bytes");
    if ((char *)syscall(SYS_brk, start + 5 * PAGE) != start + 5 * PAGE) return fail("SYS_brk did not move");
    if ((char *)syscall(SYS_brk, 0) != start + 5 * PAGE) return fail("SYS_brk's move is not kept");
    /* The C library's sbrk keeps the break it last set; brk sets it again. */
    if (brk(start + 2 * PAGE) != 0 || sbrk(0) != start + 2 * PAGE) return fail("brk after SYS_brk");
    struct rlimit old, lim = {64 << 20, 0};
    getrlimit(RLIMIT_DATA, &old);
    lim.rlim_max = old.rlim_max;
    if (setrlimit(RLIMIT_DATA, &lim) != 0) return fail("setrlimit");
    errno = 0;
    if (sbrk(128 << 20) != (void *)-1 || errno != ENOMEM) return fail("grew past the data limit");
    if (setrlimit(RLIMIT_DATA, &old) != 0) return fail("setrlimit back");
    if (brk(start) != 0 || sbrk(0) != start) return fail("brk back to the start");
    return 0;
}

static unsigned char expected(size_t i, unsigned gen) { return (unsigned char)(i * 131 + (i >> 12) * 7 + gen); }

int main(int argc, char **argv) {
    size_t len = (size_t)(argc > 1 ? atol(argv[1]) : 64) << 20;
    int seconds = argc > 2 ? atoi(argv[2]) : 3;
    if (check_promises()) return 1;
    unsigned char *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) return fail("mmap");
    unsigned *gen = calloc(len / PAGE, sizeof *gen);
    for (size_t i = 0; i < len; i++) buf[i] = expected(i, 0);
    char *start = sbrk(0), *unmap_at = NULL;
    time_t end = time(NULL) + seconds;
    unsigned long rounds = 0;
    uint64_t x = 88172645463325252ull;
    /* Bounded by the clock. */
    for (int step = 0; time(NULL) < end; step = (step + 1) % 10, rounds++) {
        char *p;
        if (step < 7) {
            p = sbrk(PAGE);
            if (p != (void *)-1) {
                p[PAGE - 1] = 1;
                if (!unmap_at) unmap_at = p;
            }
        } else if (step == 7) {
            p = sbrk(0);
            if (brk(p) != 0) p = (void *)-1;
        } else if (step == 8) {
            p = (char *)sbrk(0) - PAGE;
            if (brk(p) != 0) p = (void *)-1;
        } else {
            if (unmap_at) munmap(unmap_at, PAGE);
            unmap_at = NULL;
            p = NULL;
        }
        if (p == (void *)-1 || rounds % 5000 == 4999) {
            if (p == (void *)-1 && errno != ENOMEM) return fail("sbrk");
            if (brk(start) != 0) return fail("brk back to the start");
            unmap_at = NULL;
        }
        /* A page of the buffer, checked and rewritten. */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        size_t page = (size_t)(x % (len / PAGE)), at = page * PAGE;
        for (size_t i = at; i < at + PAGE; i += 512)
            if (buf[i] != expected(i, gen[page])) return fail("a byte of the buffer changed");
        gen[page]++;
        for (size_t i = at; i < at + PAGE; i++) buf[i] = expected(i, gen[page]);
        free(malloc(1 + x % 4096));
    }
    for (size_t i = 0; i < len; i++)
        if (buf[i] != expected(i, gen[i / PAGE])) return fail("a byte of the buffer changed at the end");
    if (rounds == 0) return fail("no round");
    /* 4 MiB of break written at the end, for the report of unmanaged memory to name. */
    char *held = sbrk(4 << 20);
    if (held == (void *)-1) return fail("sbrk of 4 MiB");
    memset(held, 0x5a, 4 << 20);
    printf("ok\n");
    return 0;
}
