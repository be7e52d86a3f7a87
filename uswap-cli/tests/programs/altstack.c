/* A program's own alternate signal stacks, in memory uswap manages (malloc), must hold every
 * signal frame the kernel writes there, whatever was swapped out meanwhile: the program's
 * SA_ONSTACK handler's and uswap's own SIGBUS frames (signal mode) alike.
 * Fills MIB of heap with a pattern; then, in rounds, re-reads a quarter of it (pushing the
 * alternate stack's pages out) and raises SIGUSR1, whose handler runs on the alternate stack
 * and sums a part of the heap there (taking faults on it). A second thread and a fork child
 * do the same with stacks of their own (the child keeps its parent's thread's). Prints the
 * sums.
 * Usage: altstack MIB */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define ROUNDS 8
#define ALT_BYTES (128 << 10)

static uint64_t *a;
static size_t words;
static __thread uint64_t handler_sum;
static __thread size_t handler_from;

static uint64_t pattern(uint64_t i) { return (i + 7) * 0x9E3779B97F4A7C15ull; }

static uint64_t sum_range(size_t from, size_t n) {
    uint64_t s = 0;
    for (size_t i = from; i < from + n && i < words; i++) {
        if (a[i] != pattern(i)) { fprintf(stderr, "word %zu wrong\n", i); _exit(3); }
        s += a[i] >> 8;
    }
    return s;
}

static void on_usr1(int sig) {
    /* A deep frame on the alternate stack, written while the handler sums. */
    volatile char frame[16 << 10];
    memset((char *)frame, sig, sizeof frame);
    handler_sum += sum_range(handler_from, words / 16) + frame[100];
}

static uint64_t rounds_on_own_stack(unsigned seed) {
    char *alt = malloc(ALT_BYTES);
    if (!alt) { perror("malloc"); _exit(4); }
    memset(alt, 0x5a, ALT_BYTES);
    stack_t ss = { .ss_sp = alt, .ss_size = ALT_BYTES, .ss_flags = 0 };
    if (sigaltstack(&ss, NULL)) { perror("sigaltstack"); _exit(5); }
    uint64_t s = 0;
    for (int r = 0; r < ROUNDS; r++) {
        /* Push the stack out: re-read a quarter of the heap. */
        size_t part = (r * 4 + seed) % 16;
        s += sum_range(part * (words / 16), words / 4);
        handler_from = ((r + seed) % 16) * (words / 16);
        if (raise(SIGUSR1)) { perror("raise"); _exit(6); }
    }
    stack_t off = { .ss_flags = SS_DISABLE };
    sigaltstack(&off, NULL);
    free(alt);
    return s + handler_sum;
}

static void *thread_main(void *out) {
    *(uint64_t *)out = rounds_on_own_stack(5);
    return NULL;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 64;
    words = (mib << 20) / 8;
    a = malloc(words * 8);
    if (!a) { perror("malloc"); return 2; }
    for (size_t i = 0; i < words; i++) a[i] = pattern(i);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_ONSTACK;
    sigaction(SIGUSR1, &sa, NULL);

    printf("main thread: %llu\n", (unsigned long long)rounds_on_own_stack(0));
    pthread_t t;
    uint64_t ts = 0;
    if (pthread_create(&t, NULL, thread_main, &ts)) return 7;
    pthread_join(t, NULL);
    printf("second thread: %llu\n", (unsigned long long)ts);

    /* A fork child inherits the thread's alternate stack, set before the fork. */
    char *alt = malloc(ALT_BYTES);
    memset(alt, 0x33, ALT_BYTES);
    stack_t ss = { .ss_sp = alt, .ss_size = ALT_BYTES, .ss_flags = 0 };
    if (sigaltstack(&ss, NULL)) { perror("sigaltstack"); return 5; }
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        handler_sum = 0;
        uint64_t s = 0;
        for (int r = 0; r < ROUNDS; r++) {
            s += sum_range(((r * 4) % 16) * (words / 16), words / 4);
            handler_from = (r % 16) * (words / 16);
            raise(SIGUSR1);
        }
        printf("fork child: %llu\n", (unsigned long long)(s + handler_sum));
        fflush(stdout);
        _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) { fprintf(stderr, "child: status %d\n", status); return 8; }
    printf("done\n");
    return 0;
}
