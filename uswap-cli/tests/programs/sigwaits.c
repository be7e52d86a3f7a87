/* Waits for SIGUSR1 the ways that set a mask for the wait, each with every other signal
 * blocked meanwhile (SIGBUS too): sigsuspend, ppoll, pselect and epoll_pwait. The handler
 * that ends each wait reads every word of MIB MiB of pseudo-random words, out of RAM under
 * the limit. Prints "OK" and exits 0 when each handler ran and found every word.
 *
 * What it found: in signal mode the handler ran with SIGBUS blocked by the wait's mask, and
 * its first fault killed the program (status 135). Usage: sigwaits MIB */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <unistd.h>

static uint64_t *words;
static size_t nr_words;
static volatile int handled, held;

static uint64_t word_at(size_t i) { return (i * 0x9E3779B97F4A7C15ULL) ^ (i >> 3); }

static void on_usr1(int sig) {
    (void)sig;
    int all = 1;
    for (size_t i = 0; i < nr_words; i++) all &= words[i] == word_at(i);
    held += all;
    handled++;
}

/* Sends SIGUSR1 to the process once its main thread waits (SIGUSR1 is blocked here). */
static void *sender(void *arg) {
    (void)arg;
    usleep(50 * 1000);
    kill(getpid(), SIGUSR1);
    return 0;
}

static void send_soon(void) {
    pthread_t t;
    if (pthread_create(&t, 0, sender, 0) == 0) pthread_detach(t);
}

int main(int argc, char **argv) {
    nr_words = (argc > 1 ? strtoul(argv[1], 0, 10) : 64) << 17;
    words = malloc(nr_words * sizeof *words);
    if (!words) { perror("malloc"); return 1; }
    for (size_t i = 0; i < nr_words; i++) words[i] = word_at(i);
    struct sigaction sa = {0};
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, 0);
    sigset_t usr1, all_but_usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    sigprocmask(SIG_BLOCK, &usr1, 0);
    sigfillset(&all_but_usr1);
    sigdelset(&all_but_usr1, SIGUSR1);
    struct timespec five_s = {5, 0};
    int ep = epoll_create1(0);
    struct epoll_event ev;

    send_soon();
    sigsuspend(&all_but_usr1);
    send_soon();
    ppoll(0, 0, &five_s, &all_but_usr1);
    send_soon();
    pselect(0, 0, 0, 0, &five_s, &all_but_usr1);
    send_soon();
    epoll_pwait(ep, &ev, 1, 5000, &all_but_usr1);
    if (handled != 4 || held != 4) { fprintf(stderr, "handled %d, every word held in %d\n", handled, held); return 1; }
    printf("OK\n");
    return 0;
}
