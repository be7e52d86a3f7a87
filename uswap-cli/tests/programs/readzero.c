/* Reads memory that was never written (a sweep over MIB MiB, twice), then writes every
 * 16th page of it and checks all of it: zeros where nothing was written, the pattern where
 * it was. Prints the sum of what it read, which must be the pattern's. With "read" after
 * MIB it stops after the reads. Usage: readzero MIB [read] */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#define PAGE 4096

int main(int argc, char **argv) {
    size_t bytes = (size_t)atol(argv[1]) << 20;
    unsigned char *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *h = malloc(bytes);
    if (m == MAP_FAILED || !h) { perror("alloc"); return 1; }
    unsigned long sum = 0;
    for (int round = 0; round < 2; round++)
        for (size_t i = 0; i < bytes; i += 512) sum += m[i] + h[i];
    if (sum) { fprintf(stderr, "never-written memory read %lu\n", sum); return 2; }
    if (argc > 2) { printf("read %zu MiB of zeros\n", bytes >> 20); return 0; }
    for (size_t i = 0; i < bytes; i += 16 * PAGE) m[i + 7] = h[i + 9] = (unsigned char)(i / PAGE);
    for (size_t i = 0; i < bytes; i++) sum += m[i] + h[i];
    unsigned long want = 0;
    for (size_t i = 0; i < bytes; i += 16 * PAGE) want += 2 * (unsigned char)(i / PAGE);
    printf("%lu %s\n", sum, sum == want ? "ok" : "WRONG");
    return sum == want ? 0 : 3;
}
