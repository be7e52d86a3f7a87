/* Sequential streaming over a working set: fill MIB of memory, then PASSES passes that read
 * and rewrite every word in order, and print a checksum. Its output depends only on its
 * arguments. Usage: seqstream MIB PASSES */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 256;
    int passes = argc > 2 ? atoi(argv[2]) : 4;
    size_t words = (mib << 20) / 8;
    uint64_t *a = malloc(words * 8);
    if (!a) { perror("malloc"); return 1; }
    for (size_t i = 0; i < words; i++) a[i] = i * 0x9E3779B97F4A7C15ull;
    uint64_t sum = 0;
    for (int p = 0; p < passes; p++)
        for (size_t i = 0; i < words; i++) {
            uint64_t expect = i * 0x9E3779B97F4A7C15ull + (uint64_t)p;
            if (a[i] != expect) {
                fprintf(stderr, "pass %d: word %zu wrong\n", p, i);
                return 3;
            }
            sum += a[i] >> 7;
            a[i] = expect + 1;
        }
    printf("seqstream %zu MiB, %d passes: checksum %016llx\n", mib, passes, (unsigned long long)sum);
    return 0;
}
