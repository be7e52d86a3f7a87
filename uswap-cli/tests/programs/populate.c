/* madvise(MADV_POPULATE_WRITE / _READ) and MAP_POPULATE on managed memory succeed as
 * without uswap, also over pages that are out (in signal mode the kernel's own faults fail:
 * the calls returned EFAULT), and leave every byte as it was. MAP_POPULATE with an address
 * hint (a mapping the kernel makes and uswap adopts) keeps to the limit: the kernel
 * populated all of it before uswap took it over.
 * Usage: populate MIB */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#define MADV_POPULATE_WRITE 23
#endif

int main(int argc, char **argv) {
    size_t n = (argc > 1 ? strtoul(argv[1], NULL, 10) : 64) << 20;
    int prot = PROT_READ | PROT_WRITE, flags = MAP_PRIVATE | MAP_ANONYMOUS;
    uint8_t *a = mmap(NULL, n, prot, flags, -1, 0), *b = mmap(NULL, n, prot, flags | MAP_POPULATE, -1, 0);
    uint8_t *c = mmap((void *)0x500000000000UL, n, prot, flags | MAP_POPULATE, -1, 0);
    if (a == MAP_FAILED || b == MAP_FAILED || c == MAP_FAILED) { perror("mmap"); return 1; }
    int r1 = madvise(a, n, MADV_POPULATE_WRITE), e1 = errno;
    for (size_t i = 0; i < n; i++) a[i] = (uint8_t)(i * 3), b[i] = (uint8_t)(i * 5), c[i] = (uint8_t)(i * 7);
    /* a's first pages are out by now: populated again, for reading, then for writing. */
    int r2 = madvise(a, n, MADV_POPULATE_READ), e2 = errno;
    int r3 = madvise(a, n, MADV_POPULATE_WRITE), e3 = errno;
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++) s = s * 31 + a[i] + b[i] + c[i];
    printf("populate write %d (errno %d), read %d (%d), write %d (%d), sum %llu\n", r1, r1 ? e1 : 0, r2, r2 ? e2 : 0,
           r3, r3 ? e3 : 0, (unsigned long long)s);
    return r1 || r2 || r3;
}
