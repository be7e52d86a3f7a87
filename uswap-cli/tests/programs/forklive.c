/* fork without exec, and both go on: fills MIB of heap, forks a child that re-reads every
 * byte and then stays alive (blocked on a pipe) while the parent allocates and fills as much
 * again, rewrites the first half of its old memory and re-reads all of it. The child then
 * re-reads its copy (which must be as it was at the fork) and exits. Each prints a checksum.
 *
 * While the child lives the pages it shares copy-on-write with the parent cannot be moved
 * out of the parent; the parent's faults must not wait for them (they used to wait out the
 * reclaim back-off, 100 ms a fault). Usage: forklive MIB */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static uint64_t pattern(uint64_t i, uint64_t gen) { return (i + 7 + gen) * 0xD6E8FEB86659FD93ull; }

static pid_t child = 0;

/* Words [from, to) of a hold generation gen's pattern; a wrong word ends the process (and
 * the child with it, which would wait for the parent forever). */
static uint64_t check(const uint64_t *a, size_t from, size_t to, uint64_t gen, const char *who) {
    uint64_t sum = 0;
    for (size_t i = from; i < to; i++) {
        if (a[i] != pattern(i, gen)) {
            fprintf(stderr, "%s: word %zu wrong\n", who, i);
            if (child > 0) kill(child, SIGKILL);
            exit(3);
        }
        sum += a[i] >> 3;
    }
    return sum;
}

int main(int argc, char **argv) {
    size_t bytes = (argc > 1 ? strtoul(argv[1], 0, 10) : 64) << 20, words = bytes / 8;
    uint64_t *a = malloc(bytes);
    if (!a) { perror("malloc"); return 1; }
    for (size_t i = 0; i < words; i++) a[i] = pattern(i, 0);
    int go[2], ready[2];
    if (pipe(go) || pipe(ready)) { perror("pipe"); return 1; }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); return 1; }
    if (pid == 0) {
        uint64_t first = check(a, 0, words, 0, "child");
        char c = 1;
        if (write(ready[1], &c, 1) != 1 || read(go[0], &c, 1) != 1) _exit(5);
        uint64_t again = check(a, 0, words, 0, "child, after the parent's writes");
        printf("child %llx %llx\n", (unsigned long long)first, (unsigned long long)again);
        fflush(stdout);
        _exit(0);
    }
    child = pid;
    char c;
    if (read(ready[0], &c, 1) != 1) { fprintf(stderr, "child died before it was ready\n"); return 4; }
    uint64_t *b = malloc(bytes);
    if (!b) { perror("malloc"); return 1; }
    for (size_t i = 0; i < words; i++) b[i] = pattern(i, 2);
    for (size_t i = 0; i < words / 2; i++) a[i] = pattern(i, 1);
    uint64_t sum = check(b, 0, words, 2, "parent, new memory");
    sum += check(a, 0, words / 2, 1, "parent, old memory rewritten");
    sum += check(a, words / 2, words, 0, "parent, old memory");
    c = 1;
    if (write(go[1], &c, 1) != 1) { perror("write"); return 1; }
    int st;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) { fprintf(stderr, "child failed: %d\n", st); return 4; }
    printf("parent %llx\n", (unsigned long long)sum);
    return 0;
}
