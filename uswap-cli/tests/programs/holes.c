/* Mappings placed in the holes of a managed mapping the program unmapped in part: one at
 * the mapping's own start (two managed mappings then start at one address) and one in its
 * middle. Each keeps its own bytes through pressure (MIB of heap written after them), a
 * fork (the child reads all of them), and the unmapping of the others, whole or in part.
 * Usage: holes MIB */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define BIG_BYTES (16 << 20)
#define HOLE_BYTES (1 << 20)

static uint8_t byte_of(size_t i, unsigned tag) { return (uint8_t)((i * 2654435761u) >> 13) ^ (uint8_t)(tag * 37); }

static void fill(uint8_t *p, size_t len, unsigned tag) {
    for (size_t i = 0; i < len; i++) p[i] = byte_of(i, tag);
}

/* The bytes of [p, p + len) that are not what fill(tag) wrote. */
static size_t wrong(const uint8_t *p, size_t len, unsigned tag) {
    size_t n = 0;
    for (size_t i = 0; i < len; i++) n += p[i] != byte_of(i, tag);
    return n;
}

static uint8_t *map_at(uint8_t *at, size_t len) {
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE;
    uint8_t *p = mmap(at, len, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p != at) { perror("mmap in a hole"); exit(1); }
    return p;
}

int main(int argc, char **argv) {
    size_t heap_bytes = (argc > 1 ? strtoul(argv[1], NULL, 10) : 64) << 20;
    uint8_t *big = mmap(NULL, BIG_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (big == MAP_FAILED) { perror("mmap"); return 1; }
    fill(big, BIG_BYTES, 1);
    uint8_t *mid = big + BIG_BYTES / 2;
    if (munmap(big, HOLE_BYTES) || munmap(mid, HOLE_BYTES)) { perror("munmap"); return 1; }
    uint8_t *first = map_at(big, HOLE_BYTES), *middle = map_at(mid, HOLE_BYTES);
    fill(first, HOLE_BYTES, 2);
    fill(middle, HOLE_BYTES, 3);
    uint8_t *heap = malloc(heap_bytes);
    if (!heap) { perror("malloc"); return 1; }
    fill(heap, heap_bytes, 4);
    /* big's own bytes: [HOLE, BIG/2) and [BIG/2 + HOLE, BIG), checked against fill(1). */
    size_t lo_off = HOLE_BYTES, hi_off = BIG_BYTES / 2 + HOLE_BYTES;
    size_t lo_len = BIG_BYTES / 2 - HOLE_BYTES, hi_len = BIG_BYTES / 2 - HOLE_BYTES;
    size_t big_wrong = 0;
    for (size_t i = lo_off; i < lo_off + lo_len; i++) big_wrong += big[i] != byte_of(i, 1);
    for (size_t i = hi_off; i < hi_off + hi_len; i++) big_wrong += big[i] != byte_of(i, 1);
    fflush(stdout);
    pid_t child = fork();
    if (child < 0) { perror("fork"); return 1; }
    if (child == 0) {
        size_t n = 0;
        for (size_t i = lo_off; i < lo_off + lo_len; i++) n += big[i] != byte_of(i, 1);
        for (size_t i = hi_off; i < hi_off + hi_len; i++) n += big[i] != byte_of(i, 1);
        printf("child: big %zu, first %zu, middle %zu, heap %zu wrong\n", n, wrong(first, HOLE_BYTES, 2),
               wrong(middle, HOLE_BYTES, 3), wrong(heap, heap_bytes, 4));
        /* The child lets go of the mapping at big's start: the rest stays its own. */
        if (munmap(first, HOLE_BYTES)) { perror("munmap"); _exit(1); }
        n = 0;
        for (size_t i = lo_off; i < lo_off + lo_len; i++) n += big[i] != byte_of(i, 1);
        printf("child after unmapping first: big %zu, middle %zu wrong\n", n, wrong(middle, HOLE_BYTES, 3));
        fflush(stdout);
        _exit(0);
    }
    int status = 0;
    if (waitpid(child, &status, 0) != child) { perror("waitpid"); return 1; }
    printf("parent: big %zu, child status %d\n", big_wrong, status);
    /* The mapping at big's start goes whole, then big's lower part, then the middle one. */
    if (munmap(first, HOLE_BYTES)) { perror("munmap"); return 1; }
    size_t n = 0;
    for (size_t i = lo_off; i < lo_off + lo_len; i++) n += big[i] != byte_of(i, 1);
    for (size_t i = hi_off; i < hi_off + hi_len; i++) n += big[i] != byte_of(i, 1);
    printf("after first: big %zu, middle %zu, heap %zu wrong\n", n, wrong(middle, HOLE_BYTES, 3),
           wrong(heap, heap_bytes, 4));
    if (munmap(big + lo_off, lo_len)) { perror("munmap"); return 1; }
    n = 0;
    for (size_t i = hi_off; i < hi_off + hi_len; i++) n += big[i] != byte_of(i, 1);
    printf("after big's lower part: big %zu, middle %zu wrong\n", n, wrong(middle, HOLE_BYTES, 3));
    /* A new mapping where the first was: it reads zero, and the rest keeps its bytes. */
    uint8_t *again = map_at(big, HOLE_BYTES);
    size_t nonzero = 0;
    for (size_t i = 0; i < HOLE_BYTES; i++) nonzero += again[i] != 0;
    fill(again, HOLE_BYTES, 5);
    printf("again: %zu nonzero, %zu wrong; middle %zu wrong\n", nonzero, wrong(again, HOLE_BYTES, 5),
           wrong(middle, HOLE_BYTES, 3));
    return 0;
}
