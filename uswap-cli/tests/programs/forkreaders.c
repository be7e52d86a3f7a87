/* fork without exec, several times: fills MIB of heap, forks NCHILD children that each read
 * and check every byte of what they inherited while the parent rewrites all of its own copy
 * and checks it; each prints a checksum (children in order). Usage: forkreaders MIB NCHILD */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static uint64_t pattern(uint64_t i, uint64_t gen) { return (i + 11 + gen) * 0x9E3779B97F4A7C15ull; }

static uint64_t check(const uint64_t *a, size_t words, uint64_t gen, const char *who) {
    uint64_t sum = 0;
    for (size_t i = 0; i < words; i++) {
        if (a[i] != pattern(i, gen)) { fprintf(stderr, "%s: word %zu wrong\n", who, i); exit(3); }
        sum += a[i] >> 7;
    }
    return sum;
}

int main(int argc, char **argv) {
    size_t bytes = (argc > 1 ? strtoul(argv[1], 0, 10) : 48) << 20, words = bytes / 8;
    int nchild = argc > 2 ? atoi(argv[2]) : 3;
    uint64_t *a = malloc(bytes);
    if (!a) { perror("malloc"); return 1; }
    for (size_t i = 0; i < words; i++) a[i] = pattern(i, 0);
    int fds[16][2];
    pid_t pids[16];
    for (int c = 0; c < nchild && c < 16; c++) {
        if (pipe(fds[c])) { perror("pipe"); return 1; }
        pids[c] = fork();
        if (pids[c] < 0) { perror("fork"); return 1; }
        if (pids[c] == 0) {
            char line[64];
            int n = snprintf(line, sizeof line, "child %d %llx\n", c, (unsigned long long)check(a, words, 0, "child"));
            write(fds[c][1], line, n);
            _exit(0);
        }
        close(fds[c][1]);
    }
    for (size_t i = 0; i < words; i++) a[i] = pattern(i, 1);
    uint64_t sum = check(a, words, 1, "parent");
    for (int c = 0; c < nchild && c < 16; c++) {
        char line[64];
        ssize_t n = read(fds[c][0], line, sizeof line);
        int st;
        if (n <= 0 || waitpid(pids[c], &st, 0) != pids[c] || !WIFEXITED(st) || WEXITSTATUS(st)) { fprintf(stderr, "child %d failed\n", c); return 4; }
        fwrite(line, 1, (size_t)n, stdout);
    }
    printf("parent %llx\n", (unsigned long long)sum);
    return 0;
}
