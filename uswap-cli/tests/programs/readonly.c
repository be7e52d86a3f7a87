/* Mappings whose properties the kernel keeps, under uswap: 16 MiB written then made
 * read-only (mprotect: the kernel will not let uswap move its pages out, which must not
 * break the limit), 1 MiB mapped MAP_LOCKED (which must stay resident), and 8 MiB mapped
 * MAP_32BIT (which must lie below 2 GiB); then MIB of heap written and read twice. Prints
 * the sums, whether the locked mapping stayed resident throughout (mincore), and where the
 * 32-bit one lies. With "unseal", the read-only mapping is made writable again at once (it
 * stays the kernel's: the report must still say why).
 * Usage: readonly MIB [unseal] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define RO_BYTES (16 << 20)
#define LOCKED_BYTES (1 << 20)
#define LOW_BYTES (8 << 20)

static int resident(const uint8_t *p, size_t len) {
    static unsigned char vec[LOCKED_BYTES / 4096];
    if (mincore((void *)p, len, vec)) { perror("mincore"); exit(4); }
    for (size_t i = 0; i < len / 4096; i++)
        if (!(vec[i] & 1)) return 0;
    return 1;
}

int main(int argc, char **argv) {
    size_t big_bytes = (argc > 1 ? strtoul(argv[1], NULL, 10) : 64) << 20;
    int prot = PROT_READ | PROT_WRITE, flags = MAP_PRIVATE | MAP_ANONYMOUS;
    uint8_t *ro = mmap(NULL, RO_BYTES, prot, flags, -1, 0);
    uint8_t *locked = mmap(NULL, LOCKED_BYTES, prot, flags | MAP_LOCKED, -1, 0);
    uint8_t *low = mmap(NULL, LOW_BYTES, prot, flags | MAP_32BIT, -1, 0);
    if (ro == MAP_FAILED || locked == MAP_FAILED || low == MAP_FAILED) { perror("mmap"); return 1; }
    for (size_t i = 0; i < LOW_BYTES; i++) low[i] = (uint8_t)(i * 11 + 3);
    for (size_t i = 0; i < RO_BYTES; i++) ro[i] = (uint8_t)(i * 3 + 1);
    for (size_t i = 0; i < LOCKED_BYTES; i++) locked[i] = (uint8_t)(i * 5 + 2);
    if (mprotect(ro, RO_BYTES, PROT_READ)) { perror("mprotect"); return 2; }
    if (argc > 2 && !strcmp(argv[2], "unseal") && mprotect(ro, RO_BYTES, PROT_READ | PROT_WRITE)) {
        perror("mprotect");
        return 2;
    }
    uint8_t *big = malloc(big_bytes);
    if (!big) { perror("malloc"); return 1; }
    for (size_t i = 0; i < big_bytes; i++) big[i] = (uint8_t)(i * 7);
    uint64_t s = 0;
    int held = resident(locked, LOCKED_BYTES);
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < RO_BYTES; i++) s = s * 31 + ro[i];
        for (size_t i = 0; i < big_bytes; i++) s = s * 31 + big[i];
        held &= resident(locked, LOCKED_BYTES);
    }
    for (size_t i = 0; i < LOCKED_BYTES; i++) s = s * 31 + locked[i];
    for (size_t i = 0; i < LOW_BYTES; i++) s = s * 31 + low[i];
    int below = (uintptr_t)low + LOW_BYTES <= (1ull << 31);
    printf("sum %llu, 32-bit mapping below 2 GiB: %s, locked mapping resident throughout: %s\n",
           (unsigned long long)s, below ? "yes" : "no", held ? "yes" : "no");
    return 0;
}
