/* Maps memory as V8 maps the pages of its heap, each page a mapping of its own: reserved at
 * twice its size with PROT_NONE, advised MADV_DONTFORK, trimmed to an aligned page, made
 * read-write. PAGES pages of KIB KiB are made and written, all held at once, and every byte
 * is checked twice; then a fork child (which has none of them) checks a buffer it does have
 * and exits. Node.js 20 with two worker threads had some 10,000 such mappings, and uswap
 * managed the first 4,000 of a process only. Prints "ok PAGES".
 * Usage: v8pages PAGES KIB */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static uint8_t value(size_t page, size_t i) { return (uint8_t)((page * 2654435761u ^ i * 40503u) >> 7); }

static uint8_t *map_page(size_t len) {
    uint8_t *p = mmap(NULL, 2 * len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); exit(1); }
    if (madvise(p, 2 * len, MADV_DONTFORK)) { perror("madvise"); exit(2); }
    uint8_t *page = (uint8_t *)(((uintptr_t)p + len - 1) & ~(uintptr_t)(len - 1));
    size_t head = (size_t)(page - p), tail = len - head;
    if ((head && munmap(p, head)) || (tail && munmap(page + len, tail))) { perror("munmap"); exit(1); }
    if (mprotect(page, len, PROT_READ | PROT_WRITE)) { perror("mprotect"); exit(1); }
    return page;
}

int main(int argc, char **argv) {
    size_t nr_pages = argc > 1 ? strtoul(argv[1], NULL, 10) : 6000;
    size_t len = (argc > 2 ? strtoul(argv[2], NULL, 10) : 64) << 10;
    uint8_t **pages = calloc(nr_pages, sizeof *pages), *mine = malloc(1 << 20);
    if (!pages || !mine) { perror("malloc"); return 1; }
    memset(mine, 0x6b, 1 << 20);
    for (size_t n = 0; n < nr_pages; n++) {
        pages[n] = map_page(len);
        for (size_t i = 0; i < len; i++) pages[n][i] = value(n, i);
    }
    for (int pass = 0; pass < 2; pass++)
        for (size_t k = 0; k < nr_pages; k++) {
            size_t n = pass ? nr_pages - 1 - k : k * 7919 % nr_pages;
            for (size_t i = 0; i < len; i++)
                if (pages[n][i] != value(n, i)) { printf("page %zu byte %zu differs\n", n, i); return 3; }
        }
    pid_t child = fork();
    if (child < 0) { perror("fork"); return 1; }
    if (child == 0) {
        for (size_t i = 0; i < 1 << 20; i++)
            if (mine[i] != 0x6b) _exit(4);
        _exit(0);
    }
    int status;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status)) {
        printf("the child ended with status %#x\n", status);
        return 5;
    }
    printf("ok %zu\n", nr_pages);
    return 0;
}
