/* A main thread that starts a worker and ends with pthread_exit, as some servers' and
 * tools' do: the worker writes and checks a buffer of argv[1] MiB (so that uswap pages it),
 * prints "ok" to stdout (a pipe: buffered until exit) and returns. The process ends when
 * its last thread has, with status 0 and its output flushed, as glibc's last thread calls
 * exit(0). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static size_t len;

static unsigned char value(size_t i) { return (unsigned char)(i * 2654435761u >> 13); }

static void *work(void *arg) {
    (void)arg;
    unsigned char *buf = malloc(len);
    if (!buf) { printf("malloc failed\n"); return NULL; }
    for (size_t i = 0; i < len; i++) buf[i] = value(i);
    for (size_t i = 0; i < len; i++)
        if (buf[i] != value(i)) { printf("byte %zu differs\n", i); return NULL; }
    printf("ok\n");
    return NULL;
}

int main(int argc, char **argv) {
    len = (size_t)(argc > 1 ? atol(argv[1]) : 64) << 20;
    pthread_t t;
    if (pthread_create(&t, NULL, work, NULL)) { printf("pthread_create failed\n"); return 1; }
    pthread_exit(NULL);
}
