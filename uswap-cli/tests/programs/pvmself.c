/* Datagrams between two heap buffers, then a copy of one into the other with
 * process_vm_readv on the process itself (a careful memcpy), every byte checked.
 *   pvmself MIB [d][p]: buffers of MIB MiB each; d: the datagrams, p: the copy (both
 *   without the second argument). Prints "ok". */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define MIB (1024 * 1024UL)
#define DATAGRAM_BYTES 60000

static uint64_t word(size_t i) {
    uint64_t x = i * 0x9e3779b97f4a7c15ULL + 1;
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ULL;
    return x ^ (x >> 29);
}

/* A quarter of the buffer's bytes in datagrams from `from` to `to`, at spread offsets. */
static int datagrams(char *from, char *to, size_t bytes) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_DGRAM, 0, sv))
        return 2;
    int sz = 4 << 20;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
    setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
    for (size_t o = 0; o < bytes / 4; o += DATAGRAM_BYTES) {
        size_t at = ((o * 3) % (bytes - DATAGRAM_BYTES)) & ~7UL;
        if (send(sv[0], from + at, DATAGRAM_BYTES, 0) != DATAGRAM_BYTES ||
            recv(sv[1], to + at, DATAGRAM_BYTES, 0) != DATAGRAM_BYTES)
            return 3;
        if (memcmp(from + at, to + at, DATAGRAM_BYTES))
            return 4;
    }
    close(sv[0]);
    close(sv[1]);
    return 0;
}

static int copy_by_process_vm(char *from, char *to, size_t bytes) {
    for (size_t o = 0; o < bytes;) {
        struct iovec local = {to + o, bytes - o}, remote = {from + o, bytes - o};
        ssize_t n = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
        if (n <= 0)
            return 5;
        o += n;
    }
    return memcmp(from, to, bytes) ? 6 : 0;
}

int main(int argc, char **argv) {
    size_t bytes = (argc > 1 ? strtoul(argv[1], 0, 0) : 64) * MIB;
    int with_datagrams = argc < 3 || strchr(argv[2], 'd');
    int with_copy = argc < 3 || strchr(argv[2], 'p');
    char *b = malloc(bytes), *d = malloc(bytes);
    if (!b || !d)
        return 1;
    for (size_t i = 0; i < bytes / 8; i++)
        ((uint64_t *)b)[i] = word(i);
    memset(d, 0x5a, bytes);
    int rc = with_datagrams ? datagrams(b, d, bytes) : 0;
    if (rc)
        return rc;
    memset(d, 0x5a, bytes);
    rc = with_copy ? copy_by_process_vm(b, d, bytes) : 0;
    if (rc)
        return rc;
    puts("ok");
    return 0;
}
