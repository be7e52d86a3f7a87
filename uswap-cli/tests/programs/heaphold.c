/* Fills MIB of heap in blocks of 64 KiB from malloc (never a mapping of its own), each byte
 * a function of its place, holds it HOLD_MS, then checks every byte and prints a checksum.
 * On stderr it says how many bytes a block of 4,100 bytes holds, allocated after the fill:
 * which allocator served it (the C library's 4,104, mimalloc's size class 5,120).
 * Usage: heaphold MIB HOLD_MS */
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define BLOCK (64 << 10)

int main(int argc, char **argv) {
    size_t nr = (argc > 1 ? strtoul(argv[1], 0, 10) : 32) * ((1 << 20) / BLOCK);
    long hold_ms = argc > 2 ? strtol(argv[2], 0, 10) : 0;
    unsigned char **blocks = calloc(nr, sizeof *blocks);
    if (!blocks) { perror("calloc"); return 1; }
    for (size_t b = 0; b < nr; b++) {
        if (!(blocks[b] = malloc(BLOCK))) { perror("malloc"); return 1; }
        for (size_t i = 0; i < BLOCK; i++) blocks[b][i] = (unsigned char)(b * 7 + i * 131 + (i >> 9));
    }
    void *probe = malloc(4100);
    if (!probe) { perror("malloc"); return 1; }
    fprintf(stderr, "heaphold %s MiB: a block of 4100 bytes holds %zu\n", argc > 1 ? argv[1] : "32", malloc_usable_size(probe));
    free(probe);
    struct timespec t = {hold_ms / 1000, (hold_ms % 1000) * 1000000L};
    nanosleep(&t, 0);
    uint64_t sum = 0;
    for (size_t b = 0; b < nr; b++) {
        for (size_t i = 0; i < BLOCK; i++) {
            if (blocks[b][i] != (unsigned char)(b * 7 + i * 131 + (i >> 9))) {
                fprintf(stderr, "block %zu byte %zu wrong\n", b, i);
                return 3;
            }
            sum = sum * 31 + blocks[b][i];
        }
    }
    printf("%zu blocks, checksum %llx\n", nr, (unsigned long long)sum);
    return 0;
}
