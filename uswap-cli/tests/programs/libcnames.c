/* Allocates through the C library's own names for its allocator (`__libc_malloc`,
 * `__libc_calloc`, `__libc_realloc`, `__libc_memalign`, `__libc_free`), mixed with the
 * standard names: a block from `malloc` resized by `__libc_realloc` and freed by
 * `__libc_free`, one from `__libc_malloc` resized by `realloc` and freed by `free`, 2,000
 * times over sizes up to 200 KB, every byte checked, with MIB MiB of pseudo-random words
 * checked at the end. Prints "OK" and exits 0 when every byte held.
 *
 * What it found: `__libc_realloc` of a block from uswap's `malloc` aborted the program
 * ("realloc(): invalid pointer"). Usage: libcnames MIB */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

static int holds(const unsigned char *p, size_t n, unsigned char v) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != v) return 0;
    return 1;
}

int main(int argc, char **argv) {
    size_t words = (argc > 1 ? strtoul(argv[1], 0, 10) : 32) << 17;
    uint64_t *big = malloc(words * sizeof *big);
    if (!big) { perror("malloc"); return 1; }
    for (size_t i = 0; i < words; i++) big[i] = i * 0x9E3779B97F4A7C15ULL;
    for (int r = 0; r < 2000; r++) {
        size_t n = (size_t)r * 7919 % 200000 + 1;
        unsigned char v = (unsigned char)r;
        unsigned char *a = malloc(n), *b = __libc_malloc(n), *c = __libc_calloc(1, n);
        unsigned char *d = __libc_memalign(64, n);
        if (!a || !b || !c || !d || ((uintptr_t)d & 63) || !holds(c, n, 0)) { fprintf(stderr, "round %d: bad block\n", r); return 1; }
        memset(a, v, n), memset(b, v, n), memset(d, v, n);
        a = __libc_realloc(a, 2 * n);
        b = realloc(b, 2 * n);
        if (!a || !b || !holds(a, n, v) || !holds(b, n, v) || !holds(d, n, v)) { fprintf(stderr, "round %d: bytes lost\n", r); return 1; }
        __libc_free(a), free(b), free(c), __libc_free(d);
    }
    for (size_t i = 0; i < words; i++)
        if (big[i] != i * 0x9E3779B97F4A7C15ULL) { fprintf(stderr, "word %zu wrong\n", i); return 1; }
    printf("OK\n");
    return 0;
}
