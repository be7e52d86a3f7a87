/* Forks while other threads fault: MIB MiB of pseudo-random words are filled, THREADS
 * threads read and rewrite random words of it (each word keeps its value), and the main
 * thread forks FORKS times; each child checks every word and exits, the parent waits for
 * it. Then the parent checks every word too.
 *
 * Usage: forkfault MIB THREADS FORKS. Prints "OK" and exits 0 when every word held.
 *
 * What it found: in signal mode a fork child read the pages its parent had in the
 * compressed pool with the parent's codec workspaces, as copied at the fork, where another
 * thread could have been taking one: the child spun for good in its SIGBUS handler. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static uint64_t *words;
static size_t nr_words;
static atomic_int stop;

static uint64_t next(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static long check(void) {
    uint64_t s = 0x9E3779B97F4A7C15ull;
    long bad = 0;
    for (size_t i = 0; i < nr_words; i++) bad += words[i] != next(&s);
    return bad;
}

static void *hammer(void *arg) {
    uint64_t s = 7 + (uintptr_t)arg;
    while (!atomic_load(&stop)) {
        volatile uint64_t *w = &words[next(&s) % nr_words];
        uint64_t v = *w;
        *w = v;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: forkfault MIB THREADS FORKS\n");
        return 2;
    }
    nr_words = ((size_t)atoi(argv[1]) << 20) / 8;
    int nr_threads = atoi(argv[2]), nr_forks = atoi(argv[3]);
    words = malloc(nr_words * 8);
    if (!words || nr_threads > 8) return 2;
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < nr_words; i++) words[i] = next(&s);
    pthread_t t[8];
    for (int i = 0; i < nr_threads; i++) pthread_create(&t[i], 0, hammer, (void *)(uintptr_t)i);
    long bad = 0;
    for (int k = 0; k < nr_forks; k++) {
        pid_t pid = fork();
        if (pid == 0) _exit(check() ? 1 : 0);
        int status = 0;
        waitpid(pid, &status, 0);
        if (status != 0) {
            fprintf(stderr, "FAIL: child %d: status %#x\n", k, status);
            bad++;
        }
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < nr_threads; i++) pthread_join(t[i], 0);
    bad += check();
    puts(bad ? "FAIL" : "OK");
    return bad ? 1 : 0;
}
