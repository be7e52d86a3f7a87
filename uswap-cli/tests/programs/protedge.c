/* Fault-around stops at the end of a mapping: maps 2*MIB MiB read-write (managed), makes its
 * upper half PROT_NONE (a runtime's reservation past what it committed), writes the lower
 * half front to back (a sequential stream whose window reaches the upper half at its end)
 * twice, each time checked, then counts the pages of the upper half present in the page
 * tables (/proc/self/pagemap, bit 63): none may be, since a page filled there could never be
 * moved out (UFFDIO_MOVE needs equal protections on both sides).
 * Prints "present in the PROT_NONE half: N" and "ok". Usage: protedge MIB */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: protedge MIB\n"); return 2; }
    size_t half = (size_t)atol(argv[1]) << 20, page = 4096, words = half / 8;
    uint64_t *p = mmap(0, 2 * half, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED || mprotect((char *)p + half, half, PROT_NONE)) { perror("map"); return 1; }
    for (int round = 0; round < 2; round++) {
        for (size_t i = 0; i < words; i++) p[i] = (i * 0x9e3779b97f4a7c15ull) ^ (uint64_t)round;
        for (size_t i = 0; i < words; i++)
            if (p[i] != ((i * 0x9e3779b97f4a7c15ull) ^ (uint64_t)round)) { fprintf(stderr, "word %zu\n", i); return 1; }
    }
    int fd = open("/proc/self/pagemap", O_RDONLY);
    if (fd < 0) { perror("pagemap"); return 1; }
    size_t present = 0;
    for (size_t off = 0; off < half; off += page) {
        uint64_t e;
        uintptr_t va = (uintptr_t)p + half + off;
        if (pread(fd, &e, 8, (off_t)(va / page * 8)) != 8) { perror("pread"); return 1; }
        present += e >> 63;
    }
    printf("present in the PROT_NONE half: %zu\nok\n", present);
    return 0;
}
