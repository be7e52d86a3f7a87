/* A SIGSEGV sent to the process (kill, as a watchdog or a test harness does) runs the
 * program's handler on one of the program's threads, never on one of uswap's: three
 * threads touch MIB of data at random, only the first leaves SIGSEGV unblocked, and a child
 * sends the parent 200 SIGSEGVs; the handler reads some of the data. Before, most of them
 * ran on uswap's threads (which left SIGSEGV unblocked), and in thread mode the handler
 * waited there for the fault it was to serve: the program hung.
 * Usage: killsegv MIB. Prints what it saw; exits 0 when every byte and every thread was
 * right. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static uint64_t *data;
static size_t words;
static atomic_long handled, wrong_thread, bad;
static atomic_int stop;
static pid_t tids[4];

static uint64_t word(size_t i) { return i * 0x9E3779B97F4A7C15ull + 1; }

static void on_segv(int sig, siginfo_t *si, void *uc) {
    (void)sig, (void)uc;
    if (si->si_code != SI_USER) abort(); /* a real fault: not this test's */
    pid_t me = (pid_t)syscall(SYS_gettid);
    int ours = 0;
    for (int i = 0; i < 4; i++) ours |= tids[i] == me;
    wrong_thread += !ours;
    for (size_t k = 0; k < 8; k++) {
        size_t i = (size_t)(handled * 7919 + k * 104729) % words;
        bad += data[i] != word(i);
    }
    handled++;
}

static void *toucher(void *arg) {
    long id = (long)arg;
    tids[1 + id] = (pid_t)syscall(SYS_gettid);
    if (id != 0) {
        sigset_t s;
        sigemptyset(&s), sigaddset(&s, SIGSEGV);
        pthread_sigmask(SIG_BLOCK, &s, 0);
    }
    uint64_t x = (uint64_t)id * 2654435761u + 1;
    while (!stop) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        size_t i = x % words;
        bad += data[i] != word(i);
    }
    return 0;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 64;
    words = (mib << 20) / 8;
    data = malloc(words * 8);
    for (size_t i = 0; i < words; i++) data[i] = word(i);
    struct sigaction sa = {0};
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(SIGSEGV, &sa, 0);
    tids[0] = getpid();
    pthread_t t[3];
    for (long i = 0; i < 3; i++) pthread_create(&t[i], 0, toucher, (void *)i);
    usleep(100000);
    sigset_t s;
    sigemptyset(&s), sigaddset(&s, SIGSEGV);
    pthread_sigmask(SIG_BLOCK, &s, 0); /* only the first toucher takes it */
    pid_t parent = getpid(), child = fork();
    if (child == 0) {
        for (int k = 0; k < 200; k++) kill(parent, SIGSEGV), usleep(2000);
        _exit(0);
    }
    waitpid(child, 0, 0);
    usleep(200000);
    stop = 1;
    for (int i = 0; i < 3; i++) pthread_join(t[i], 0);
    for (size_t i = 0; i < words; i++) bad += data[i] != word(i);
    printf("killsegv: handled %d, wrong thread %ld, bad %ld\n", handled > 0, (long)wrong_thread, (long)bad);
    return !(handled > 0 && wrong_thread == 0 && bad == 0);
}
