/* A working set that drops: random reads and writes over BIG MiB for S1 seconds, then over
 * its first SMALL MiB for S2 seconds, then every word checked. Half of each page holds
 * pseudo-random words, half text (lz4 keeps about 60 % of it); word 0 of a page counts its
 * writes, also kept in a table beside. Prints "drop" when the working set drops, then "ok".
 * Usage: shrink BIG SMALL S1 S2 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Word i's content (word 0 of each page aside): random in the first half of its page, four
 * letters of a 16-letter alphabet in each byte of the second. */
static uint64_t content(size_t i) {
    uint64_t r = mix(i);
    if (i % 512 < 256) return r;
    uint64_t w = 0;
    for (int k = 0; k < 8; k++) w |= (uint64_t)('a' + ((r >> (4 * k)) & 15)) << (8 * k);
    return w;
}

int main(int argc, char **argv) {
    if (argc != 5) { fprintf(stderr, "usage: shrink BIG SMALL S1 S2\n"); return 2; }
    size_t big = strtoul(argv[1], 0, 10) << 20, small = strtoul(argv[2], 0, 10) << 20;
    double phase_s[2] = {atof(argv[3]), atof(argv[4])};
    size_t nr_pages = big / 4096;
    uint64_t *a = malloc(big);
    uint32_t *writes = calloc(nr_pages, sizeof *writes);
    if (!a || !writes) { perror("malloc"); return 1; }
    for (size_t i = 0; i < big / 8; i++) a[i] = i % 512 ? content(i) : 0;
    uint64_t s = 88172645463325252ull;
    for (int ph = 0; ph < 2; ph++) {
        size_t np = (ph == 0 ? big : small) / 4096;
        if (ph == 1) { printf("drop\n"); fflush(stdout); }
        for (double start = now(); now() - start < phase_s[ph];) {
            for (int k = 0; k < 4096; k++) {
                s ^= s << 13; s ^= s >> 7; s ^= s << 17;
                size_t p = s % np, w = (s >> 32) % 511 + 1;
                if (s >> 63) { a[p * 512]++; writes[p]++; }
                else if (a[p * 512 + w] != content(p * 512 + w)) { fprintf(stderr, "page %zu wrong\n", p); return 3; }
            }
        }
    }
    for (size_t i = 0; i < big / 8; i++) {
        uint64_t want = i % 512 ? content(i) : writes[i / 512];
        if (a[i] != want) { fprintf(stderr, "word %zu wrong at the end\n", i); return 3; }
    }
    printf("ok\n");
    return 0;
}
