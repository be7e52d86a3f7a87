/* Memory the kernel pins for I/O: an io_uring's registered buffers (IORING_REGISTER_BUFFERS),
 * larger than the limit, then more memory written beside them. The kernel refuses to move
 * pinned pages out. Then the program sleeps SECONDS and prints the CPU time it used meanwhile
 * ("idle cpu_ms N"), checks every byte of both buffers, unregisters, and prints "ok" or
 * "bad N" (or "io_uring refused" where the kernel refuses io_uring).
 * Usage: pinned PINNED_MIB OTHER_MIB SECONDS. */
#include <linux/io_uring.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

static uint64_t word(uint64_t seed, size_t i) {
    uint64_t x = seed + i * 0x9E3779B97F4A7C15ull;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    return x ^ (x >> 29);
}

static void fill(uint64_t *p, size_t len, uint64_t seed) {
    for (size_t i = 0; i < len / 8; i++)
        p[i] = word(seed, i);
}

static long check(const uint64_t *p, size_t len, uint64_t seed) {
    long bad = 0;
    for (size_t i = 0; i < len / 8; i++)
        bad += p[i] != word(seed, i);
    return bad;
}

static long cpu_ms(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1000 + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1000;
}

int main(int argc, char **argv) {
    size_t pinned_len = (size_t)(argc > 1 ? atoi(argv[1]) : 24) << 20;
    size_t other_len = (size_t)(argc > 2 ? atoi(argv[2]) : 16) << 20;
    int seconds = argc > 3 ? atoi(argv[3]) : 3;
    uint64_t *pinned = mmap(NULL, pinned_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint64_t *other = mmap(NULL, other_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (pinned == MAP_FAILED || other == MAP_FAILED) {
        perror("mmap");
        return 2;
    }
    fill(pinned, pinned_len, 1);
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    long ring = syscall(SYS_io_uring_setup, 4, &p);
    if (ring < 0) {
        printf("io_uring refused\n");
        return 0;
    }
    struct iovec iov = {pinned, pinned_len};
    if (syscall(SYS_io_uring_register, ring, IORING_REGISTER_BUFFERS, &iov, 1) != 0) {
        perror("IORING_REGISTER_BUFFERS");
        return 2;
    }
    fill(other, other_len, 2);
    long before = cpu_ms();
    sleep(seconds);
    printf("idle cpu_ms %ld\n", cpu_ms() - before);
    long bad = check(pinned, pinned_len, 1) + check(other, other_len, 2);
    syscall(SYS_io_uring_register, ring, IORING_UNREGISTER_BUFFERS, NULL, 0);
    close((int)ring);
    if (bad) {
        printf("bad %ld\n", bad);
        return 1;
    }
    printf("ok\n");
    return 0;
}
