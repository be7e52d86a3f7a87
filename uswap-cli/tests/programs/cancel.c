/* pthread_cancel of threads blocked in system calls on managed memory: each of 4 threads
 * reads from a pipe nobody writes into its own buffer in the heap (pushed out first by
 * MIB of data written after it), and is cancelled there; the data is then checked. In
 * signal mode the call runs through the preload's rewritten `syscall`, and the thread is
 * unwound from inside it: the preload's frames must let it through (a destructor in them
 * aborted the process). Then 50 threads are cancelled 2 ms after they start, as they
 * write a buffer of 1 MiB and read into it: some while the preload brings the buffer's
 * pages in for the `read` (unwound there, that aborted the process). Usage: cancel MIB */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int fds[2];

static void *reader(void *buf) {
    for (;;) {
        if (read(fds[0], buf, 1 << 16) <= 0) break;
    }
    return NULL;
}

static void *quick_reader(void *unused) {
    (void)unused;
    char *buf = malloc(1 << 20);
    for (size_t i = 0; i < (1 << 20); i += 4096) buf[i] = (char)i;
    for (;;) {
        if (read(fds[0], buf, 1 << 20) <= 0) break;
    }
    return NULL;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 64;
    if (pipe(fds)) { perror("pipe"); return 1; }
    char *bufs[4];
    for (int i = 0; i < 4; i++) bufs[i] = malloc(1 << 16);
    size_t words = (mib << 20) / 8;
    uint64_t *a = malloc(words * 8);
    if (!a) { perror("malloc"); return 1; }
    for (size_t i = 0; i < words; i++) a[i] = i * 0x9E3779B97F4A7C15ull;
    pthread_t t[4];
    for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, reader, bufs[i]);
    usleep(300000);
    int cancelled = 0;
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_cancel(t[i]);
        pthread_join(t[i], &r);
        cancelled += r == PTHREAD_CANCELED;
    }
    for (size_t i = 0; i < words; i++) {
        if (a[i] != i * 0x9E3779B97F4A7C15ull) { fprintf(stderr, "word %zu wrong\n", i); return 3; }
    }
    int quick = 0;
    for (int i = 0; i < 50; i++) {
        pthread_t q;
        void *r;
        pthread_create(&q, NULL, quick_reader, NULL);
        usleep(2000);
        pthread_cancel(q);
        pthread_join(q, &r);
        quick += r == PTHREAD_CANCELED;
    }
    printf("cancelled %d of 4, %zu MiB checked, then %d of 50 as they started\n", cancelled, mib, quick);
    return 0;
}
