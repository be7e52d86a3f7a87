/* Code running on stacks the program made itself, in memory uswap manages, while a timer
 * signal's handler (installed without SA_ONSTACK) has its frames written onto them: 64
 * coroutines (makecontext) on stacks from malloc, then a thread given a stack from malloc
 * (pthread_attr_setstack). Each recurses deeply, filling and checking its frames, and
 * meanwhile a buffer of argv[1] MiB (over the limit) is written and read back, so that the
 * pager works. In signal mode the kernel could not write a frame onto a stack page that was
 * out or never touched, and the program died of SIGSEGV at once.
 * Prints "signalstacks: coroutines ok, thread ok, buffer ok, ticks yes" and exits 0. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <ucontext.h>

#define COROUTINES 64
#define STACK_BYTES (1 << 20)
#define DEPTH 100

static ucontext_t main_ctx, ctx[COROUTINES];
static unsigned long sums[COROUTINES];
static int finished[COROUTINES];
static volatile unsigned long ticks;

static void on_alarm(int sig) {
    volatile char pad[2048];
    pad[sig % 2048] = 1;
    ticks += pad[sig % 2048];
}

/* Fills a frame of 8 KiB at each level, yields (for a coroutine), and counts what is
 * still as written on the way back up: 16 per level. */
static int fill(int id, int depth, int yield) {
    volatile unsigned char buf[8192];
    for (int i = 0; i < (int)sizeof buf; i++) buf[i] = (unsigned char)(id * 31 + depth * 7 + i);
    int same = 0;
    if (depth > 0) {
        same = fill(id, depth - 1, yield);
        if (yield) swapcontext(&ctx[id], &main_ctx);
    }
    for (int i = 0; i < (int)sizeof buf; i += 512) same += buf[i] == (unsigned char)(id * 31 + depth * 7 + i);
    return same;
}

static void coroutine(int id) {
    for (int round = 0; round < 3; round++) sums[id] += fill(id, DEPTH, 1);
    finished[id] = 1;
}

static void *thread_body(void *arg) {
    sigset_t alarm;
    sigemptyset(&alarm);
    sigaddset(&alarm, SIGALRM);
    pthread_sigmask(SIG_UNBLOCK, &alarm, NULL);
    unsigned long sum = 0;
    for (int round = 0; round < 20; round++) sum += fill(COROUTINES, DEPTH, 0);
    *(unsigned long *)arg = sum;
    return NULL;
}

int main(int argc, char **argv) {
    size_t buf_bytes = (size_t)(argc > 1 ? atol(argv[1]) : 64) << 20;
    struct sigaction sa = {0};
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval every_200us = {{0, 200}, {0, 200}};
    setitimer(ITIMER_REAL, &every_200us, NULL);

    unsigned char *buf = malloc(buf_bytes);
    for (size_t i = 0; i < buf_bytes; i++) buf[i] = (unsigned char)(i * 13 + 5);

    /* The thread first, with the signal blocked here so that it takes the ticks. */
    sigset_t alarm;
    sigemptyset(&alarm);
    sigaddset(&alarm, SIGALRM);
    pthread_sigmask(SIG_BLOCK, &alarm, NULL);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstack(&attr, malloc(STACK_BYTES * 2), STACK_BYTES * 2);
    pthread_t t;
    unsigned long thread_sum = 0;
    if (pthread_create(&t, &attr, thread_body, &thread_sum) != 0) return printf("signalstacks: pthread_create\n"), 1;
    pthread_join(t, NULL);
    pthread_sigmask(SIG_UNBLOCK, &alarm, NULL);

    for (int i = 0; i < COROUTINES; i++) {
        getcontext(&ctx[i]);
        ctx[i].uc_stack.ss_sp = malloc(STACK_BYTES);
        ctx[i].uc_stack.ss_size = STACK_BYTES;
        ctx[i].uc_link = &main_ctx;
        makecontext(&ctx[i], (void (*)(void))coroutine, 1, i);
    }
    for (int live = COROUTINES; live;) {
        live = 0;
        for (int i = 0; i < COROUTINES; i++)
            if (!finished[i]) {
                swapcontext(&main_ctx, &ctx[i]);
                live++;
            }
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    unsigned long total = 0;
    for (int i = 0; i < COROUTINES; i++) total += sums[i];
    int buf_ok = 1;
    for (size_t i = 0; i < buf_bytes; i++) buf_ok &= buf[i] == (unsigned char)(i * 13 + 5);
    const unsigned long per_fill = (DEPTH + 1) * 16;
    int coroutines_ok = total == COROUTINES * 3 * per_fill, thread_ok = thread_sum == 20 * per_fill;
    printf("signalstacks: coroutines %s, thread %s, buffer %s, ticks %s\n", coroutines_ok ? "ok" : "WRONG",
           thread_ok ? "ok" : "WRONG", buf_ok ? "ok" : "WRONG", ticks > 0 ? "yes" : "no");
    return !(coroutines_ok && thread_ok && buf_ok);
}
