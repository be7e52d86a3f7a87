/* Memory held in mappings of one page each, as stress-ng's mmap stressor holds its 256 MiB
 * (it unmaps them page by page, then maps each back at its address): MIB of them, each its
 * own mapping (every other page of a range reserved and unmapped again, so that the kernel
 * merges none and uswap manages no region around them), written with a pattern, held a
 * while (the report measures every second), then read back. With FORKS, that many fork
 * children read them too while they are held (sharing every page with the parent, which
 * counts them). Prints OK, or what failed.
 * Usage: pagemaps MIB [FORKS] */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static uint8_t byte_of(size_t i) { return (uint8_t)((i * 2654435761u) >> 13); }

static size_t wrong(uint8_t **at, size_t pages, size_t page) {
    size_t n = 0;
    for (size_t p = 0; p < pages; p++)
        for (size_t i = 0; i < page; i++) n += at[p][i] != byte_of(p * page + i);
    return n;
}

int main(int argc, char **argv) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t pages = (size_t)atol(argc > 1 ? argv[1] : "24") * (1 << 20) / page;
    size_t slots = 3 * pages;
    uint8_t *reserve = mmap(NULL, 2 * slots * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    uint8_t **at = calloc(pages, sizeof *at);
    if (reserve == MAP_FAILED || !at || munmap(reserve, 2 * slots * page)) { perror("reserve"); return 1; }
    /* A slot another mapping took meanwhile (the allocator's, uswap's) is passed over. */
    size_t n = 0;
    for (size_t slot = 0; slot < slots && n < pages; slot++) {
        uint8_t *p = mmap(reserve + 2 * slot * page, page, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        if (p == MAP_FAILED) continue;
        if (p != reserve + 2 * slot * page) { printf("mapped at %p, not at %p\n", p, reserve + 2 * slot * page); return 1; }
        for (size_t i = 0; i < page; i++) p[i] = byte_of(n * page + i);
        at[n++] = p;
    }
    if (n < pages) { printf("only %zu pages mapped\n", n); return 1; }
    int forks = argc > 2 ? atoi(argv[2]) : 0;
    for (int f = 0; f < forks; f++) {
        pid_t pid = fork();
        if (pid < 0) { perror("fork"); return 1; }
        if (pid == 0) {
            size_t bad = wrong(at, pages, page);
            sleep(3);
            _exit(bad ? 1 : 0);
        }
    }
    sleep(forks ? 3 : 2);
    for (int f = 0; f < forks; f++) {
        int status;
        if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status)) { printf("a child failed\n"); return 1; }
    }
    size_t bad = wrong(at, pages, page);
    if (bad) { printf("%zu bytes wrong\n", bad); return 1; }
    printf("OK\n");
    return 0;
}
