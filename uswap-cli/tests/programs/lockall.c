/* mlockall(MCL_CURRENT | MCL_FUTURE) locks the program's memory, not uswap's reservations:
 * the kernel's own call brings in every page of every mapping, and brought in the pool's
 * arena (12.9 GB under --limit 96MiB, 19 s); with MCL_FUTURE in force before the pager
 * started, each of the pager's mappings was brought in as it was made.
 * Writes MIB of heap (paged out under the limit), locks everything, maps and writes 8 MiB
 * more (which the kernel must lock: smaps's "Locked:"), checks every word, unlocks; then runs itself again with
 * "early", which locks everything first and writes MIB after (its pager starts after the
 * lock). Prints "measured ..." lines with the call's time and what it brought in, and
 * "mlockall refused: ..." (then nothing more) where the process may not lock (no
 * CAP_IPC_LOCK and RLIMIT_MEMLOCK too small).
 * Usage: lockall MIB [early] */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NEW_BYTES (8 << 20)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static long rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) kib = strtol(line + 6, NULL, 10);
    if (f) fclose(f);
    return kib;
}

/* The "Locked:" kB of the mapping at `p` (/proc/self/smaps): its resident pages, if the
 * kernel locks it. */
static long locked_kib(const void *p) {
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    int in = 0;
    long kib = -1;
    while (f && fgets(line, sizeof line, f)) {
        unsigned long s, e;
        if (sscanf(line, "%lx-%lx ", &s, &e) == 2 && strchr(line, '-') < strchr(line, ' '))
            in = s <= (unsigned long)p && (unsigned long)p < e;
        else if (in && !strncmp(line, "Locked:", 7))
            kib = strtol(line + 7, NULL, 10);
    }
    if (f) fclose(f);
    return kib;
}

static uint64_t *fill(size_t words) {
    uint64_t *a = malloc(words * 8);
    for (size_t i = 0; i < words; i++) a[i] = i * 0x9E3779B97F4A7C15ull;
    return a;
}

static size_t wrong(const uint64_t *a, size_t words) {
    size_t n = 0;
    for (size_t i = 0; i < words; i++) n += a[i] != i * 0x9E3779B97F4A7C15ull;
    return n;
}

/* 1 if locking is refused here (said), else 0; exits on another error. */
static int lock_all(const char *who) {
    double t = now();
    long before = rss_kib();
    if (mlockall(MCL_CURRENT | MCL_FUTURE)) {
        if (errno == ENOMEM || errno == EPERM) {
            printf("mlockall refused: %s\n", strerror(errno));
            return 1;
        }
        perror("mlockall");
        exit(3);
    }
    printf("%s mlockall 0\n", who);
    printf("measured %s seconds %.3f brought_in_mib %ld\n", who, now() - t, (rss_kib() - before) >> 10);
    return 0;
}

static int early(size_t words) {
    if (lock_all("early")) return 0;
    double t = now();
    uint64_t *a = fill(words);
    printf("early wrong words: %zu\n", wrong(a, words));
    printf("measured early fill_seconds %.3f rss_mib %ld\n", now() - t, rss_kib() >> 10);
    return 0;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 64, words = (mib << 20) / 8;
    if (argc > 2 && !strcmp(argv[2], "early")) return early(words);
    uint64_t *a = fill(words);
    if (lock_all("late")) return 0;
    char *b = mmap(NULL, NEW_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b == MAP_FAILED) { perror("mmap"); return 4; }
    memset(b, 0x5a, NEW_BYTES);
    printf("new mapping locked: %s\n", locked_kib(b) >= NEW_BYTES >> 10 ? "yes" : "no");
    printf("late wrong words: %zu\n", wrong(a, words));
    printf("munlockall %d\n", munlockall());
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        execl("/proc/self/exe", argv[0], argv[1], "early", (char *)NULL);
        _exit(6);
    }
    int st = 0;
    waitpid(child, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 5;
}
