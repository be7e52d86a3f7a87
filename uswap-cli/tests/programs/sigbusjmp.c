/* A program that survives a read past the end of a mapped file the usual way: its own
 * SIGBUS handler leaves with siglongjmp. Then it goes on with its managed memory: MIB MiB
 * of pseudo-random words, checked, and read(2) from /dev/zero into every MiB of it (the
 * kernel writes into pages that are out, which signal mode brings in first).
 *
 * Usage: sigbusjmp MIB FILE (FILE: a scratch file it truncates to one page and maps).
 * Prints "OK" and exits 0 when every word held and every read filled its MiB.
 *
 * What it found: uswap's handler passed the SIGBUS on to the program's with its own
 * depth counter raised; the siglongjmp never let it come down, and every later system
 * call of the thread looked like uswap's own: reads into memory that was out failed with
 * EFAULT. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define MiB (1UL << 20)

static sigjmp_buf past_the_end;

static void on_sigbus(int sig) {
    (void)sig;
    siglongjmp(past_the_end, 1);
}

static uint64_t next(uint64_t *s) {
    return *s = *s * 6364136223846793005ull + 1442695040888963407ull;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: sigbusjmp MIB FILE\n");
        return 2;
    }
    size_t nr_mib = (size_t)atoi(argv[1]);
    struct sigaction sa = {0};
    sa.sa_handler = on_sigbus;
    sigaction(SIGBUS, &sa, 0);
    uint64_t **mib = calloc(nr_mib, sizeof *mib);
    uint64_t s = 1;
    for (size_t i = 0; i < nr_mib; i++) {
        mib[i] = malloc(MiB);
        if (!mib[i]) return 2;
        for (size_t w = 0; w < MiB / 8; w++) mib[i][w] = next(&s);
    }
    int fd = open(argv[2], O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ftruncate(fd, 4096) != 0) return 2;
    volatile char *m = mmap(0, 8192, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) return 2;
    if (sigsetjmp(past_the_end, 1) == 0) {
        (void)m[4096];
        puts("no SIGBUS past the end of the file");
        return 1;
    }
    long bad = 0;
    s = 1;
    for (size_t i = 0; i < nr_mib; i++)
        for (size_t w = 0; w < MiB / 8; w++) bad += mib[i][w] != next(&s);
    int zero = open("/dev/zero", O_RDONLY);
    long failed_reads = 0;
    for (size_t i = 0; i < nr_mib; i++) {
        size_t j = (i * 37) % nr_mib;
        ssize_t r = read(zero, mib[j], MiB);
        if (r != (ssize_t)MiB) {
            if (failed_reads++ == 0) fprintf(stderr, "read into MiB %zu: %zd (%s)\n", j, r, r < 0 ? "error" : "short");
        }
    }
    printf("%s\n", bad || failed_reads ? "FAIL" : "OK");
    if (bad || failed_reads) fprintf(stderr, "%ld words wrong, %ld reads failed\n", bad, failed_reads);
    return bad || failed_reads ? 1 : 0;
}
