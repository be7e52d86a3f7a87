/* What a program advises about forks holds for its managed memory, pages out included:
 * a range advised MADV_WIPEONFORK reads zeros in the child, one advised MADV_DONTFORK is not
 * the child's (the child leaves it alone), and the rest the child reads as it was. MIB of
 * heap is written after them, so that their pages are out at the fork.
 * Usage: forkadvice MIB */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define RANGE_BYTES (8 << 20)

int main(int argc, char **argv) {
    size_t big_bytes = (argc > 1 ? strtoul(argv[1], NULL, 10) : 64) << 20;
    int prot = PROT_READ | PROT_WRITE, flags = MAP_PRIVATE | MAP_ANONYMOUS;
    uint8_t *wipe = mmap(NULL, RANGE_BYTES, prot, flags, -1, 0), *dont = mmap(NULL, RANGE_BYTES, prot, flags, -1, 0);
    if (wipe == MAP_FAILED || dont == MAP_FAILED) { perror("mmap"); return 1; }
    memset(wipe, 0x5a, RANGE_BYTES);
    memset(dont, 0x33, RANGE_BYTES);
    if (madvise(wipe, RANGE_BYTES, MADV_WIPEONFORK) || madvise(dont, RANGE_BYTES, MADV_DONTFORK)) {
        perror("madvise");
        return 2;
    }
    /* Half of the wipe-on-fork range goes back to normal: the child reads it as it was. */
    if (madvise(wipe + RANGE_BYTES / 2, RANGE_BYTES / 2, MADV_KEEPONFORK)) { perror("madvise"); return 2; }
    uint8_t *big = malloc(big_bytes);
    if (!big) { perror("malloc"); return 1; }
    for (size_t i = 0; i < big_bytes; i++) big[i] = (uint8_t)(i * 7);
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        size_t zero = 0, kept = 0;
        for (size_t i = 0; i < RANGE_BYTES / 2; i++) zero += wipe[i] == 0;
        for (size_t i = RANGE_BYTES / 2; i < RANGE_BYTES; i++) kept += wipe[i] == 0x5a;
        uint64_t s = 0;
        for (size_t i = 0; i < big_bytes; i++) s = s * 31 + big[i];
        printf("child: %zu of %d wiped bytes zero, %zu of %d kept, heap %llu\n", zero, RANGE_BYTES / 2, kept,
               RANGE_BYTES / 2, (unsigned long long)s);
        fflush(stdout);
        _exit(0);
    }
    int st = 0;
    waitpid(child, &st, 0);
    uint64_t s = 0;
    for (size_t i = 0; i < RANGE_BYTES; i++) s += wipe[i] + dont[i];
    for (size_t i = 0; i < big_bytes; i++) s = s * 31 + big[i];
    printf("parent: %llu, child status %d\n", (unsigned long long)s, st);
    return 0;
}
