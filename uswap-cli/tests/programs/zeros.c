/* Frees memory three ways and checks it reads back as zeros, never stale: MADV_DONTNEED and
 * MADV_FREE on parts of an mmap, and munmap + mmap of the same range. Usage: zeros MIB */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static void fill(unsigned char *p, size_t n, unsigned char v) { memset(p, v, n); }

static void expect(const unsigned char *p, size_t n, unsigned char v, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != v) { fprintf(stderr, "%s: byte %zu is %d, expected %d\n", what, i, p[i], v); exit(3); }
}

int main(int argc, char **argv) {
    size_t bytes = (argc > 1 ? strtoul(argv[1], 0, 10) : 64) << 20, q = bytes / 4;
    unsigned char *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) { perror("mmap"); return 1; }
    fill(m, bytes, 0xA5);
    /* Everything written, most of it now swapped out. */
    if (madvise(m, q, MADV_DONTNEED)) { perror("MADV_DONTNEED"); return 1; }
    if (madvise(m + q, q, MADV_FREE)) { perror("MADV_FREE"); return 1; }
    expect(m, q, 0, "after MADV_DONTNEED");
    /* MADV_FREE may keep the old contents or give zeros; never anything else. */
    for (size_t i = q; i < 2 * q; i++)
        if (m[i] != 0 && m[i] != 0xA5) { fprintf(stderr, "after MADV_FREE: byte %zu is %d\n", i, m[i]); return 3; }
    expect(m + 2 * q, 2 * q, 0xA5, "untouched half");
    void *again = m + 2 * q;
    if (munmap(again, 2 * q)) { perror("munmap"); return 1; }
    unsigned char *n = mmap(again, 2 * q, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (n == MAP_FAILED) { perror("mmap again"); return 1; }
    expect(n, 2 * q, 0, "after munmap + mmap");
    fill(m, q, 0x5A);
    expect(m, q, 0x5A, "rewritten");
    printf("zeros ok over %zu bytes\n", bytes);
    return 0;
}
