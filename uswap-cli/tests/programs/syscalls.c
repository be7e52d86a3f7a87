/* System calls on managed memory that is out (swapped, or never touched), as a program makes
 * them: read/write, pread/pwrite, readv/writev, a pipe, datagrams with send/recv and
 * sendmsg/recvmsg, stdio flushing a buffer on the heap, stat into a heap struct, a path on
 * the heap, getrandom; writev/preadv of 64 iovecs, vmsplice from a pipe's read end, POSIX
 * and System V message queues (a message is lost if the copy out fails), futex_waitv on a
 * word that is out, a blocking sendmsg and recv/recvmsg with MSG_WAITALL of the whole
 * buffer over a stream socket (whole, as the kernel promises). Every byte is checked; prints "ok <checksum>" and exits 0 if all
 * match, else names the first call that went wrong and exits 1.
 * usage: syscalls WSS_MIB DIR */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/futex.h>
#include <mqueue.h>
#include <pthread.h>
#include <sys/msg.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
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

static int stream[2];

/* The other end of the stream: all of `a` in one blocking call, sendmsg or send. */
static void *send_all(void *with_sendmsg) {
    ssize_t r;
    if (with_sendmsg) {
        struct iovec v = {a, n};
        struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1};
        r = sendmsg(stream[0], &m, 0);
    } else {
        r = send(stream[0], a, n, 0);
    }
    return (void *)(intptr_t)(r == (ssize_t)n);
}

/* Receives all of `a` into `b` with one MSG_WAITALL call while a thread sends it. */
static void stream_whole(int with_sendmsg) {
    pthread_t t;
    memset(b, 0, n);
    sweep();
    if (pthread_create(&t, NULL, send_all, (void *)(intptr_t)with_sendmsg)) fail("pthread_create", 0);
    ssize_t r;
    if (with_sendmsg) {
        r = recv(stream[1], b, n, MSG_WAITALL);
    } else {
        struct iovec v = {b, n};
        struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1};
        r = recvmsg(stream[1], &m, MSG_WAITALL);
    }
    void *sent;
    pthread_join(t, &sent);
    if (!sent) fail(with_sendmsg ? "blocking sendmsg" : "blocking send", 0);
    if (r != (ssize_t)n) fail(with_sendmsg ? "recv MSG_WAITALL" : "recvmsg MSG_WAITALL", 0);
    if (memcmp(a, b, n)) fail("MSG_WAITALL contents", 0);
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
    /* writev and preadv of 64 iovecs over the whole buffer: whole, as on a regular file */
    struct iovec *many = malloc(64 * sizeof *many);
    for (int k = 0; k < 64; k++) many[k] = (struct iovec){a + k * (n / 64), n / 64};
    sweep();
    if (pwritev(fd, many, 64, 0) != (ssize_t)n) fail("pwritev of 64 iovecs", 0);
    for (int k = 0; k < 64; k++) many[k] = (struct iovec){b + k * (n / 64), n / 64};
    memset(b, 0, n);
    sweep();
    if (preadv(fd, many, 64, 0) != (ssize_t)n) fail("preadv of 64 iovecs", 0);
    if (memcmp(a, b, n)) fail("preadv of 64 iovecs contents", 0);
    /* vmsplice from the pipe's read end writes the caller's buffer */
    sweep();
    for (size_t i = 0; i < n; i += n / 8) {
        if (write(p[1], a + i, 16 * PAGE) != 16 * PAGE) fail("pipe write for vmsplice", i);
        struct iovec v = {b + (i + n / 3) % (n - 16 * PAGE), 16 * PAGE};
        char *dst = v.iov_base;
        size_t got = 0;
        while (got < 16 * PAGE) {
            ssize_t r = vmsplice(p[0], &v, 1, 0);
            if (r <= 0) fail("vmsplice from the read end", i);
            got += r;
            v.iov_base = dst + got;
            v.iov_len = 16 * PAGE - got;
        }
        if (memcmp(dst, a + i, 16 * PAGE)) fail("vmsplice contents", i);
    }
    /* POSIX message queue: 1 MiB messages where allowed (root), else the default 8 KiB */
    char qname[64];
    snprintf(qname, sizeof qname, "/uswap-syscalls-%d", getpid());
    struct mq_attr qa = {.mq_maxmsg = 2, .mq_msgsize = 1 << 20};
    mqd_t q = mq_open(qname, O_RDWR | O_CREAT | O_EXCL, 0600, &qa);
    if (q == (mqd_t)-1 && errno == EINVAL) {
        qa.mq_msgsize = 8192;
        q = mq_open(qname, O_RDWR | O_CREAT | O_EXCL, 0600, &qa);
    }
    if (q == (mqd_t)-1) fail("mq_open", 0);
    mq_unlink(qname);
    size_t qmsg = qa.mq_msgsize;
    for (size_t i = 0; i + qmsg <= n; i += n / 4) {
        sweep();
        if (mq_send(q, a + i, qmsg, 1)) fail("mq_send", i);
        char *dst = b + (i + n / 2) % (n - qmsg);
        unsigned *prio = (unsigned *)(b + n - 4 * PAGE);
        sweep();
        if (mq_receive(q, dst, qmsg, prio) != (ssize_t)qmsg) fail("mq_receive", i);
        if (memcmp(dst, a + i, qmsg) || *prio != 1) fail("mq_receive contents", i);
    }
    mq_close(q);
    /* System V message queue: a message of the default largest size, 8 KiB */
    int mq = msgget(IPC_PRIVATE, 0600);
    if (mq < 0) fail("msgget", 0);
    for (size_t i = 0; i + 3 * PAGE <= n; i += n / 4) {
        long *snd = (long *)(a + i + PAGE - 8);
        long type = *snd;
        *snd = 1;
        sweep();
        if (msgsnd(mq, snd, 8192, 0)) fail("msgsnd", i);
        long *rcv = (long *)(b + (i + n / 3) % (n - 3 * PAGE) + PAGE - 8);
        sweep();
        if (msgrcv(mq, rcv, 8192, 0, 0) != 8192) fail("msgrcv", i);
        if (rcv[0] != 1 || memcmp(rcv + 1, snd + 1, 8192)) fail("msgrcv contents", i);
        *snd = type;
    }
    msgctl(mq, IPC_RMID, NULL);
    /* futex_waitv on a word that is out, whose value differs: EAGAIN, not EFAULT */
    struct futex_waitv *w = malloc(sizeof *w);
    uint32_t *word = (uint32_t *)(b + n / 2);
    *word = 5;
    *w = (struct futex_waitv){.val = 4, .uaddr = (uintptr_t)word, .flags = FUTEX_32};
    sweep();
    if (syscall(SYS_futex_waitv, w, 1, 0, NULL, 0) != -1 || errno != EAGAIN) fail("futex_waitv", 0);
    /* a stream socket: one blocking sendmsg (send) of everything, one MSG_WAITALL recv (recvmsg) */
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, stream)) fail("socketpair", 0);
    stream_whole(1);
    stream_whole(0);
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
