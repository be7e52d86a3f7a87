// Keeps its data in shared anonymous memory (MAP_SHARED|MAP_ANONYMOUS, as PostgreSQL's
// shared buffers and Python's multiprocessing.shared_memory do), which uswap does not
// page: writes MIB MiB, holds it for SECONDS, checks it and prints a checksum.
// Usage: shared MIB SECONDS
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    size_t bytes = (size_t)atol(argv[1]) << 20, words = bytes / 8;
    uint64_t *a = mmap(0, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED) { perror("mmap"); return 1; }
    for (size_t i = 0; i < words; i++) a[i] = i * 0x9e3779b97f4a7c15ull;
    sleep((unsigned)atoi(argv[2]));
    uint64_t sum = 0;
    for (size_t i = 0; i < words; i++) {
        if (a[i] != i * 0x9e3779b97f4a7c15ull) { fprintf(stderr, "wrong word %zu\n", i); return 3; }
        sum += a[i];
    }
    printf("checksum %016llx\n", (unsigned long long)sum);
    return 0;
}
