/* Sets up an io_uring as liburing 2 does, with system calls of its own (no C library call
 * that `uswap run`'s library could see): io_uring_setup and the mmap of its rings through
 * the `syscall` instruction. Then lives SECONDS (default 2) with the rings mapped, and prints
 * "rings mapped". Nothing is submitted. */
#include <linux/io_uring.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "raw_syscall.h"


int main(int argc, char **argv) {
    int seconds = argc > 1 ? atoi(argv[1]) : 2;
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    long fd = raw_syscall6(SYS_io_uring_setup, 4, (long)&p, 0, 0, 0, 0);
    if (fd < 0) {
        printf("io_uring refused (%ld)\n", -fd);
        return 0;
    }
    size_t len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    long ring = raw_syscall6(SYS_mmap, 0, (long)len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
                             IORING_OFF_SQ_RING);
    if (ring < 0 && ring > -4096) {
        printf("mmap of the ring refused (%ld)\n", -ring);
        return 1;
    }
    sleep(seconds);
    printf("rings mapped\n");
    return 0;
}
