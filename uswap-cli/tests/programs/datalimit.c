/* A program that sets its own data limit (`ulimit -d`, RLIMIT_DATA) once it holds memory,
 * with room for what it allocates next: MIB MiB of pseudo-random words, then a limit of
 * MIB + 160 MiB, then 100 blocks of 1 MiB mapped (as CPython maps its arenas) and
 * written; every word is checked. Prints "OK" and
 * exits 0 when every allocation succeeded and every word held.
 *
 * What it found: the kernel counts uswap's own writable mappings (its pools, staging
 * areas, the heap's commits) against RLIMIT_DATA, and a program that set it with a pager
 * running got allocation failures where it had room without uswap. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 200, nr_words = (mib << 20) / 8;
    uint64_t *words = malloc(nr_words * 8);
    if (!words) { puts("FAIL: first allocation"); return 1; }
    uint64_t s = 1;
    for (size_t i = 0; i < nr_words; i++) words[i] = s = s * 6364136223846793005ull + 1442695040888963407ull;
    struct rlimit lim = {(mib + 160) << 20, (mib + 200) << 20};
    if (setrlimit(RLIMIT_DATA, &lim) != 0) { perror("setrlimit"); return 2; }
    struct rlimit back;
    if (getrlimit(RLIMIT_DATA, &back) != 0 || back.rlim_cur != lim.rlim_cur || back.rlim_max != lim.rlim_max) {
        puts("FAIL: getrlimit does not give back the limit set");
        return 1;
    }
    unsigned char *blocks[100];
    for (int b = 0; b < 100; b++) {
        blocks[b] = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (blocks[b] == MAP_FAILED) { printf("FAIL: block %d of 1 MiB under the data limit\n", b); return 1; }
        memset(blocks[b], b + 1, 1 << 20);
    }
    long bad = 0;
    s = 1;
    for (size_t i = 0; i < nr_words; i++) bad += words[i] != (s = s * 6364136223846793005ull + 1442695040888963407ull);
    for (int b = 0; b < 100; b++) bad += blocks[b][b * 1000] != b + 1;
    puts(bad ? "FAIL: words changed" : "OK");
    return bad ? 1 : 0;
}
