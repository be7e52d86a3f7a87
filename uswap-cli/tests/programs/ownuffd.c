/* Serves the faults of a mapping with a userfaultfd of its own, as a VMM restoring a
 * snapshot does: maps argv[2] MiB (8 by default), registers it for missing pages, and a
 * thread of its own fills each page it is asked for with a pattern of its address; the main
 * thread reads every byte. Meanwhile it writes and checks a buffer of argv[1] MiB, so that
 * uswap pages it.
 * Prints "ok PAGES" (the pages its own thread served) or what was wrong, exit 1. */
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PAGE 4096UL

static int uffd;
static unsigned long served;

static unsigned char pattern(uintptr_t addr) { return (unsigned char)((addr >> 12) * 29 + (addr & 0xfff)); }

static void *serve(void *arg) {
    (void)arg;
    static unsigned char page[PAGE] __attribute__((aligned(4096)));
    for (;;) {
        struct uffd_msg msg;
        ssize_t n = read(uffd, &msg, sizeof msg);
        if (n != sizeof msg) {
            if (n < 0 && errno == EINTR) continue;
            printf("wrong: read of the userfaultfd (%zd, errno %d)\n", n, errno);
            fflush(stdout);
            _exit(1);
        }
        if (msg.event != UFFD_EVENT_PAGEFAULT) continue;
        uintptr_t at = msg.arg.pagefault.address & ~(PAGE - 1);
        for (unsigned long i = 0; i < PAGE; i++) page[i] = pattern(at + i);
        struct uffdio_copy copy = {.dst = at, .src = (uintptr_t)page, .len = PAGE};
        if (ioctl(uffd, UFFDIO_COPY, &copy) == 0) {
            __atomic_add_fetch(&served, 1, __ATOMIC_RELAXED);
        } else if (errno != EEXIST) {
            printf("wrong: UFFDIO_COPY (errno %d)\n", errno);
            fflush(stdout);
            _exit(1);
        }
    }
}

int main(int argc, char **argv) {
    size_t len = (size_t)(argc > 1 ? atol(argv[1]) : 64) << 20, own = (size_t)(argc > 2 ? atol(argv[2]) : 8) << 20;
    unsigned char *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *area = mmap(NULL, own, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED || area == MAP_FAILED) return printf("wrong: mmap\n"), 1;
    for (size_t i = 0; i < len; i++) buf[i] = (unsigned char)(i * 7 + (i >> 12));
#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif
    /* Faults from user space only: what an unprivileged process may ask for. */
    uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY);
    if (uffd < 0) return printf("wrong: userfaultfd (errno %d)\n", errno), 1;
    struct uffdio_api api = {.api = UFFD_API};
    if (ioctl(uffd, UFFDIO_API, &api) != 0) return printf("wrong: UFFDIO_API (errno %d)\n", errno), 1;
    struct uffdio_register reg = {.range = {.start = (uintptr_t)area, .len = own}, .mode = UFFDIO_REGISTER_MODE_MISSING};
    if (ioctl(uffd, UFFDIO_REGISTER, &reg) != 0) return printf("wrong: UFFDIO_REGISTER (errno %d)\n", errno), 1;
    pthread_t t;
    pthread_create(&t, NULL, serve, NULL);
    for (size_t i = 0; i < own; i++)
        if (area[i] != pattern((uintptr_t)area + i)) return printf("wrong: byte %zu of the served area\n", i), 1;
    for (size_t i = 0; i < len; i++)
        if (buf[i] != (unsigned char)(i * 7 + (i >> 12))) return printf("wrong: byte %zu of the buffer\n", i), 1;
    printf("ok %lu\n", __atomic_load_n(&served, __ATOMIC_RELAXED));
    return 0;
}
