/* Random access over a working set: fill MIB of memory page by page, then make ACCESSES
 * random word accesses (each a read, then with a chance of WRITES in 256 a write of a new
 * value: by default 52, about 20 %), checking every read against what was written, and print
 * a checksum. Its output depends only on its arguments.
 * Usage: randrw MIB ACCESSES [SEED [WRITES]] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Each word's value: its index mixed with the number of times it was written. */
static uint64_t value(uint64_t i, uint64_t gen) { return (i + 1) * 0x9E3779B97F4A7C15ull ^ (gen << 48); }

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 256;
    uint64_t accesses = argc > 2 ? strtoull(argv[2], 0, 10) : 1000000;
    uint64_t x = argc > 3 ? strtoull(argv[3], 0, 10) : 88172645463325252ull;
    unsigned writes = argc > 4 ? strtoul(argv[4], 0, 10) : 52;
    size_t words = (mib << 20) / 8;
    uint64_t *a = malloc(words * 8);
    /* One write generation per 4 KiB page (the generation of word i is gen[i / 512]). */
    uint16_t *gen = calloc(words / 512 + 1, sizeof *gen);
    if (!a || !gen) { perror("malloc"); return 1; }
    for (size_t i = 0; i < words; i++) a[i] = value(i, 0);
    uint64_t sum = 0;
    for (uint64_t n = 0; n < accesses; n++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        /* A page at random, and the same word in it for every access to that page, so that
         * the page's generation tells the expected value. */
        size_t page = (x >> 8) % (words / 512), i = page * 512 + (page * 7919) % 512;
        if (a[i] != value(i, gen[page])) {
            fprintf(stderr, "access %llu: word %zu wrong\n", (unsigned long long)n, i);
            return 3;
        }
        if ((x & 0xff) < writes) a[i] = value(i, ++gen[page]);
        sum += a[i] >> 3;
    }
    /* Every word, once more. */
    for (size_t i = 0; i < words; i++) {
        if (a[i] != value(i, i % 512 == (i / 512 * 7919) % 512 ? gen[i / 512] : 0)) {
            fprintf(stderr, "final check: word %zu wrong\n", i);
            return 3;
        }
        sum ^= a[i];
    }
    printf("randrw %zu MiB, %llu accesses: checksum %016llx\n", mib, (unsigned long long)accesses,
           (unsigned long long)sum);
    return 0;
}
