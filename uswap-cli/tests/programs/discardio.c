// System calls on managed memory that is out while another thread discards memory of its own:
// each madvise(MADV_DONTNEED) sends an event, and until the engine reads it the kernel
// refuses every userfaultfd ioctl. Two threads copy pages of a buffer larger than the limit
// through pipes (write from one page, read into another), checking each page's bytes; a third
// discards a mapping of its own over and over. Usage: discardio BUFFER_MIB SECONDS. Prints
// "copies N efault E bad B"; exits 1 if a call failed or a page read other bytes.
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096

static atomic_int stop;
static atomic_long copies, efaults, bad;
static unsigned char *buf;
static size_t nr_pages;

// The word a page holds at word w once it holds the copy of page `src`.
static uint64_t word_of(size_t src, size_t w) { return (src + 1) * 0x9E3779B97F4A7C15ull ^ (w * 0xBF58476D1CE4E5B9ull); }

static void *discarder(void *arg) {
    (void)arg;
    char *m = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    while (!atomic_load(&stop)) {
        memset(m, 1, 1 << 20);
        madvise(m, 1 << 20, MADV_DONTNEED);
    }
    return NULL;
}

// Thread t owns the pages p with p % 2 == t: it writes page p to a pipe and reads it back
// into page p (the same bytes), then checks them, walking the buffer in strides of 14 pages
// from a start that moves each round, so that most pages it meets are out.
static void *copier(void *arg) {
    size_t t = (size_t)arg;
    int fd[2];
    if (pipe(fd))
        return NULL;
    for (size_t round = 0; !atomic_load(&stop); round++) {
        for (size_t p = t + 2 * (round % 7); p < nr_pages && !atomic_load(&stop); p += 2 * 7) {
            unsigned char *page = buf + p * PAGE;
            ssize_t w = write(fd[1], page, PAGE);
            ssize_t r = w == PAGE ? read(fd[0], page, PAGE) : 0;
            if (w != PAGE || r != PAGE) {
                if ((w < 0 || r < 0) && errno == EFAULT)
                    atomic_fetch_add(&efaults, 1);
                else
                    atomic_fetch_add(&bad, 1);
                close(fd[0]);
                close(fd[1]);
                if (pipe(fd))
                    return NULL;
                continue;
            }
            uint64_t *words = (uint64_t *)page;
            for (size_t i = 0; i < PAGE / 8; i++)
                if (words[i] != word_of(p, i)) {
                    atomic_fetch_add(&bad, 1);
                    break;
                }
            atomic_fetch_add(&copies, 1);
        }
    }
    close(fd[0]);
    close(fd[1]);
    return NULL;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 48;
    int secs = argc > 2 ? atoi(argv[2]) : 4;
    nr_pages = mib << 20 >> 12;
    buf = mmap(NULL, nr_pages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) {
        perror("mmap");
        return 2;
    }
    for (size_t p = 0; p < nr_pages; p++)
        for (size_t i = 0; i < PAGE / 8; i++)
            ((uint64_t *)(buf + p * PAGE))[i] = word_of(p, i);
    pthread_t d, c[2];
    pthread_create(&d, NULL, discarder, NULL);
    for (size_t t = 0; t < 2; t++)
        pthread_create(&c[t], NULL, copier, (void *)t);
    sleep(secs);
    atomic_store(&stop, 1);
    pthread_join(d, NULL);
    for (size_t t = 0; t < 2; t++)
        pthread_join(c[t], NULL);
    printf("copies %ld efault %ld bad %ld\n", atomic_load(&copies), atomic_load(&efaults), atomic_load(&bad));
    return atomic_load(&efaults) || atomic_load(&bad) ? 1 : 0;
}
