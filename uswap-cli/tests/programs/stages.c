/* Allocates and writes N MiB with malloc (argv[1], 0 for none), after clearing its own
 * environment if argv[2] is "clear", then says which of uswap's libraries its address space
 * maps: "shim 1 engine 0" for a process that never needed the engine. Used by tests/tree.rs. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 0;
    if (argc > 2 && strcmp(argv[2], "clear") == 0) clearenv();
    char *p = mib ? malloc(mib << 20) : NULL;
    if (mib && !p) return 2;
    if (p) memset(p, 1, mib << 20);
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return 3;
    char line[4096];
    int shim = 0, engine = 0;
    while (fgets(line, sizeof line, f)) {
        shim |= strstr(line, "libuswap_shim.so") != NULL;
        engine |= strstr(line, "libuswap_preload.so") != NULL;
    }
    fclose(f);
    printf("shim %d engine %d\n", shim, engine);
    free(p);
    return 0;
}
