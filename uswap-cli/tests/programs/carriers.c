/* Threads that map and trim memory as Erlang's allocators map their carriers: each maps a
 * few MiB more than it needs, unmaps the head and the tail to align what is left, writes
 * and checks every page of it and unmaps it, over and over, so that the addresses one
 * thread frees are handed to another's next mapping at once. Before that, the main thread
 * writes a buffer of argv[1] MiB (so that uswap pages), and checks it at the end. Prints
 * "ok". Under uswap the late event of one thread's unmap took the pages of another's new
 * mapping, and its first touch was a SIGBUS that killed the process. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#define NR_THREADS 2
#define ROUNDS 1000
#define ALIGN_BYTES (256u << 10)

static unsigned char value(size_t i, unsigned salt) { return (unsigned char)((i ^ salt) * 2654435761u >> 13); }

static void *carriers(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    for (unsigned round = 0; round < ROUNDS; round++) {
        size_t len = (1 + rand_r(&seed) % 8) * (1u << 20) + (rand_r(&seed) % 64) * 4096;
        size_t mapped = len + ALIGN_BYTES;
        char *p = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) { perror("mmap"); exit(1); }
        uintptr_t start = ((uintptr_t)p + ALIGN_BYTES - 1) & ~(uintptr_t)(ALIGN_BYTES - 1);
        size_t head = start - (uintptr_t)p, tail = mapped - head - len;
        if ((head && munmap(p, head)) || (tail && munmap((char *)start + len, tail))) { perror("munmap"); exit(1); }
        unsigned char *c = (unsigned char *)start;
        for (size_t off = 0; off < len; off += 4096) c[off] = value(off >> 12, round);
        for (size_t off = 0; off < len; off += 4096)
            if (c[off] != value(off >> 12, round)) { printf("carrier page %zu differs\n", off >> 12); exit(1); }
        if (munmap(c, len)) { perror("munmap"); exit(1); }
    }
    return NULL;
}

int main(int argc, char **argv) {
    size_t len = (size_t)(argc > 1 ? atol(argv[1]) : 64) << 20;
    unsigned char *buf = malloc(len);
    if (!buf) { printf("malloc failed\n"); return 1; }
    for (size_t i = 0; i < len; i++) buf[i] = value(i, 0);
    pthread_t t[NR_THREADS];
    for (uintptr_t i = 0; i < NR_THREADS; i++)
        if (pthread_create(&t[i], NULL, carriers, (void *)(i + 1))) { printf("pthread_create failed\n"); return 1; }
    for (int i = 0; i < NR_THREADS; i++) pthread_join(t[i], NULL);
    for (size_t i = 0; i < len; i++)
        if (buf[i] != value(i, 0)) { printf("byte %zu differs\n", i); return 1; }
    printf("ok\n");
    return 0;
}
