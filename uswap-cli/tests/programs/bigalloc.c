/* Blocks larger than the heap's first arena, than mimalloc's default largest arena object
 * (2 GiB) and than its largest arena (16 GiB): each must succeed under uswap run as it does
 * with glibc (whose malloc only reserves address space), hold its bytes, and move through
 * realloc (growing the smallest, shrinking all) and free. Touches one page in every 64 MiB, and writes the working set of MIB
 * MiB in a block of its own so that the run pages. Prints a checksum per step.
 * Usage: bigalloc MIB */
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STEP ((size_t)64 << 20)

static uint64_t mark(size_t i) { return (i + 11) * 0x9E3779B97F4A7C15ull; }

static void fill(unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i += STEP) memcpy(p + i, &(uint64_t){mark(i)}, 8);
}

static int check(const unsigned char *p, size_t n, const char *what) {
    for (size_t i = 0; i < n; i += STEP) {
        uint64_t v;
        memcpy(&v, p + i, 8);
        if (v != mark(i)) {
            fprintf(stderr, "%s: offset %zu wrong\n", what, i);
            return 0;
        }
    }
    return 1;
}

int main(int argc, char **argv) {
    size_t wss = (argc > 1 ? strtoul(argv[1], 0, 10) : 64) << 20;
    const size_t sizes[] = {(size_t)300 << 20, (size_t)3 << 30, (size_t)17 << 30};
    for (int k = 0; k < 3; k++) {
        size_t n = sizes[k];
        unsigned char *p = k == 2 ? calloc(1, n) : malloc(n);
        if (!p) { fprintf(stderr, "allocating %zu MiB failed\n", n >> 20); return 1; }
        if (k == 2 && (p[n / 2] != 0 || p[n - 1] != 0)) { fprintf(stderr, "calloc not zero\n"); return 1; }
        fill(p, n);
        if (malloc_usable_size(p) < n) { fprintf(stderr, "usable size %zu < %zu\n", malloc_usable_size(p), n); return 1; }
        unsigned char *q = p;
        if (k == 0) { /* growing copies every page: the smallest block only */
            q = realloc(p, n + STEP);
            if (!q || !check(q, n, "after growing")) return 1;
        }
        q = realloc(q, STEP);
        if (!q || !check(q, STEP, "after shrinking")) return 1;
        free(q);
        printf("%zu MiB ok\n", n >> 20);
    }
    /* The working set: four times the limit, written and read back. */
    uint64_t *w = malloc(wss), sum = 0;
    if (!w) { perror("malloc"); return 1; }
    for (size_t i = 0; i < wss / 8; i++) w[i] = mark(i);
    for (size_t i = 0; i < wss / 8; i++) {
        if (w[i] != mark(i)) { fprintf(stderr, "word %zu wrong\n", i); return 1; }
        sum += w[i] >> 7;
    }
    printf("working set %llx\n", (unsigned long long)sum);
    return 0;
}
