// A daemon-style program: closes (or replaces) every descriptor above 2 at start, as
// daemons and sandboxes do, then allocates MIB MiB with malloc and mmap, writes a pattern,
// reads it all back twice and prints a checksum. Usage: daemon MIB close_range|closefrom|
// close_loop|dup2|syscall
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

static void close_everything(const char *how) {
    if (!strcmp(how, "close_range")) {
        if (close_range(3, ~0U, 0)) { perror("close_range"); exit(1); }
    } else if (!strcmp(how, "closefrom")) {
        closefrom(3);
    } else if (!strcmp(how, "close_loop")) {
        struct rlimit r; getrlimit(RLIMIT_NOFILE, &r);
        for (int fd = 3; fd < (int)r.rlim_cur; fd++) close(fd);
    } else if (!strcmp(how, "dup2")) {
        int null = open("/dev/null", O_RDWR);
        for (int fd = 3; fd < 64; fd++) if (fd != null) dup2(null, fd);
        /* And onto whatever else is open above that, as a sandbox replacing what it
         * inherited would. */
        struct rlimit r; getrlimit(RLIMIT_NOFILE, &r);
        for (int fd = 64; fd < (int)r.rlim_cur; fd++) if (fcntl(fd, F_GETFD) >= 0) dup2(null, fd);
    } else if (!strcmp(how, "syscall")) {
        if (syscall(SYS_close_range, 3, ~0U, 0)) { perror("close_range"); exit(1); }
    } else { fprintf(stderr, "unknown mode %s\n", how); exit(2); }
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    size_t bytes = (size_t)atol(argv[1]) << 20;
    close_everything(argv[2]);
    size_t half = bytes / 2, words = half / 8;
    uint64_t *a = malloc(half);
    uint64_t *b = mmap(0, half, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (!a || b == MAP_FAILED) { perror("alloc"); return 1; }
    for (size_t i = 0; i < words; i++) { a[i] = i * 0x9e3779b97f4a7c15ull; b[i] = ~i; }
    uint64_t sum = 0;
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < words; i += 7) {
            if (a[i] != i * 0x9e3779b97f4a7c15ull || b[i] != ~i) { fprintf(stderr, "wrong word %zu\n", i); return 3; }
            sum += a[i] ^ b[i];
        }
    printf("checksum %016llx\n", (unsigned long long)sum);
    return 0;
}
