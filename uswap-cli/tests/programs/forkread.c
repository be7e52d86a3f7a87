/* Fills MIB of heap, forks without exec; the child re-reads every byte and prints a checksum,
 * then overwrites half (its own copy); the parent waits, re-reads every byte (its copy must
 * be untouched) and prints the same checksum. Usage: forkread MIB */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static uint64_t pattern(uint64_t i) { return (i + 7) * 0xD6E8FEB86659FD93ull; }

static uint64_t check(const uint64_t *a, size_t words, const char *who) {
    uint64_t sum = 0;
    for (size_t i = 0; i < words; i++) {
        if (a[i] != pattern(i)) { fprintf(stderr, "%s: word %zu wrong\n", who, i); exit(3); }
        sum += a[i] >> 3;
    }
    return sum;
}

int main(int argc, char **argv) {
    size_t bytes = (argc > 1 ? strtoul(argv[1], 0, 10) : 64) << 20, words = bytes / 8;
    uint64_t *a = malloc(bytes);
    if (!a) { perror("malloc"); return 1; }
    for (size_t i = 0; i < words; i++) a[i] = pattern(i);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); return 1; }
    if (pid == 0) {
        printf("child %llx\n", (unsigned long long)check(a, words, "child"));
        for (size_t i = 0; i < words / 2; i++) a[i] = 0;
        fflush(stdout);
        _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) { fprintf(stderr, "child failed: %d\n", st); return 4; }
    printf("parent %llx\n", (unsigned long long)check(a, words, "parent"));
    return 0;
}
