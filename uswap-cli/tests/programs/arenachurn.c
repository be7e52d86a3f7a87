/* Two threads map and unmap arenas of 1 MiB, each filled with a pattern of its own and
 * checked when its thread comes back to it, while the process's pager starts under `uswap
 * run` (its arenas pass --start-after, or the main thread starts a third thread). Then the
 * main thread pages the kept arenas out (it touches three times the limit it is given) and
 * checks them all.
 *
 * Usage: arenachurn HOW MS LIMIT_MIB
 *   HOW: "pthread" (workers made with pthread_create, which uswap sees) or "c11" (made
 *        with thrd_create, which the C library makes without the interposed call);
 *   MS:  how long the workers churn before the main thread starts its thread.
 * Prints "OK" and exits 0 when every checked byte held its pattern, "FAIL ..." and exits 1
 * otherwise.
 *
 * What it found: an arena unmapped by one thread while the other mapped one could lose
 * its address to the other thread's mapping and then be unmapped a second time, taking
 * the other's arena (two threads then shared one address); and a waiting process's
 * mapping unmapped while its pager started could be taken over after the kernel had given
 * its addresses to the engine (the process hung). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <threads.h>
#include <unistd.h>

#define MiB (1UL << 20)
#define KEPT 3
#define WORKERS 2

static atomic_int stop, bad;
static unsigned char *kept[WORKERS][KEPT];
static unsigned tags[WORKERS][KEPT];

static unsigned char pattern(unsigned tag, size_t i) {
    return (unsigned char)(tag * 31 + i * 7 + (i >> 12) + 1);
}

/* Every 512th byte of an arena: 8 per page, every page. */
static int check(const unsigned char *p, unsigned tag, const char *when, int w) {
    for (size_t i = 0; i < MiB; i += 512) {
        if (p[i] != pattern(tag, i)) {
            fprintf(stderr, "FAIL %s: worker %d's arena %p, byte %zu: %u, not %u\n", when, w, (void *)p, i, p[i],
                    pattern(tag, i));
            return 1;
        }
    }
    return 0;
}

static int worker(void *arg) {
    int w = (int)(intptr_t)arg;
    unsigned tag = (unsigned)w * 1000000u;
    int n = 0;
    while (!atomic_load(&stop)) {
        int k = n++ % KEPT;
        if (kept[w][k]) {
            if (check(kept[w][k], tags[w][k], "while churning", w)) atomic_store(&bad, 1);
            munmap(kept[w][k], MiB);
        }
        unsigned char *p = mmap(0, MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            perror("mmap");
            atomic_store(&bad, 1);
            break;
        }
        tag++;
        for (size_t i = 0; i < MiB; i += 512) p[i] = pattern(tag, i);
        kept[w][k] = p;
        tags[w][k] = tag;
    }
    return n;
}

static void *posix_worker(void *arg) {
    return (void *)(intptr_t)worker(arg);
}

static void *nothing(void *arg) {
    return arg;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: arenachurn pthread|c11 MS LIMIT_MIB\n");
        return 2;
    }
    int c11 = strcmp(argv[1], "c11") == 0;
    int ms = atoi(argv[2]);
    size_t limit = (size_t)atoi(argv[3]) * MiB;
    pthread_t pt[WORKERS];
    thrd_t ct[WORKERS];
    for (int w = 0; w < WORKERS; w++) {
        int r = c11 ? thrd_create(&ct[w], worker, (void *)(intptr_t)w)
                    : pthread_create(&pt[w], 0, posix_worker, (void *)(intptr_t)w);
        if (r != 0) {
            fprintf(stderr, "cannot create a thread\n");
            return 2;
        }
    }
    usleep(ms * 1000);
    pthread_t t;
    pthread_create(&t, 0, nothing, 0);
    pthread_join(t, 0);
    usleep(50 * 1000);
    atomic_store(&stop, 1);
    for (int w = 0; w < WORKERS; w++) {
        if (c11) {
            thrd_join(ct[w], 0);
        } else {
            pthread_join(pt[w], 0);
        }
    }
    /* Pressure: the kept arenas go out and come back. */
    size_t len = 3 * limit;
    unsigned char *q = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (q == MAP_FAILED) {
        perror("mmap");
        return 2;
    }
    for (size_t i = 0; i < len; i += 4096) q[i] = (unsigned char)(i >> 12);
    munmap(q, len);
    for (int w = 0; w < WORKERS; w++) {
        for (int k = 0; k < KEPT; k++) {
            if (kept[w][k] && check(kept[w][k], tags[w][k], "at the end", w)) atomic_store(&bad, 1);
        }
    }
    puts(atomic_load(&bad) ? "FAIL" : "OK");
    return atomic_load(&bad) ? 1 : 0;
}
