/* Takes every descriptor its RLIMIT_NOFILE leaves (the limit lowered to what it holds plus
 * one, then that one opened, none closed at exec). Then either grows a 24 MiB heap buffer
 * past `--start-after` and checks every byte (a process whose pager cannot open what it
 * needs), or execs PROG. Usage: nofile [PROG ARGS...] */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int top = open("/dev/null", O_RDONLY);
    if (top < 0) { perror("open"); return 1; }
    struct rlimit r = {(rlim_t)top + 2, (rlim_t)top + 2};
    if (setrlimit(RLIMIT_NOFILE, &r)) { perror("setrlimit"); return 1; }
    if (open("/dev/null", O_RDONLY) < 0) { perror("open"); return 1; }
    if (argc > 1) {
        execv(argv[1], argv + 1);
        perror("execv");
        return 1;
    }
    size_t len = 24u << 20;
    unsigned char *buf = malloc(len);
    if (!buf) { perror("malloc"); return 1; }
    for (size_t i = 0; i < len; i++) buf[i] = (unsigned char)(i * 131 + (i >> 12));
    for (size_t i = 0; i < len; i++)
        if (buf[i] != (unsigned char)(i * 131 + (i >> 12))) { fprintf(stderr, "byte %zu wrong\n", i); return 3; }
    printf("every byte of %zu right with no descriptor left\n", len);
    free(buf);
    return 0;
}
