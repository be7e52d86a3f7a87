// Signal handlers that touch managed memory, run in the middle of system calls on managed
// memory: four threads copy random pages of a buffer larger than the limit through pipes
// (write one page, read it into another), while a fifth sends them SIGUSR1 every 20 us; the
// handler flips a byte of its thread's own heap block, which may be out. Usage: sigcopy
// BUFFER_MIB SECONDS [SA_FLAGS]. Prints "copies N signalled yes|no bad B"; exits 1 if a call failed
// or a page read other bytes than its source.
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PAGE 4096
#define THREADS 4

static atomic_int stop;
static atomic_long copies, signals, bad;
static __thread unsigned char *own_block;
static pthread_t threads[THREADS];
static uint64_t *buf;
static size_t nr_pages;

static void on_usr1(int sig) {
    (void)sig;
    long n = atomic_fetch_add(&signals, 1);
    if (own_block)
        own_block[(n % 64) * PAGE] ^= 1;
}

static void *signaller(void *arg) {
    (void)arg;
    unsigned x = 7;
    while (!atomic_load(&stop)) {
        pthread_kill(threads[(x = x * 1103515245 + 12345) >> 8 & (THREADS - 1)], SIGUSR1);
        usleep(20);
    }
    return NULL;
}

// Every page holds its number in each word; a copy of page p into page q is checked, then
// page q gets its own number back (written through memory, not a call).
static void *copier(void *arg) {
    unsigned x = (unsigned)(uintptr_t)arg;
    own_block = malloc(64 * PAGE);
    memset(own_block, 0, 64 * PAGE);
    int fd[2];
    if (pipe(fd))
        return NULL;
    while (!atomic_load(&stop)) {
        size_t p = (x = x * 1103515245 + 12345) % nr_pages;
        size_t q = (x = x * 1103515245 + 12345) % nr_pages;
        // Pages p and q of this thread only: thread t owns pages t, t + THREADS, ...
        size_t t = (uintptr_t)arg % THREADS;
        p = p - p % THREADS + t;
        q = q - q % THREADS + t;
        if (p >= nr_pages || q >= nr_pages)
            continue;
        uint64_t *dst = buf + q * (PAGE / 8);
        if (write(fd[1], buf + p * (PAGE / 8), PAGE) != PAGE || read(fd[0], dst, PAGE) != PAGE) {
            atomic_fetch_add(&bad, 1);
            break;
        }
        for (size_t i = 0; i < PAGE / 8; i++)
            if (dst[i] != p) {
                atomic_fetch_add(&bad, 1);
                break;
            }
        for (size_t i = 0; i < PAGE / 8; i++)
            dst[i] = q;
        atomic_fetch_add(&copies, 1);
    }
    close(fd[0]);
    close(fd[1]);
    return NULL;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 64;
    int secs = argc > 2 ? atoi(argv[2]) : 4;
    nr_pages = mib << 20 >> 12;
    buf = mmap(NULL, nr_pages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) {
        perror("mmap");
        return 2;
    }
    for (size_t p = 0; p < nr_pages; p++)
        for (size_t i = 0; i < PAGE / 8; i++)
            buf[p * (PAGE / 8) + i] = p;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = argc > 3 ? (int)strtol(argv[3], NULL, 0) : 0;
    sigaction(SIGUSR1, &sa, NULL);
    for (uintptr_t t = 0; t < THREADS; t++)
        pthread_create(&threads[t], NULL, copier, (void *)(t * 99 + 1));
    pthread_t s;
    pthread_create(&s, NULL, signaller, NULL);
    sleep(secs);
    atomic_store(&stop, 1);
    pthread_join(s, NULL);
    for (int t = 0; t < THREADS; t++)
        pthread_join(threads[t], NULL);
    printf("copies %ld signalled %s bad %ld\n", atomic_load(&copies), atomic_load(&signals) > 0 ? "yes" : "no",
           atomic_load(&bad));
    return atomic_load(&bad) ? 1 : 0;
}
