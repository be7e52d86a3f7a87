/* Calls the kernel refuses change nothing, and a lock larger than the limit ends.
 * MIB of words written in a mapping of their own (paged out under the limit), then:
 * munmap and mremap with lengths the kernel refuses (EINVAL: past the top of user space),
 * mlock of a range with a hole after it (ENOMEM, nothing populated; the kernel locks the
 * mapping itself, so it is unlocked after), every word checked; then mlock of the whole
 * mapping (more than the limit: it stays in, over the limit), checked again, and unlocked.
 * Prints each call's result and errno, and the count of wrong words (as without uswap).
 * Usage: refused MIB */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static size_t wrong(const uint64_t *p, size_t words) {
    size_t bad = 0;
    for (size_t i = 0; i < words; i++)
        bad += p[i] != i * 0x9E3779B97F4A7C15ull;
    return bad;
}

static void said(const char *what, long ret) {
    printf("%s: %s%s\n", what, ret == -1 ? "-1 " : "ok", ret == -1 ? strerror(errno) : "");
}

int main(int argc, char **argv) {
    size_t len = (argc > 1 ? strtoul(argv[1], NULL, 10) : 64) << 20, words = len / 8;
    const size_t huge = (size_t)1 << 62;
    uint64_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); return 2; }
    for (size_t i = 0; i < words; i++) p[i] = i * 0x9E3779B97F4A7C15ull;
    said("munmap(p, 2^62)", munmap(p, huge));
    said("munmap(4096, -8192)", munmap((void *)4096, (size_t)-8192));
    said("mremap(p, 2^62, 2^62, MAYMOVE)", mremap(p, huge, huge, MREMAP_MAYMOVE) == MAP_FAILED ? -1 : 0);
    said("mremap(p, len, 2^62, MAYMOVE)", mremap(p, len, huge, MREMAP_MAYMOVE) == MAP_FAILED ? -1 : 0);
    said("mremap(p, 2^62, 4096, 0)", mremap(p, huge, 4096, 0) == MAP_FAILED ? -1 : 0);
    said("mlock(p, 2^62)", mlock(p, huge));
    said("munlock(p, len)", munlock(p, len));
    printf("wrong words after the refused calls: %zu\n", wrong(p, words));
    said("mlock(p, len)", mlock(p, len));
    printf("wrong words while locked: %zu\n", wrong(p, words));
    said("munlock(p, len)", munlock(p, len));
    printf("wrong words after: %zu\n", wrong(p, words));
    return 0;
}
