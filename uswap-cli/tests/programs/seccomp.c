/* A sandboxed child, as OpenSSH's or a browser's: writes and checks a buffer of argv[1] MiB
 * (so that uswap pages it), then forks children that each read a byte of it, install a
 * seccomp filter allowing only write, close and exit_group (anything else kills), write
 * their verdict to a pipe and _exit(0); every other child uses seccomp(2) through syscall(), and
 * the last calls exit, not _exit. The parent checks the buffer again and every child's
 * status.
 * Prints "ok CHILDREN" or what was wrong, exit 1. */
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define NR_CHILDREN 8
#define ALLOW(n) BPF_JUMP(BPF_JMP + BPF_JEQ + BPF_K, __NR_##n, 0, 1), BPF_STMT(BPF_RET + BPF_K, SECCOMP_RET_ALLOW)

static unsigned char value(size_t i) { return (unsigned char)(i * 2654435761u >> 13); }

static int filter(int how) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD + BPF_W + BPF_ABS, offsetof(struct seccomp_data, nr)),
        ALLOW(write), ALLOW(close), ALLOW(exit_group), ALLOW(exit),
        BPF_STMT(BPF_RET + BPF_K, SECCOMP_RET_KILL_PROCESS),
    };
    struct sock_fprog prog = {sizeof f / sizeof f[0], f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) return -1;
    if (how == 0) return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
    return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog);
}

int main(int argc, char **argv) {
    size_t len = (size_t)(argc > 1 ? atol(argv[1]) : 64) << 20;
    unsigned char *buf = malloc(len);
    if (!buf) { printf("malloc failed\n"); return 1; }
    for (size_t i = 0; i < len; i++) buf[i] = value(i);
    int fds[2];
    if (pipe(fds)) { printf("pipe failed\n"); return 1; }
    for (int k = 0; k < NR_CHILDREN; k++) {
        pid_t pid = fork();
        if (pid < 0) { printf("fork failed\n"); return 1; }
        if (pid == 0) {
            close(fds[0]);
            /* Read before the filter: in signal mode a page that is out comes back through
             * calls of uswap's that such a filter forbids (docs/cli.md). */
            char c = buf[k << 20] == value((size_t)k << 20) ? 'y' : 'n';
            if (filter(k % 2)) _exit(3);
            if (write(fds[1], &c, 1) != 1) _exit(4);
            close(fds[1]);
            if (k == NR_CHILDREN - 1) exit(0);
            _exit(0);
        }
    }
    close(fds[1]);
    int good = 0;
    for (int k = 0; k < NR_CHILDREN; k++) {
        int status;
        pid_t pid = wait(&status);
        if (pid < 0) { printf("wait failed\n"); return 1; }
        if (!WIFEXITED(status) || WEXITSTATUS(status)) {
            printf("child %d: status %#x%s\n", (int)pid, status,
                   WIFSIGNALED(status) && WTERMSIG(status) == SIGSYS ? " (SIGSYS)" : "");
            return 1;
        }
    }
    char verdicts[NR_CHILDREN];
    if (read(fds[0], verdicts, NR_CHILDREN) != NR_CHILDREN) { printf("short verdicts\n"); return 1; }
    for (int k = 0; k < NR_CHILDREN; k++) good += verdicts[k] == 'y';
    for (size_t i = 0; i < len; i++)
        if (buf[i] != value(i)) { printf("byte %zu differs\n", i); return 1; }
    printf("ok %d\n", good);
    return 0;
}
