/* Ruby's heap pages, as Ruby 3.1 maps them on Linux (strace): each page of 16 KiB is the
 * second half of a mapping of 32 KiB whose first half is unmapped at once; the kernel
 * places the next mapping right below, over what the last one gave back. MIB of pages are
 * filled, a third of them unmapped at random and as many mapped again, and every byte of
 * every live page checked. Prints a checksum of the contents and how many pages were wrong.
 * Usage: alignpages MIB */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#define PAGE_BYTES (16 << 10)

static uint8_t byte_of(size_t i, unsigned tag) { return (uint8_t)(((i + 1) * 2654435761u) >> 13) ^ (uint8_t)(tag * 131); }

/* A page of PAGE_BYTES, as Ruby's heap gets one. */
static uint8_t *heap_page(void) {
    uint8_t *p = mmap(NULL, 2 * PAGE_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); exit(1); }
    if (munmap(p, PAGE_BYTES)) { perror("munmap"); exit(1); }
    return p + PAGE_BYTES;
}

static void fill(uint8_t *p, unsigned tag) {
    for (size_t i = 0; i < PAGE_BYTES; i++) p[i] = byte_of(i, tag);
}

int main(int argc, char **argv) {
    size_t n = ((argc > 1 ? strtoul(argv[1], NULL, 10) : 64) << 20) / PAGE_BYTES;
    uint8_t **pages = malloc(n * sizeof *pages);
    unsigned *tags = malloc(n * sizeof *tags);
    if (!pages || !tags) { perror("malloc"); return 1; }
    for (size_t k = 0; k < n; k++) {
        pages[k] = heap_page();
        tags[k] = (unsigned)k;
        fill(pages[k], tags[k]);
    }
    srand(7);
    for (size_t r = 0; r < n / 3; r++) {
        size_t k = (size_t)rand() % n;
        if (munmap(pages[k], PAGE_BYTES)) { perror("munmap page"); return 1; }
        pages[k] = heap_page();
        tags[k] = (unsigned)(n + r);
        fill(pages[k], tags[k]);
    }
    uint64_t sum = 0;
    size_t wrong = 0;
    for (size_t k = 0; k < n; k++) {
        size_t bad = 0;
        for (size_t i = 0; i < PAGE_BYTES; i++) {
            bad += pages[k][i] != byte_of(i, tags[k]);
            sum = sum * 1099511628211u + pages[k][i];
        }
        wrong += bad != 0;
    }
    printf("pages %zu wrong %zu sum %016llx\n", n, wrong, (unsigned long long)sum);
    return wrong != 0;
}
