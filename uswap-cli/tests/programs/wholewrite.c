/* Writes MIB MiB of a pattern to stdout ROUNDS times, each with one write(2), and fails
 * (status 3) if a write returns less than it asked: under the kernel's own swap a write to
 * a blocking pipe is never cut short for want of a page, and programs count on it. With
 * "read FILE" it reads MIB MiB of FILE with one read(2) per round instead, fails the same
 * way on a short read, and prints a checksum of what it read. With "hog" it fills MIB MiB
 * and touches it over and over (the neighbour that makes reclaim take the other's pages
 * out while its call runs). Usage: wholewrite MIB ROUNDS | wholewrite MIB read FILE |
 * wholewrite MIB hog */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    size_t bytes = (size_t)atol(argv[1]) << 20;
    unsigned char *b = malloc(bytes);
    if (!b) { perror("malloc"); return 1; }
    if (argc > 2 && strcmp(argv[2], "hog") == 0) {
        for (int round = 0; round < 40; round++)
            for (size_t i = 0; i < bytes; i += 4096) b[i + round] = (unsigned char)round;
        return 0;
    }
    if (argc > 3 && strcmp(argv[2], "read") == 0) {
        unsigned long sum = 0;
        for (int r = 0; r < 4; r++) {
            FILE *f = fopen(argv[3], "r");
            if (!f) { perror(argv[3]); return 1; }
            memset(b, 0, bytes);
            ssize_t n = read(fileno(f), b, bytes);
            fclose(f);
            if (n != (ssize_t)bytes) {
                fprintf(stderr, "round %d: read returned %zd of %zu bytes\n", r, n, bytes);
                return 3;
            }
            for (size_t i = 0; i < bytes; i++) sum += b[i] * (i % 251 + 1);
        }
        printf("%lu\n", sum);
        return 0;
    }
    int rounds = atoi(argv[2]);
    for (int r = 0; r < rounds; r++) {
        for (size_t i = 0; i < bytes; i++) b[i] = (unsigned char)(i * 7 + r);
        ssize_t n = write(1, b, bytes);
        if (n != (ssize_t)bytes) {
            fprintf(stderr, "round %d: write returned %zd of %zu bytes\n", r, n, bytes);
            return 3;
        }
    }
    return 0;
}
