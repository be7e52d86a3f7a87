/* What a program does with its signals must not turn uswap's signal-mode faults into a crash.
 * Fills MIB of heap, then re-reads all of it (printing a checksum) three ways:
 *  1. from a thread that blocks every signal (pthread_sigmask of a full set);
 *  2. after installing a SIGBUS handler of its own with sigaction (which does not chain; it
 *     reports a real bus error and exits 9) and one with signal();
 *  3. inside a SIGUSR1 handler installed with a full sa_mask, raised by the program; and in a
 *     SIGUSR2 one installed the same way at the start of main, before uswap's pager started;
 *  4. with every signal blocked by sigprocmask.
 * Last, a real bus error (a read past the end of a mapped empty file) must reach the
 * program's own SIGBUS handler, which prints a line and exits 0.
 * Usage: sigmasks MIB */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static uint64_t *a;
static size_t words;
static volatile uint64_t in_handler_sum;

static uint64_t pattern(uint64_t i) { return (i + 3) * 0x9E3779B97F4A7C15ull; }

static uint64_t sum_all(const char *who) {
    uint64_t s = 0;
    for (size_t i = 0; i < words; i++) {
        if (a[i] != pattern(i)) { fprintf(stderr, "%s: word %zu wrong\n", who, i); exit(3); }
        s += a[i] >> 4;
    }
    return s;
}

static void *blocked_reader(void *out) {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    *(uint64_t *)out = sum_all("thread blocking every signal");
    return NULL;
}

static void own_bus_handler(int sig, siginfo_t *si, void *ctx) {
    (void)sig; (void)ctx;
    static const char msg[] = "sigmasks: the program's own SIGBUS handler got a bus error\n";
    write(2, msg, sizeof msg - 1);
    (void)si;
    _exit(9);
}

static void real_bus_error(int sig, siginfo_t *si, void *ctx) {
    (void)sig; (void)ctx;
    static const char msg[] = "own SIGBUS handler: a real bus error\n";
    write(1, msg, sizeof msg - 1);
    _exit(si->si_code == BUS_ADRERR ? 0 : 8);
}

static void usr1(int sig) { (void)sig; in_handler_sum = sum_all("SIGUSR1 handler with a full sa_mask"); }
static void usr2(int sig) { (void)sig; in_handler_sum = sum_all("SIGUSR2 handler installed before the pager"); }

int main(int argc, char **argv) {
    size_t bytes = (argc > 1 ? strtoul(argv[1], 0, 10) : 64) << 20;
    /* Installed while no pager runs yet (uswap run starts one lazily, once the heap grows). */
    struct sigaction early;
    memset(&early, 0, sizeof early);
    early.sa_handler = usr2;
    sigfillset(&early.sa_mask);
    if (sigaction(SIGUSR2, &early, NULL)) { perror("sigaction"); return 1; }
    words = bytes / 8;
    a = malloc(bytes);
    if (!a) { perror("malloc"); return 1; }
    for (size_t i = 0; i < words; i++) a[i] = pattern(i);

    uint64_t s1 = 0;
    pthread_t t;
    if (pthread_create(&t, NULL, blocked_reader, &s1) || pthread_join(t, NULL)) { perror("thread"); return 1; }
    printf("blocked thread %llx\n", (unsigned long long)s1);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = own_bus_handler;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, NULL)) { perror("sigaction"); return 1; }
    printf("own SIGBUS handler (sigaction) %llx\n", (unsigned long long)sum_all("own SIGBUS handler"));
    signal(SIGBUS, SIG_DFL);
    printf("SIGBUS back to default (signal) %llx\n", (unsigned long long)sum_all("SIGBUS default"));

    struct sigaction su;
    memset(&su, 0, sizeof su);
    su.sa_handler = usr1;
    sigfillset(&su.sa_mask);
    if (sigaction(SIGUSR1, &su, NULL)) { perror("sigaction"); return 1; }
    raise(SIGUSR1);
    printf("SIGUSR1 handler %llx\n", (unsigned long long)in_handler_sum);
    raise(SIGUSR2);
    printf("SIGUSR2 handler %llx\n", (unsigned long long)in_handler_sum);

    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, &old);
    printf("every signal blocked (sigprocmask) %llx\n", (unsigned long long)sum_all("sigprocmask"));
    sigprocmask(SIG_SETMASK, &old, NULL);

    sa.sa_sigaction = real_bus_error;
    if (sigaction(SIGBUS, &sa, NULL)) { perror("sigaction"); return 1; }
    FILE *f = tmpfile();
    if (!f) { perror("tmpfile"); return 1; }
    volatile char *p = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fileno(f), 0);
    if (p == MAP_FAILED) { perror("mmap"); return 1; }
    fflush(stdout);
    return p[0]; /* SIGBUS: the file is empty */
}
