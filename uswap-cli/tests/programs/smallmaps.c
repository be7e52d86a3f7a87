/* Memory a process holds outside any region uswap would manage, and nothing else: MIB MiB
 * in 8 KiB anonymous mappings ("maps", below the default --min-size of 16 KiB) or in the
 * program's own break ("break"), every page written, then read back and checked. Its heap
 * stays small, so only that memory can start its pager (lazy start).
 * Prints "smallmaps: MIB MiB checked" and exits 0.
 * usage: smallmaps maps|break MIB */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PIECE 8192

int main(int argc, char **argv) {
    if (argc != 3) return 64;
    size_t bytes = (size_t)atol(argv[2]) << 20, nr = bytes / PIECE;
    int in_break = strcmp(argv[1], "break") == 0;
    uint64_t **piece = calloc(nr, sizeof *piece);
    char *brk_start = in_break ? sbrk((intptr_t)bytes) : NULL;
    if (!piece || brk_start == (void *)-1) { perror("allocation"); return 1; }
    for (size_t i = 0; i < nr; i++) {
        piece[i] = in_break ? (uint64_t *)(brk_start + i * PIECE)
                            : mmap(NULL, PIECE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (piece[i] == MAP_FAILED) { perror("mmap"); return 1; }
        for (size_t w = 0; w < PIECE / 8; w += 512) piece[i][w] = i * 0x9E3779B97F4A7C15ull + w;
    }
    for (size_t i = 0; i < nr; i++)
        for (size_t w = 0; w < PIECE / 8; w += 512)
            if (piece[i][w] != i * 0x9E3779B97F4A7C15ull + w) { printf("piece %zu wrong\n", i); return 1; }
    printf("smallmaps: %s MiB checked\n", argv[2]);
    return 0;
}
