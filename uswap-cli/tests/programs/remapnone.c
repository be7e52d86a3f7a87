/* mremap of managed memory the program cannot read, or that has a hole, answers as without
 * uswap: a PROT_NONE reservation moves and grows and stays PROT_NONE (a touch is SIGSEGV);
 * a range with a hole is refused with EFAULT and its data stays. Before, uswap's move
 * copied from the old range without looking and the program died of SIGSEGV in mremap.
 * A move keeps what the kernel's keeps: a locked range stays locked (every page resident
 * after other memory churned), a range marked MADV_WIPEONFORK reads zero in a fork child.
 * Usage: remapnone MIB (what is written first, to start the pager and page some of it out).
 * Prints what it saw; exits 0 when all is as without uswap. */
#define _GNU_SOURCE
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static sigjmp_buf back;
static void on_segv(int sig) { siglongjmp(back, sig); }

/* Whether reading `p` is SIGSEGV. */
static int segv_at(const volatile uint8_t *p) {
    signal(SIGSEGV, on_segv);
    int hit = sigsetjmp(back, 1) != 0;
    if (!hit) (void)*p;
    signal(SIGSEGV, SIG_DFL);
    return hit;
}

int main(int argc, char **argv) {
    size_t n = (argc > 1 ? strtoul(argv[1], NULL, 10) : 64) << 20, mib = 1 << 20;
    int rw = PROT_READ | PROT_WRITE, flags = MAP_PRIVATE | MAP_ANONYMOUS;
    uint64_t *a = mmap(NULL, n, rw, flags, -1, 0);
    if (a == MAP_FAILED) { perror("mmap"); return 1; }
    for (size_t i = 0; i < n / 8; i++) a[i] = i * 0x9E3779B97F4A7C15ull;
    uint8_t *none = mmap(NULL, 16 * mib, PROT_NONE, flags, -1, 0);
    uint8_t *moved = mremap(none, 16 * mib, 32 * mib, MREMAP_MAYMOVE);
    int moved_ok = moved != MAP_FAILED, segv = moved_ok && segv_at(moved + 20 * mib) && segv_at(moved);
    /* A hole in the middle of the range: the kernel's mremap says EFAULT. */
    uint64_t *b = mmap(NULL, 16 * mib, rw, flags, -1, 0);
    if (b == MAP_FAILED) { perror("mmap"); return 1; }
    for (size_t i = 0; i < 16 * mib / 8; i++) b[i] = ~i;
    munmap((uint8_t *)b + 8 * mib, 4096);
    int hole_efault = mremap(b, 16 * mib, 32 * mib, MREMAP_MAYMOVE) == MAP_FAILED && errno == EFAULT;
    size_t bad = 0;
    for (size_t i = 0; i < 8 * mib / 8; i++) bad += b[i] != ~i;
    for (size_t i = 0; i < n / 8; i++) bad += a[i] != i * 0x9E3779B97F4A7C15ull;
    /* A locked range moved: still locked once `a` is touched again (the limit is below n). */
    size_t lock_len = 4 * mib, resident = 0;
    uint8_t *locked = mmap(NULL, lock_len, rw, flags, -1, 0);
    for (size_t i = 0; i < lock_len; i++) locked[i] = (uint8_t)(i * 7 + 1);
    if (mlock(locked, lock_len) != 0) { perror("mlock"); return 1; }
    uint8_t *target = mmap(NULL, lock_len, rw, flags, -1, 0);
    locked = mremap(locked, lock_len, lock_len, MREMAP_MAYMOVE | MREMAP_FIXED, target);
    if (locked == MAP_FAILED) { perror("mremap locked"); return 1; }
    for (size_t i = 0; i < n / 8; i++) bad += a[i] != i * 0x9E3779B97F4A7C15ull;
    unsigned char vec[1024];
    if (mincore(locked, lock_len, vec) != 0) { perror("mincore"); return 1; }
    for (size_t i = 0; i < lock_len / 4096; i++) resident += vec[i] & 1;
    for (size_t i = 0; i < lock_len; i++) bad += locked[i] != (uint8_t)(i * 7 + 1);
    /* A wipe-on-fork range moved: a fork child sees it zero. */
    uint8_t *wipe = mmap(NULL, 4 * mib, rw, flags, -1, 0);
    for (size_t i = 0; i < 4 * mib; i++) wipe[i] = (uint8_t)(i | 1);
    madvise(wipe, 4 * mib, MADV_WIPEONFORK);
    wipe = mremap(wipe, 4 * mib, 8 * mib, MREMAP_MAYMOVE);
    pid_t child = fork();
    if (child == 0) _exit(wipe[4096] == 0 && wipe[3 * mib] == 0 ? 0 : 1);
    int status = 0;
    waitpid(child, &status, 0);
    int wiped = WIFEXITED(status) && WEXITSTATUS(status) == 0 && wipe[4096] == (uint8_t)(4096 | 1);
    printf("remapnone: moved %d, segv %d, hole efault %d, locked resident %zu of %zu, wiped %d, bad %zu\n", moved_ok,
           segv, hole_efault, resident, lock_len / 4096, wiped, bad);
    return !(moved_ok && segv && hole_efault && resident == lock_len / 4096 && wiped && bad == 0);
}
