// What runtimes do with reserved address space, each step checked byte by byte:
// reserve MIB*2 MiB with PROT_NONE, commit the first half with mmap(MAP_FIXED) and the
// rest with mprotect, fill both, uncommit a part with mmap(MAP_FIXED, PROT_NONE) and
// recommit it (it must read zero), move a filled mapping onto the reservation with
// mremap(MREMAP_FIXED), move one with MREMAP_DONTUNMAP (the old range reads zero), and
// grow a mapping in place, and make a filled mapping executable (a JIT's code buffer) once
// it was swapped out.
// Prints a checksum. Usage: reserve MIB
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(3); } } while (0)
static const int RW = PROT_READ | PROT_WRITE, ANON = MAP_PRIVATE | MAP_ANONYMOUS;

static void fill(uint64_t *p, size_t words, uint64_t seed) { for (size_t i = 0; i < words; i++) p[i] = seed ^ (i * 0x9e3779b97f4a7c15ull); }
static uint64_t check(const uint64_t *p, size_t words, uint64_t seed, const char *what) {
    uint64_t sum = 0;
    for (size_t i = 0; i < words; i++) { CHECK(p[i] == (seed ^ (i * 0x9e3779b97f4a7c15ull)), "%s: wrong word %zu", what, i); sum += p[i]; }
    return sum;
}
static void zeros(const uint64_t *p, size_t words, const char *what) { for (size_t i = 0; i < words; i++) CHECK(p[i] == 0, "%s: word %zu not zero", what, i); }

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    size_t half = (size_t)atol(argv[1]) << 20, words = half / 8, page = 4096;
    size_t code_len = 4 << 20;
    uint64_t *code = mmap(0, code_len, RW, ANON, -1, 0);
    CHECK(code != MAP_FAILED, "mmap the code buffer");
    fill(code, code_len / 8, 5);
    char *res = mmap(0, 2 * half, PROT_NONE, ANON | MAP_NORESERVE, -1, 0);
    CHECK(res != MAP_FAILED, "reserve");
    // Commit by MAP_FIXED (HotSpot, QEMU) and by mprotect (V8).
    CHECK(mmap(res, half, RW, ANON | MAP_FIXED, -1, 0) == res, "commit by MAP_FIXED");
    CHECK(mprotect(res + half, half, RW) == 0, "commit by mprotect");
    uint64_t *lo = (uint64_t *)res, *hi = (uint64_t *)(res + half);
    fill(lo, words, 1); fill(hi, words, 2);
    uint64_t sum = check(lo, words, 1, "low half") + check(hi, words, 2, "high half");
    // Uncommit 1/4 of the low half and recommit it: zeros, the rest intact.
    size_t q = half / 4;
    CHECK(mmap(res + q, q, PROT_NONE, ANON | MAP_FIXED | MAP_NORESERVE, -1, 0) == res + q, "uncommit");
    CHECK(mmap(res + q, q, RW, ANON | MAP_FIXED, -1, 0) == res + q, "recommit");
    zeros((uint64_t *)(res + q), q / 8, "recommitted");
    check(lo, q / 8, 1, "low quarter after recommit");
    // Move a filled mapping onto the high half (a reservation committed by mprotect).
    uint64_t *m = mmap(0, half, RW, ANON, -1, 0);
    CHECK(m != MAP_FAILED, "mmap to move");
    fill(m, words, 3);
    void *moved = mremap(m, half, half, MREMAP_MAYMOVE | MREMAP_FIXED, hi);
    CHECK(moved == hi, "mremap MREMAP_FIXED onto the reservation: %p", moved);
    sum += check(hi, words, 3, "moved with MREMAP_FIXED");
    // MREMAP_DONTUNMAP: the new place has the contents, the old reads zero.
    uint64_t *d = mmap(0, half, RW, ANON, -1, 0);
    CHECK(d != MAP_FAILED, "mmap for DONTUNMAP");
    fill(d, words, 4);
    uint64_t *n = mremap(d, half, half, MREMAP_MAYMOVE | MREMAP_DONTUNMAP, 0);
    CHECK(n != MAP_FAILED, "mremap MREMAP_DONTUNMAP");
    sum += check(n, words, 4, "moved with MREMAP_DONTUNMAP");
    zeros(d, words, "left behind by MREMAP_DONTUNMAP");
    d[5] = 77; CHECK(d[5] == 77, "the old range stays writable");
    // Grow in place (no MREMAP_MAYMOVE) into address space freed just after a mapping.
    uint64_t *g = mmap(0, 2 * half, RW, ANON, -1, 0);
    CHECK(g != MAP_FAILED, "mmap to grow");
    CHECK(munmap((char *)g + half, half) == 0, "free the space after it");
    fill(g, words, 6);
    CHECK(mremap(g, half, 2 * half, 0) == g, "mremap grows in place");
    zeros(g + words, words, "grown part");
    fill(g + words, words, 7);
    sum += check(g, words, 6, "grown in place, old part") + check(g + words, words, 7, "grown in place, new part");
    CHECK(munmap(g, 2 * half) == 0, "munmap the grown mapping");
    // The code buffer, swapped out by now, made executable: every byte still there.
    CHECK(mprotect(code, code_len, RW | PROT_EXEC) == 0, "mprotect the code buffer executable");
    sum += check(code, code_len / 8, 5, "code buffer made executable");
    code[7] = 7; CHECK(code[7] == 7, "the code buffer stays writable");
    CHECK(munmap(code, code_len) == 0, "munmap the code buffer");
    CHECK(munmap(res, 2 * half) == 0, "munmap the reservation");
    printf("checksum %016llx\n", (unsigned long long)sum);
    (void)page;
    return 0;
}
