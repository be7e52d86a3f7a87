/* Writes and checks a buffer of MIB1 MiB, then execs itself to do the same with MIB2 MiB:
 * one process, two images, each of which pages. Usage: execself MIB1 MIB2 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int pass(size_t mib, unsigned seed) {
    size_t len = mib << 20;
    unsigned char *buf = malloc(len);
    if (!buf) { perror("malloc"); return 1; }
    for (size_t i = 0; i < len; i++) buf[i] = (unsigned char)(i * 131 + (i >> 12) + seed);
    for (size_t i = 0; i < len; i++)
        if (buf[i] != (unsigned char)(i * 131 + (i >> 12) + seed)) { fprintf(stderr, "byte %zu wrong\n", i); return 3; }
    free(buf);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: execself MIB1 MIB2\n"); return 2; }
    int second = argc == 4;
    int r = pass(strtoul(argv[second ? 2 : 1], 0, 10), second ? 11 : 7);
    if (r) return r;
    if (second) { printf("both images ok\n"); return 0; }
    /* The replaced image's counters are those it last published (every 200 ms). */
    usleep(500 * 1000);
    char *next[] = {argv[0], argv[1], argv[2], "second", NULL};
    execv("/proc/self/exe", next);
    perror("execv");
    return 4;
}
