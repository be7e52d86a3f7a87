/* Several threads allocate with malloc and mmap, fill every byte with a pattern of their
 * own, re-read it all twice, and print one checksum per thread. Usage: threads MIB THREADS */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

static size_t per_thread_bytes;

static uint64_t pattern(uint64_t t, uint64_t i) { return (i + 1) * 0x9E3779B97F4A7C15ull ^ (t << 56); }

static void *worker(void *arg) {
    uint64_t t = (uint64_t)(uintptr_t)arg, sum = 0;
    size_t half = per_thread_bytes / 2, words = half / 8;
    uint64_t *a = malloc(half);
    uint64_t *b = mmap(NULL, half, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (!a || b == MAP_FAILED) { perror("alloc"); exit(1); }
    for (size_t i = 0; i < words; i++) { a[i] = pattern(t, i); b[i] = ~pattern(t, i); }
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < words; i++) {
            if (a[i] != pattern(t, i) || b[i] != ~pattern(t, i)) {
                fprintf(stderr, "thread %llu: word %zu wrong\n", (unsigned long long)t, i);
                exit(3);
            }
            sum += a[i] ^ (b[i] >> 1);
        }
    free(a);
    munmap(b, half);
    return (void *)(uintptr_t)sum;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 64;
    int n = argc > 2 ? atoi(argv[2]) : 4;
    per_thread_bytes = (mib << 20) / n;
    pthread_t th[64];
    for (int t = 0; t < n; t++) pthread_create(&th[t], 0, worker, (void *)(uintptr_t)t);
    for (int t = 0; t < n; t++) {
        void *r;
        pthread_join(th[t], &r);
        printf("thread %d checksum %llx\n", t, (unsigned long long)(uintptr_t)r);
    }
    return 0;
}
