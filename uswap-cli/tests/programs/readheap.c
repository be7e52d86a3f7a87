/* A program that reads every page of the readable mapping its heap blocks lie in, as
 * programs that scan their own address space do (stress-ng's --fork-vm children read each
 * page of each line of /proc/self/maps). Allocates MB MiB in 60 KiB blocks, each filled,
 * finds the mapping of the last block (the first ones may be the
 * C library's, from before uswap's heap came up) in /proc/self/maps, reads each of its pages, checks
 * every block and prints "readable MiB <size of that mapping>" and "ok".
 * Usage: readheap MB */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BLOCK = 60000 };

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: readheap MB\n"); return 2; }
    size_t n = (strtoul(argv[1], 0, 10) << 20) / BLOCK;
    char **b = malloc(n * sizeof *b);
    if (!b) return 1;
    for (size_t i = 0; i < n; i++) {
        if (!(b[i] = malloc(BLOCK))) return 1;
        memset(b[i], (int)(i * 7 + 1), BLOCK);
    }
    FILE *maps = fopen("/proc/self/maps", "r");
    if (!maps) return 1;
    char line[512];
    uintptr_t lo = 0, hi = 0, at = (uintptr_t)b[n - 1];
    while (fgets(line, sizeof line, maps)) {
        unsigned long s, e;
        char prot[5];
        if (sscanf(line, "%lx-%lx %4s", &s, &e, prot) == 3 && s <= at && at < e && prot[0] == 'r') {
            lo = s;
            hi = e;
        }
    }
    fclose(maps);
    if (!hi) { fprintf(stderr, "no readable mapping holds the heap block %p\n", b[n - 1]); return 1; }
    volatile uint8_t sum = 0;
    for (uintptr_t p = lo; p < hi; p += 4096) sum += *(volatile uint8_t *)p;
    for (size_t i = 0; i < n; i++) {
        if (b[i][i % BLOCK] != (char)(i * 7 + 1)) { fprintf(stderr, "block %zu changed\n", i); return 1; }
        free(b[i]);
    }
    free(b);
    printf("readable MiB %lu\nok\n", (unsigned long)((hi - lo) >> 20));
    return 0;
}
