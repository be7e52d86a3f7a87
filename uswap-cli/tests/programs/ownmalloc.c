/* An executable that brings its own malloc, as rustc does with jemalloc: the C library's
 * allocation functions are defined here (forwarding to glibc's, counted), so the dynamic
 * linker finds them before any preloaded library's. Fills MIB MiB and checks every word,
 * then has the C library allocate for it (strdup) and grows a block with reallocarray,
 * which the C library (or an interposer) must serve with this realloc, the block being
 * this allocator's. Prints "ownmalloc: MIB MiB checked, the C library used its malloc: yes,
 * reallocarray used its realloc: yes". Usage: ownmalloc MIB */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern void *__libc_malloc(size_t), *__libc_calloc(size_t, size_t), *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
/* Seen by the compiler as changed by any call: strdup and reallocarray call back here. */
volatile unsigned long mallocs, reallocs;

void *malloc(size_t n) { mallocs++; return __libc_malloc(n); }
void *calloc(size_t k, size_t n) { mallocs++; return __libc_calloc(k, n); }
void *realloc(void *p, size_t n) { reallocs++; return __libc_realloc(p, n); }
void free(void *p) { __libc_free(p); }

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 32, words = (mib << 20) / 8;
    uint64_t *a = malloc(mib << 20);
    if (!a) { perror("malloc"); return 1; }
    for (size_t i = 0; i < words; i++) a[i] = i * 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < words; i++)
        if (a[i] != i * 0x9E3779B97F4A7C15ull) { fprintf(stderr, "word %zu wrong\n", i); return 3; }
    unsigned long before = mallocs;
    char *s = strdup(argv[0]);
    int libc_used = mallocs > before;
    before = reallocs;
    char *grown = reallocarray(s, 4096, 2);
    if (!grown) { perror("reallocarray"); return 1; }
    int realloc_used = reallocs > before;
    free(grown);
    printf("ownmalloc: %zu MiB checked, the C library used its malloc: %s, reallocarray used its realloc: %s\n",
           mib, libc_used ? "yes" : "no", realloc_used ? "yes" : "no");
    return 0;
}
