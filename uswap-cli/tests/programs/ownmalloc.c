/* An executable that brings its own malloc, as rustc does with jemalloc: the C library's
 * allocation functions are defined here (forwarding to glibc's, counted), so the dynamic
 * linker finds them before any preloaded library's. Fills MIB MiB and checks every word.
 * Prints "ownmalloc: MIB MiB checked, N calls to its own malloc". Usage: ownmalloc MIB */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

extern void *__libc_malloc(size_t), *__libc_calloc(size_t, size_t), *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
static unsigned long calls;

void *malloc(size_t n) { calls++; return __libc_malloc(n); }
void *calloc(size_t k, size_t n) { calls++; return __libc_calloc(k, n); }
void *realloc(void *p, size_t n) { calls++; return __libc_realloc(p, n); }
void free(void *p) { __libc_free(p); }

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 32, words = (mib << 20) / 8;
    uint64_t *a = malloc(mib << 20);
    if (!a) { perror("malloc"); return 1; }
    for (size_t i = 0; i < words; i++) a[i] = i * 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < words; i++)
        if (a[i] != i * 0x9E3779B97F4A7C15ull) { fprintf(stderr, "word %zu wrong\n", i); return 3; }
    printf("ownmalloc: %zu MiB checked, %s calls to its own malloc\n", mib, calls ? "some" : "no");
    return 0;
}
