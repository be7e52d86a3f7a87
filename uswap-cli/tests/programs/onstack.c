/* A handler installed with SA_ONSTACK by a program that sets no alternate stack of its own
 * (as crash reporters do) runs on the thread's own stack without uswap, and may use much of
 * it: this one's frame is 512 KiB. It runs on the main thread and on a second one, and
 * prints a sum of its frame. Usage: onstack */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

static volatile unsigned long sums[2];

static void handler(int sig) {
    volatile unsigned char frame[512 << 10];
    memset((void *)frame, sig, sizeof frame);
    unsigned long s = 0;
    for (size_t i = 0; i < sizeof frame; i += 4096) s += frame[i];
    sums[sums[0] != 0] = s;
}

static void *second(void *arg) {
    (void)arg;
    raise(SIGUSR1);
    return NULL;
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sa.sa_flags = SA_ONSTACK;
    sigaction(SIGUSR1, &sa, NULL);
    raise(SIGUSR1);
    pthread_t t;
    if (pthread_create(&t, NULL, second, NULL) != 0) return 1;
    pthread_join(t, NULL);
    printf("%lu %lu\n", sums[0], sums[1]);
    return 0;
}
