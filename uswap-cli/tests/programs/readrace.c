/* A program whose second thread reads every page of every readable anonymous mapping of
 * its address space, over and over (uswap's staging area and pool arena among them, under
 * uswap run), while its main thread pages MB MiB through PASSES passes of writes and random
 * checks, then checks every word. Under uswap the reader keeps mapping the kernel's zero
 * page in staging slots that reclaim then moves pages into. Prints "bad 0" and exits 0 if
 * every word read back as written.
 * Usage: readrace MB PASSES */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PAGE = 4096, MAX_LINES = 8192, STRIDE = PAGE / 8 };

static atomic_int stop;
static unsigned long lo[MAX_LINES], hi[MAX_LINES];

static uint64_t word(size_t i) { return i * 0x9e3779b97f4a7c15ull; }

/* The readable anonymous mappings (no file, no [name]). */
static int anonymous_mappings(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return 0;
    char l[512];
    int k = 0;
    while (k < MAX_LINES && fgets(l, sizeof l, f)) {
        char prot[5];
        unsigned long inode;
        if (sscanf(l, "%lx-%lx %4s %*s %*s %lu", &lo[k], &hi[k], prot, &inode) == 4 && prot[0] == 'r' && inode == 0 &&
            !strchr(l, '['))
            k++;
    }
    fclose(f);
    return k;
}

static void *reader(void *arg) {
    (void)arg;
    unsigned long rounds = 0;
    volatile uint64_t sum = 0;
    while (!atomic_load(&stop)) {
        int k = anonymous_mappings();
        for (int i = 0; i < k && !atomic_load(&stop); i++)
            for (unsigned long p = lo[i]; p < hi[i] && !atomic_load(&stop); p += PAGE) sum += *(volatile uint64_t *)p;
        rounds++;
    }
    fprintf(stderr, "reader rounds %lu\n", rounds);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: readrace MB PASSES\n"); return 2; }
    size_t n = (strtoul(argv[1], 0, 10) << 20) / 8;
    int passes = atoi(argv[2]);
    uint64_t *buf = malloc(n * 8);
    if (!buf) return 1;
    for (size_t i = 0; i < n; i++) buf[i] = word(i);
    pthread_t t;
    if (pthread_create(&t, 0, reader, 0)) return 1;
    unsigned long bad = 0;
    /* Each pass adds 7 to the first word of every page, checking it first, then checks
     * pages at random. */
    for (int p = 1; p <= passes; p++) {
        for (size_t i = 0; i < n; i += STRIDE) {
            bad += buf[i] != word(i) + (uint64_t)(p - 1) * 7;
            buf[i] += 7;
        }
        for (size_t j = 0; j < n / 64; j++) {
            size_t i = (j * 2654435761u) % (n / STRIDE) * STRIDE;
            bad += buf[i] != word(i) + (uint64_t)p * 7;
        }
    }
    atomic_store(&stop, 1);
    pthread_join(t, 0);
    for (size_t i = 0; i < n; i++) bad += buf[i] != word(i) + (i % STRIDE ? 0 : (uint64_t)passes * 7);
    printf("bad %lu\n", bad);
    return bad != 0;
}
