/* A process of the tree that changes user, as `su`, `runuser` and servers that drop their
 * privileges do: run as root, it writes and checks MIB MiB as user UID, either in a fork
 * child that calls setuid (no exec) or in the image it execs after setuid.
 * Usage: chuser UID MIB fork|exec */
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int become(uid_t uid) {
    if (setgroups(0, NULL) || setgid(uid) || setuid(uid)) { perror("setuid"); return 1; }
    return 0;
}

static int pass(size_t mib) {
    size_t len = mib << 20;
    unsigned char *buf = malloc(len);
    if (!buf) { perror("malloc"); return 1; }
    unsigned x = 2463534242u;
    for (size_t i = 0; i < len; i++) { x ^= x << 13; x ^= x >> 17; x ^= x << 5; buf[i] = (unsigned char)x; }
    x = 2463534242u;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13; x ^= x >> 17; x ^= x << 5;
        if (buf[i] != (unsigned char)x) { fprintf(stderr, "byte %zu wrong\n", i); return 3; }
    }
    free(buf);
    return getuid() == geteuid() ? 0 : 4;
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: chuser UID MIB fork|exec\n"); return 2; }
    uid_t uid = (uid_t)strtoul(argv[1], 0, 10);
    size_t mib = strtoul(argv[2], 0, 10);
    if (!strcmp(argv[3], "work")) {
        int r = pass(mib);
        if (!r) printf("ok as uid %u\n", (unsigned)getuid());
        return r;
    }
    if (!strcmp(argv[3], "exec")) {
        if (become(uid)) return 1;
        char *next[] = {argv[0], argv[1], argv[2], "work", NULL};
        execv(argv[0], next);
        perror("execv");
        return 5;
    }
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); return 1; }
    if (pid == 0) {
        if (become(uid)) _exit(1);
        int r = pass(mib);
        if (!r) printf("ok as uid %u\n", (unsigned)getuid());
        fflush(stdout);
        _exit(r);
    }
    int status;
    if (waitpid(pid, &status, 0) != pid) { perror("waitpid"); return 1; }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
