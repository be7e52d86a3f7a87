/* Asks mincore about a large mapping of which a little was written: the vector it gets is
 * a byte a page (16 KiB for 64 MiB). Prints how many pages were in RAM, of the written part
 * and of the rest. Usage: mincore MIB WRITTEN_MIB */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: mincore MIB WRITTEN_MIB\n"); return 2; }
    size_t len = strtoul(argv[1], 0, 10) << 20, written = strtoul(argv[2], 0, 10) << 20;
    unsigned char *p = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); return 1; }
    for (size_t i = 0; i < written; i++) p[i] = (unsigned char)(i * 31 + 7);
    size_t nr = len / 4096, in_written = 0, in_rest = 0;
    unsigned char *vec = malloc(nr);
    if (!vec) { perror("malloc"); return 1; }
    for (int round = 0; round < 10; round++) {
        if (mincore(p, len, vec)) { perror("mincore"); return 4; }
    }
    for (size_t i = 0; i < nr; i++) {
        if (i < written / 4096) in_written += vec[i] & 1;
        else in_rest += vec[i] & 1;
    }
    for (size_t i = 0; i < written; i++)
        if (p[i] != (unsigned char)(i * 31 + 7)) { fprintf(stderr, "byte %zu wrong\n", i); return 3; }
    printf("written part %zu of %zu pages in RAM, the rest %zu\n", in_written, written / 4096, in_rest);
    return 0;
}
