/* fork without exec, and the child pages too: fills MIB of heap, forks; the child checks
 * every byte it inherited, rewrites half of it, then allocates and fills as much again
 * and checks all of it, and exits; the parent meanwhile rewrites the other half of its own
 * copy and checks it. Each prints a checksum. Usage: forkpage MIB
 *
 * stdout is unbuffered, so printf formats on the stack: in signal mode a write(2) from a
 * heap page that is swapped out fails with EFAULT (README, "Signals and system calls"), and
 * here the parent's stdio buffer lands on a heap page that was resident at the fork, so
 * refused by the first swap-out, made exclusive and moved out right after printf filled it
 * (one run in four lost the parent's line). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static uint64_t pattern(uint64_t i, uint64_t gen) { return (i + 3 + gen) * 0x9E3779B97F4A7C15ull; }

static uint64_t check(const uint64_t *a, size_t from, size_t to, uint64_t gen, const char *who) {
    uint64_t sum = 0;
    for (size_t i = from; i < to; i++) {
        if (a[i] != pattern(i, gen)) {
            fprintf(stderr, "%s: word %zu wrong\n", who, i);
            exit(3);
        }
        sum += a[i] >> 5;
    }
    return sum;
}

int main(int argc, char **argv) {
    size_t bytes = (argc > 1 ? strtoul(argv[1], 0, 10) : 64) << 20, words = bytes / 8;
    setvbuf(stdout, NULL, _IONBF, 0);
    uint64_t *a = malloc(bytes);
    if (!a) { perror("malloc"); return 1; }
    for (size_t i = 0; i < words; i++) a[i] = pattern(i, 0);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); return 1; }
    if (pid == 0) {
        uint64_t sum = check(a, 0, words, 0, "child, inherited");
        for (size_t i = 0; i < words / 2; i++) a[i] = pattern(i, 5);
        uint64_t *b = malloc(bytes);
        if (!b) { perror("child malloc"); exit(1); }
        for (size_t i = 0; i < words; i++) b[i] = pattern(i, 6);
        sum += check(b, 0, words, 6, "child, new memory");
        sum += check(a, 0, words / 2, 5, "child, rewritten");
        sum += check(a, words / 2, words, 0, "child, inherited again");
        printf("child %llx\n", (unsigned long long)sum);
        exit(0);
    }
    for (size_t i = words / 2; i < words; i++) a[i] = pattern(i, 7);
    uint64_t sum = check(a, 0, words / 2, 0, "parent") + check(a, words / 2, words, 7, "parent, rewritten");
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) { fprintf(stderr, "child failed: %d\n", st); return 4; }
    printf("parent %llx\n", (unsigned long long)sum);
    return 0;
}
