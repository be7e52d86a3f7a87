/* Guard regions (Linux 6.13: MADV_GUARD_INSTALL, MADV_GUARD_REMOVE) over managed memory
 * whose pages are out: a touch in the guards is SIGSEGV, and once they are removed the
 * range reads zero, as without uswap (the kernel zaps the pages for its guards without
 * telling userfaultfd: the pages that were out came back with their old contents).
 * Usage: guards MIB. Prints the pages of the guarded quarter that read zero, old data or
 * neither, then the rest's bad pages; exits 0 when all is as without uswap. */
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#define MADV_GUARD_INSTALL 102
#define MADV_GUARD_REMOVE 103
#define PAGE 4096

static sigjmp_buf back;
static void on_segv(int sig) { siglongjmp(back, sig); }

/* A page of `seed`'s pattern: hard to compress, different per page. */
static void fill(uint8_t *p, uint64_t seed) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < PAGE; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
}

static int holds(const uint8_t *p, uint64_t seed) {
    uint8_t want[PAGE];
    fill(want, seed);
    return memcmp(p, want, PAGE) == 0;
}

int main(int argc, char **argv) {
    size_t n = (argc > 1 ? strtoul(argv[1], NULL, 10) : 64) << 20, pages = n / PAGE, q = pages / 4;
    uint8_t *a = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED) { perror("mmap"); return 1; }
    for (size_t i = 0; i < pages; i++) fill(a + i * PAGE, i);
    /* The guarded quarter is the first one written: out by now under a limit below n. */
    if (madvise(a, q * PAGE, MADV_GUARD_INSTALL) != 0) { perror("MADV_GUARD_INSTALL"); return 77; }
    signal(SIGSEGV, on_segv);
    volatile int segv = 0;
    if (sigsetjmp(back, 1) == 0) (void)*(volatile uint8_t *)(a + PAGE); else segv = 1;
    signal(SIGSEGV, SIG_DFL);
    if (madvise(a, q * PAGE, MADV_GUARD_REMOVE) != 0) { perror("MADV_GUARD_REMOVE"); return 1; }
    size_t zero = 0, old = 0, other = 0, bad = 0;
    static const uint8_t zeros[PAGE];
    for (size_t i = 0; i < q; i++) {
        if (memcmp(a + i * PAGE, zeros, PAGE) == 0) zero++;
        else if (holds(a + i * PAGE, i)) old++;
        else other++;
    }
    for (size_t i = q; i < pages; i++) bad += !holds(a + i * PAGE, i);
    printf("guards: segv %d, zero %zu, old %zu, other %zu, bad %zu\n", segv, zero, old, other, bad);
    return !(segv && zero == q && bad == 0);
}
