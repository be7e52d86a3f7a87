/* A working set that shrinks: fill BIG MiB, then for SECONDS touch only the first HOT MiB
 * (one word a page, checked and rewritten, a pass every 5 ms or so: light on the CPU, so
 * that tests running beside it keep theirs), then check every page. Prints "ok" and how
 * many passes it made. Usage: phases BIG HOT SECONDS */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    size_t big = argc > 1 ? strtoul(argv[1], 0, 10) : 256, hot = argc > 2 ? strtoul(argv[2], 0, 10) : 32;
    double seconds = argc > 3 ? atof(argv[3]) : 10;
    size_t words = (big << 20) / 8, stride = 4096 / 8, hot_words = (hot << 20) / 8;
    uint64_t *a = malloc(words * 8);
    if (!a) { perror("malloc"); return 1; }
    for (size_t i = 0; i < words; i++) a[i] = i;
    long passes = 0;
    struct timespec pause = {0, 5 * 1000 * 1000};
    for (double start = now(); now() - start < seconds; passes++) {
        for (size_t i = 0; i < hot_words; i += stride) {
            if (a[i] != i + (uint64_t)passes) { fprintf(stderr, "pass %ld: word %zu wrong\n", passes, i); return 3; }
            a[i] = i + (uint64_t)passes + 1;
        }
        nanosleep(&pause, 0);
    }
    for (size_t i = 0; i < words; i++) {
        uint64_t want = i + (i < hot_words && i % stride == 0 ? (uint64_t)passes : 0);
        if (a[i] != want) { fprintf(stderr, "word %zu wrong at the end\n", i); return 3; }
    }
    printf("ok, %ld passes\n", passes);
    return 0;
}
