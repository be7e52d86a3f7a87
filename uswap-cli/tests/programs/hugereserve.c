// What GHC's runtime does with its heap, each step checked byte by byte: reserve 1 TiB
// (PROT_NONE, MAP_NORESERVE), discard all of it and leave it out of core dumps, then commit
// MIB MiB at its start 1 MiB at a time with mmap(MAP_FIXED), fill and check it, and discard
// one piece (it must read zero), then fork three times (each child checks a word of some
// pages and exits). Prints a checksum on stdout, and on stderr the process's peak resident
// memory ("hwm_kib N"), which a page table written for the whole reservation (8 bytes a
// page: 2 GiB) would show, and its slowest fork and wait ("fork_ms N"), which a scan of
// the whole table would show.
// Usage: hugereserve MIB
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(3); } } while (0)
static const size_t PIECE = 1 << 20;

static uint64_t word(size_t i) { uint64_t x = i * 0x9e3779b97f4a7c15ull; return x ^ (x >> 29) ^ (x << 17); }

static long hwm_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmHWM:", 6) == 0) kib = atol(line + 6);
    if (f) fclose(f);
    return kib;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    size_t len = (size_t)atol(argv[1]) << 20, reserve = (size_t)1 << 40, words = len / 8;
    char *res = mmap(0, reserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    CHECK(res != MAP_FAILED, "reserve 1 TiB");
    CHECK(madvise(res, reserve, MADV_DONTNEED) == 0, "discard the reservation");
    CHECK(madvise(res, reserve, MADV_DONTDUMP) == 0, "leave the reservation out of core dumps");
    for (size_t at = 0; at < len; at += PIECE) {
        CHECK(mmap(res + at, PIECE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == res + at,
              "commit at %zu", at);
        CHECK(madvise(res + at, PIECE, MADV_WILLNEED) == 0 && madvise(res + at, PIECE, MADV_DODUMP) == 0, "advise");
    }
    uint64_t *p = (uint64_t *)res, sum = 0;
    for (size_t i = 0; i < words; i++) p[i] = word(i);
    for (size_t i = 0; i < words; i++) { CHECK(p[i] == word(i), "wrong word %zu", i); sum += p[i]; }
    // Discard the second piece: it reads zero, the others keep their words.
    CHECK(madvise(res + PIECE, PIECE, MADV_DONTNEED) == 0, "discard a piece");
    for (size_t i = 0; i < words; i++) {
        uint64_t want = i >= PIECE / 8 && i < 2 * PIECE / 8 ? 0 : word(i);
        CHECK(p[i] == want, "after the discard: wrong word %zu", i);
        sum += p[i];
    }
    double slowest_ms = 0;
    for (int k = 0; k < 3; k++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        pid_t child = fork();
        CHECK(child >= 0, "fork");
        if (child == 0) {
            // A word of one page in 64 (the child shares the parent's pages until it exits).
            for (size_t i = 2 * PIECE / 8; i < words; i += 64 * 512)
                if (p[i] != word(i)) _exit(3);
            _exit(0);
        }
        int status;
        CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "the child read a wrong word (status %d)", status);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
        if (ms > slowest_ms) slowest_ms = ms;
    }
    printf("%llu\n", (unsigned long long)sum);
    fprintf(stderr, "hwm_kib %ld\nfork_ms %.0f\n", hwm_kib(), slowest_ms);
    return 0;
}
