/* Two arenas of 4 MiB mapped while the process waits for its pager (deferred), then two
 * calls of mprotect(PROT_READ) that fail and change nothing: one at an address that is not
 * page-aligned (EINVAL), one starting at a hole just below the second arena (ENOMEM). Then
 * a thread, which starts the pager. Both arenas must be taken over whole (`uswap run`'s
 * mmap_managed_bytes: 8 MiB), and every byte read back.
 *
 * Prints the two calls' results, then "OK" or "FAIL"; exits 0 on OK. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#define MiB (1UL << 20)

static void *nothing(void *arg) {
    return arg;
}

int main(void) {
    unsigned char *a = mmap(0, 4 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *below = mmap(0, 4 * MiB + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED || below == MAP_FAILED) {
        perror("mmap");
        return 2;
    }
    munmap(below, 4096);
    unsigned char *b = below + 4096;
    memset(a, 0x5a, 4 * MiB);
    memset(b, 0xa5, 4 * MiB);
    int r1 = mprotect(a + 100, 4096, PROT_READ);
    int e1 = errno;
    int r2 = mprotect(b - 4096, 4 * MiB, PROT_READ);
    int e2 = errno;
    printf("mprotect unaligned: %d %s; mprotect from a hole: %d %s\n", r1, r1 ? strerror(e1) : "ok", r2,
           r2 ? strerror(e2) : "ok");
    pthread_t t;
    pthread_create(&t, 0, nothing, 0);
    pthread_join(t, 0);
    /* Written again after the start, so that the pages are the pager's to keep. */
    memset(a, 0x3c, 4 * MiB);
    memset(b, 0xc3, 4 * MiB);
    int bad = 0;
    for (size_t i = 0; i < 4 * MiB; i++) bad |= a[i] != 0x3c || b[i] != 0xc3;
    puts(bad ? "FAIL" : "OK");
    return bad;
}
