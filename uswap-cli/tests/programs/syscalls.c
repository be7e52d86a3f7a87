/* System calls on managed memory that is out (swapped, or never touched), as a program makes
 * them: read/write, pread/pwrite, readv/writev, a pipe, datagrams with send/recv and
 * sendmsg/recvmsg, stdio flushing a buffer on the heap, stat into a heap struct, a path on
 * the heap, getrandom. Every byte is checked; prints "ok <checksum>" and exits 0 if all
 * match, else names the first call that went wrong and exits 1.
 * usage: syscalls WSS_MIB DIR */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#define PAGE 4096
static size_t n;
static char *a, *b;

static void fail(const char *what, size_t at) {
    printf("%s failed at page %zu: errno %d (%s)\n", what, at / PAGE, errno, strerror(errno));
    exit(1);
}

static char expect(size_t i) { return (char)(i / PAGE * 7 + i % 251); }

/* Evicts a's and b's pages by sweeping a third buffer as large as both. */
static void sweep(void) {
    static char *c;
    if (!c) c = malloc(n);
    for (size_t i = 0; i < n; i += PAGE) c[i] = (char)i;
}

int main(int argc, char **argv) {
    n = (size_t)atol(argv[1]) << 20;
    a = malloc(n);
    b = malloc(n); /* never touched before the reads below */
    for (size_t i = 0; i < n; i++) a[i] = expect(i);
    sweep();
    char path[4096];
    snprintf(path, sizeof path, "%s/syscalls.dat", argv[2]);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) fail("open", 0);
    for (size_t i = 0; i < n; i += 16 * PAGE)
        if (write(fd, a + i, 16 * PAGE) != 16 * PAGE) fail("write", i);
    sweep();
    for (size_t i = 0; i < n; i += 16 * PAGE)
        if (pread(fd, b + i, 16 * PAGE, i) != 16 * PAGE) fail("pread", i);
    if (memcmp(a, b, n)) fail("pread contents", 0);
    sweep();
    /* readv/writev with the iovec array itself on the heap, in two halves */
    struct iovec *iov = malloc(2 * sizeof *iov);
    for (size_t i = 0; i < n; i += 32 * PAGE) {
        iov[0] = (struct iovec){a + i, 16 * PAGE};
        iov[1] = (struct iovec){a + i + 16 * PAGE, 16 * PAGE};
        if (pwritev(fd, iov, 2, i) != 32 * PAGE) fail("pwritev", i);
    }
    memset(b, 0, n);
    sweep();
    lseek(fd, 0, SEEK_SET);
    for (size_t i = 0; i < n; i += 32 * PAGE) {
        iov[0] = (struct iovec){b + i, 16 * PAGE};
        iov[1] = (struct iovec){b + i + 16 * PAGE, 16 * PAGE};
        if (readv(fd, iov, 2) != 32 * PAGE) fail("readv", i);
    }
    if (memcmp(a, b, n)) fail("readv contents", 0);
    /* a pipe */
    int p[2];
    if (pipe(p)) fail("pipe", 0);
    sweep();
    for (size_t i = 0; i < n; i += 8 * PAGE) {
        if (write(p[1], a + i, 8 * PAGE) != 8 * PAGE) fail("pipe write", i);
        size_t got = 0;
        while (got < 8 * PAGE) {
            ssize_t r = read(p[0], b + ((i + n / 2) % n) + got, 8 * PAGE - got);
            if (r <= 0) fail("pipe read", i);
            got += r;
        }
        if (memcmp(a + i, b + (i + n / 2) % n, 8 * PAGE)) fail("pipe contents", i);
    }
    /* datagrams: every one received, none lost, with send/recv and sendmsg/recvmsg */
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_DGRAM, 0, sv)) fail("socketpair", 0);
    sweep();
    for (size_t i = 0; i + 4 * PAGE <= n; i += 64 * PAGE) {
        char *dst = b + (i * 3) % (n - 4 * PAGE);
        if (send(sv[0], a + i, 3000, 0) != 3000) fail("send", i);
        if (recv(sv[1], dst, 3000, 0) != 3000) fail("recv", i);
        if (memcmp(dst, a + i, 3000)) fail("recv contents", i);
        struct msghdr *m = calloc(1, sizeof *m);
        m->msg_iov = iov;
        m->msg_iovlen = 1;
        iov[0] = (struct iovec){a + i + PAGE - 100, 200};
        if (sendmsg(sv[0], m, 0) != 200) fail("sendmsg", i);
        iov[0] = (struct iovec){dst + 2 * PAGE - 50, 200};
        if (recvmsg(sv[1], m, 0) != 200) fail("recvmsg", i);
        if (memcmp(dst + 2 * PAGE - 50, a + i + PAGE - 100, 200)) fail("recvmsg contents", i);
        free(m);
    }
    /* stat into a heap struct, a path on the heap, getrandom */
    struct stat *st = malloc(sizeof *st);
    char *hpath = malloc(4096);
    strcpy(hpath, path);
    sweep();
    if (stat(hpath, st) || (size_t)st->st_size != n) fail("stat", 0);
    if (getrandom(b, 4 * PAGE, 0) != 4 * PAGE) fail("getrandom", 0);
    /* stdio: a full buffer on the heap, flushed from pages that are out */
    FILE *f = fopen(path, "w");
    char *sbuf = malloc(1 << 20);
    setvbuf(f, sbuf, _IOFBF, 1 << 20);
    for (int i = 0; i < 100000; i++) fprintf(f, "%d\n", i);
    sweep();
    if (fclose(f)) fail("fclose", 0);
    f = fopen(path, "r");
    long sum = 0, v;
    while (fscanf(f, "%ld", &v) == 1) sum += v;
    fclose(f);
    if (sum != 100000L * 99999 / 2) fail("stdio contents", 0);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i += 61) h = (h ^ (uint8_t)a[i]) * 1099511628211ull;
    printf("ok %llx\n", (unsigned long long)h);
    return 0;
}
