/* The cost of a system call on managed memory in signal mode: read(2) of 64 bytes from
 * /dev/zero into a resident 1 MiB heap buffer, best of 5 rounds of N calls. Run it plain
 * and under `uswap run --fault-mode signal --limit 1GiB` (no pressure: the buffer stays in),
 * alternating; the difference is what the rewritten `syscall` instruction, the rule look-up,
 * the preparation of the buffer and its pin cost per call.
 * Usage: syscall_cost [N] */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    char *buf = malloc(1 << 20);
    for (int i = 0; i < (1 << 20); i += 4096) buf[i] = 1;
    int fd = open("/dev/zero", O_RDONLY);
    struct timespec a, b;
    double best = 1e9;
    for (int r = 0; r < 5; r++) {
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (long i = 0; i < n; i++) if (read(fd, buf + (i & 255) * 64, 64) != 64) return 1;
        clock_gettime(CLOCK_MONOTONIC, &b);
        double ns = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n;
        if (ns < best) best = ns;
    }
    printf("%.0f ns per read\n", best);
    return 0;
}
