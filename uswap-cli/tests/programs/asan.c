/* A program built with -fsanitize=address. "ok": writes and checks 16 MiB of malloc'd
 * memory, half pseudo-random; "overflow": writes one byte past a 16-byte block, which
 * AddressSanitizer must report. Says whether LD_PRELOAD still names the runtime. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "overflow") == 0) {
        volatile char *p = malloc(16);
        p[16 + (argc > 5)] = 1;
        printf("not caught\n");
        return 0;
    }
    size_t n = (size_t)16 << 20;
    uint64_t *p = malloc(n), x = 88172645463325252ull, sum = 0;
    if (!p) return 3;
    for (size_t i = 0; i < n / 8; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        p[i] = (i % 512 < 256) ? x : 0;
        sum += p[i] >> 32;
    }
    uint64_t again = 0;
    for (size_t i = 0; i < n / 8; i++) again += p[i] >> 32;
    free(p);
    /* What its children would preload: the user's list, not the runtime uswap run added. */
    const char *preload = getenv("LD_PRELOAD");
    printf("asan: %s, children preload the runtime: %s\n", sum == again ? "checked" : "WRONG",
           preload && strstr(preload, "libasan") ? "yes" : "no");
    return sum == again ? 0 : 1;
}
