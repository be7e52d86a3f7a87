/* A program that reads every page of every readable mapping of its address space, as
 * programs that scan their own memory do (stress-ng's --fork-vm children; a memory
 * scanner), after writing MB MiB of its own, so that a pager is paging under uswap run.
 * Under uswap, the engine's own mappings are among them: an empty page of a staging area
 * used to be a SIGBUS that killed the reader. Prints "readable MiB <total read>", checks
 * every page it wrote, and prints "ok".
 * Usage: readmaps MB */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PAGE = 4096, MAX_LINES = 8192 };

static unsigned long lo[MAX_LINES], hi[MAX_LINES];

static uint8_t pattern(size_t page) { return (uint8_t)(page * 2654435761u >> 13) | 1; }

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: readmaps MB\n"); return 2; }
    size_t len = strtoul(argv[1], 0, 10) << 20;
    uint8_t *buf = malloc(len);
    if (!buf) return 1;
    for (size_t p = 0; p < len / PAGE; p++) memset(buf + p * PAGE, pattern(p), PAGE);
    /* The list first, then the reads: reading may map (a pager's, a stdio buffer's). */
    FILE *maps = fopen("/proc/self/maps", "r");
    if (!maps) return 1;
    char line[512];
    int n = 0;
    while (n < MAX_LINES && fgets(line, sizeof line, maps)) {
        char prot[5];
        if (sscanf(line, "%lx-%lx %4s", &lo[n], &hi[n], prot) != 3 || prot[0] != 'r') continue;
        if (strstr(line, "[vvar") || strstr(line, "[vsyscall]")) continue;
        n++;
    }
    fclose(maps);
    volatile uint8_t sum = 0;
    unsigned long pages = 0;
    for (int i = 0; i < n; i++)
        for (unsigned long a = lo[i]; a < hi[i]; a += PAGE, pages++) sum += *(volatile uint8_t *)a;
    for (size_t p = 0; p < len / PAGE; p++)
        for (size_t k = 0; k < PAGE; k += 512)
            if (buf[p * PAGE + k] != pattern(p)) { fprintf(stderr, "page %zu changed\n", p); return 1; }
    printf("readable MiB %lu\nok\n", pages * PAGE >> 20);
    return 0;
}
