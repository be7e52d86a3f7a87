/* Maps N arenas of 1 MiB with mmap, as CPython's object allocator does, and fills each byte
 * with a function of its place; with FREE 1, unmaps every other arena and maps one more in
 * the first hole's place; then checks every byte of what it holds and prints a checksum.
 * Usage: arenas N FREE */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#define ARENA (1 << 20)

static unsigned char expected(size_t a, size_t i) { return (unsigned char)(a * 13 + i * 7 + (i >> 11)); }

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoul(argv[1], 0, 10) : 32;
    int free_some = argc > 2 && atoi(argv[2]);
    unsigned char **arenas = calloc(n + 1, sizeof *arenas);
    if (!arenas) { perror("calloc"); return 1; }
    for (size_t a = 0; a < n; a++) {
        arenas[a] = mmap(0, ARENA, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (arenas[a] == MAP_FAILED) { perror("mmap"); return 1; }
        for (size_t i = 0; i < ARENA; i++) arenas[a][i] = expected(a, i);
    }
    if (free_some) {
        for (size_t a = 0; a < n; a += 2) {
            if (munmap(arenas[a], ARENA)) { perror("munmap"); return 1; }
            arenas[a] = 0;
        }
        arenas[n] = mmap(0, ARENA, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (arenas[n] == MAP_FAILED) { perror("mmap"); return 1; }
        for (size_t i = 0; i < ARENA; i++) arenas[n][i] = expected(n, i);
    }
    uint64_t sum = 0;
    for (size_t a = 0; a <= n; a++) {
        if (!arenas[a]) continue;
        for (size_t i = 0; i < ARENA; i++) {
            if (arenas[a][i] != expected(a, i)) { fprintf(stderr, "arena %zu byte %zu wrong\n", a, i); return 3; }
            sum = sum * 31 + arenas[a][i];
        }
    }
    printf("checksum %llx\n", (unsigned long long)sum);
    return 0;
}
