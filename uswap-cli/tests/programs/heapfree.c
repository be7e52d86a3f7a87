/* The heap gives freed memory back: ROUNDS times, MB MiB of 60 KiB blocks (mimalloc's
 * medium pages, not blocks of their own), each filled and checked, all freed, then a pause
 * longer than mimalloc's purge delay: the next round's frees free pages, and each page
 * freed purges what expired meanwhile. Prints "ok".
 * Usage: heapfree MB ROUNDS */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { BLOCK = 60000 };

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: heapfree MB ROUNDS\n"); return 2; }
    size_t n = (strtoul(argv[1], 0, 10) << 20) / BLOCK;
    int rounds = atoi(argv[2]);
    char **b = malloc(n * sizeof *b);
    if (!b) return 1;
    for (int r = 0; r < rounds; r++) {
        for (size_t i = 0; i < n; i++) {
            if (!(b[i] = malloc(BLOCK))) return 1;
            memset(b[i], (int)(i * 7 + r + 1), BLOCK);
        }
        for (size_t i = 0; i < n; i++) {
            if (b[i][i % BLOCK] != (char)(i * 7 + r + 1)) { fprintf(stderr, "block %zu changed\n", i); return 1; }
            free(b[i]);
        }
        struct timespec t = {0, 100 * 1000 * 1000};
        nanosleep(&t, 0);
    }
    free(b);
    puts("ok");
    return 0;
}
