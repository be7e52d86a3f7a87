// Keeps its data in shared anonymous memory (MAP_SHARED|MAP_ANONYMOUS, as PostgreSQL's
// shared buffers and Python's multiprocessing.shared_memory do), which uswap does not
// page: writes MIB MiB, holds it for SECONDS, checks it and prints a checksum. With
// READERS, that many fork children (PostgreSQL's backends) read all of it and hold it
// too, so that every process has every page of it resident: one copy in memory, mapped
// READERS + 1 times.
// Usage: shared MIB SECONDS [READERS]
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static int check(const uint64_t *a, size_t words, uint64_t *sum) {
    for (size_t i = 0; i < words; i++) {
        if (a[i] != i * 0x9e3779b97f4a7c15ull) { fprintf(stderr, "wrong word %zu\n", i); return 3; }
        *sum += a[i];
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    size_t bytes = (size_t)atol(argv[1]) << 20, words = bytes / 8;
    int readers = argc > 3 ? atoi(argv[3]) : 0;
    uint64_t *a = mmap(0, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED) { perror("mmap"); return 1; }
    for (size_t i = 0; i < words; i++) a[i] = i * 0x9e3779b97f4a7c15ull;
    for (int r = 0; r < readers; r++) {
        pid_t pid = fork();
        if (pid < 0) { perror("fork"); return 1; }
        if (pid == 0) {
            uint64_t sum = 0;
            int bad = check(a, words, &sum);
            sleep((unsigned)atoi(argv[2]));
            _exit(bad ? bad : check(a, words, &sum));
        }
    }
    sleep((unsigned)atoi(argv[2]));
    uint64_t sum = 0;
    if (check(a, words, &sum)) return 3;
    for (int r = 0; r < readers; r++) {
        int status;
        if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "a reader failed\n");
            return 4;
        }
    }
    printf("checksum %016llx\n", (unsigned long long)sum);
    return 0;
}
