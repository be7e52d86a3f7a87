/* A tree of processes that each hold data of their own: forks N children, each fills MIB
 * MiB with bytes of its own pseudo-random sequence (xorshift, seeded by its index: nothing
 * compresses), checks every byte twice, and exits 0 only if all were right. The parent
 * waits for all of them and prints how many were right. Usage: tree N MIB */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static uint64_t next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static int child(int k, size_t len) {
    uint64_t *buf = malloc(len);
    if (!buf) return 2;
    size_t words = len / 8;
    uint64_t s = 0x9e3779b97f4a7c15ull * (k + 1);
    for (size_t i = 0; i < words; i++) buf[i] = next(&s);
    for (int round = 0; round < 2; round++) {
        s = 0x9e3779b97f4a7c15ull * (k + 1);
        for (size_t i = 0; i < words; i++) {
            if (buf[i] != next(&s)) {
                fprintf(stderr, "process %d: word %zu wrong\n", k, i);
                return 3;
            }
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 4;
    size_t len = (size_t)(argc > 2 ? strtoul(argv[2], 0, 10) : 4) << 20;
    for (int k = 0; k < n; k++) {
        pid_t p = fork();
        if (p < 0) { perror("fork"); return 1; }
        if (p == 0) _exit(child(k, len));
    }
    int right = 0;
    for (int k = 0; k < n; k++) {
        int st;
        if (wait(&st) > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0) right++;
    }
    printf("%d of %d processes read every byte right\n", right, n);
    return right == n ? 0 : 1;
}
