/* Threads on stacks the program gives them (pthread_attr_setstack), from malloc and from
 * mmap, while MIB of data written beside them pushes those stacks out between rounds: each
 * round starts four threads on the same stacks, each sums its quarter of the data with a
 * deep recursion (frames of 4 KiB each, on its stack), and the data is checked byte for
 * byte. A thread whose first frames could not be written died of SIGSEGV before its start
 * routine. Prints the rounds' sums. Usage: userstack MIB */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define NR_THREADS 4
#define STACK_BYTES (1 << 20)
#define ROUNDS 3

static unsigned char *data;
static size_t data_len;

static unsigned char byte_at(size_t i, int round) { return (unsigned char)(i * 131 + (i >> 12) + round * 17); }

struct job { int t, round; uint64_t sum; };

/* Sums [from, to) in 64 KiB steps, one frame of a 4 KiB buffer per step (kept by volatile). */
static uint64_t sum_deep(size_t from, size_t to, int depth) {
    volatile unsigned char frame[4096];
    memset((void *)frame, depth, sizeof frame);
    uint64_t s = frame[depth % 4096];
    size_t step = 64 << 10, end = from + step < to ? from + step : to;
    for (size_t i = from; i < end; i++) s = s * 31 + data[i];
    if (end < to && depth < 48) return s + sum_deep(end, to, depth + 1);
    for (size_t i = end; i < to; i++) s = s * 31 + data[i];
    return s;
}

static void *run(void *p) {
    struct job *j = p;
    size_t quarter = data_len / NR_THREADS;
    j->sum = sum_deep(j->t * quarter, (j->t + 1) * quarter, 0);
    return NULL;
}

int main(int argc, char **argv) {
    data_len = (argc > 1 ? strtoul(argv[1], 0, 10) : 64) << 20;
    void *stacks[NR_THREADS];
    for (int t = 0; t < NR_THREADS; t++) {
        stacks[t] = t % 2 ? malloc(STACK_BYTES)
                          : mmap(NULL, STACK_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (!stacks[t] || stacks[t] == MAP_FAILED) { fprintf(stderr, "stack %d: no memory\n", t); return 1; }
    }
    data = malloc(data_len);
    if (!data) { fprintf(stderr, "no memory for the data\n"); return 1; }
    for (int round = 0; round < ROUNDS; round++) {
        for (size_t i = 0; i < data_len; i++) data[i] = byte_at(i, round);
        pthread_t th[NR_THREADS];
        struct job jobs[NR_THREADS];
        for (int t = 0; t < NR_THREADS; t++) {
            pthread_attr_t attr;
            pthread_attr_init(&attr);
            if (pthread_attr_setstack(&attr, stacks[t], STACK_BYTES) != 0) { fprintf(stderr, "setstack\n"); return 1; }
            jobs[t] = (struct job){t, round, 0};
            if (pthread_create(&th[t], &attr, run, &jobs[t]) != 0) { fprintf(stderr, "pthread_create\n"); return 1; }
            pthread_attr_destroy(&attr);
        }
        uint64_t sum = 0;
        for (int t = 0; t < NR_THREADS; t++) {
            pthread_join(th[t], NULL);
            sum = sum * 1000003 + jobs[t].sum;
        }
        for (size_t i = 0; i < data_len; i++)
            if (data[i] != byte_at(i, round)) { fprintf(stderr, "round %d: byte %zu wrong\n", round, i); return 3; }
        printf("round %d: %016llx\n", round, (unsigned long long)sum);
    }
    return 0;
}
