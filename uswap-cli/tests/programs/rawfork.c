/* Forks that the C library's fork() does not make, so that no fork handler runs:
 * syscall(SYS_fork), syscall(SYS_clone, SIGCHLD), syscall(SYS_clone3), clone() with a
 * stack of its own, an argument and no CLONE_VM, and _Fork(); and fork() beside them. The
 * process first writes a buffer of argv[1] MiB (over the limit, so that most of it is out,
 * or small, so that no pager starts); each child checks every byte of its copy, writes a
 * block of its own from malloc, advises part of it (MADV_DONTFORK) and reads it back, and
 * exits 0 if all was as written. The children read zeros where pages were out before, and
 * went on.
 * Prints "rawfork: fork same, SYS_fork same, SYS_clone same, SYS_clone3 same, clone same,
 * _Fork same, parent same" and exits 0. */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

pid_t _Fork(void);

static unsigned char *buf;
static size_t buf_bytes;

static int all_as_written(void) {
    for (size_t i = 0; i < buf_bytes; i++)
        if (buf[i] != (unsigned char)(i * 7 + i / 4096)) return 0;
    return 1;
}

/* What each child does: its copy checked, a block of its own written and read back. */
static int child_work(void) {
    if (!all_as_written()) return 3;
    size_t own = 8 << 20;
    unsigned char *p = malloc(own);
    if (!p) return 4;
    for (size_t i = 0; i < own; i++) p[i] = (unsigned char)(i * 13);
    if (madvise(p + 4096 - ((size_t)p % 4096), 1 << 20, MADV_DONTFORK) != 0) return 6;
    for (size_t i = 0; i < own; i++)
        if (p[i] != (unsigned char)(i * 13)) return 5;
    return 0;
}

static int clone_arg = 0x5eed;

static int clone_child(void *arg) {
    if (arg != &clone_arg || *(int *)arg != 0x5eed) return 7;
    return child_work();
}

static const char *waited(pid_t pid) {
    int status;
    if (pid < 0) return "NOT MADE";
    if (waitpid(pid, &status, 0) != pid) return "NOT WAITED";
    if (!WIFEXITED(status)) return "DIED";
    return WEXITSTATUS(status) == 0 ? "same" : "DIFFERENT";
}

int main(int argc, char **argv) {
    buf_bytes = (size_t)(argc > 1 ? atol(argv[1]) : 64) << 20;
    buf = malloc(buf_bytes);
    for (size_t i = 0; i < buf_bytes; i++) buf[i] = (unsigned char)(i * 7 + i / 4096);
    const char *how[6];
    pid_t pid = fork();
    if (pid == 0) _exit(child_work());
    how[0] = waited(pid);
    pid = (pid_t)syscall(SYS_fork);
    if (pid == 0) _exit(child_work());
    how[1] = waited(pid);
    pid = (pid_t)syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
    if (pid == 0) _exit(child_work());
    how[2] = waited(pid);
    /* struct clone_args: flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls */
    unsigned long long args[8] = {0, 0, 0, 0, SIGCHLD, 0, 0, 0};
    pid = (pid_t)syscall(SYS_clone3, args, sizeof args);
    if (pid == 0) _exit(child_work());
    how[3] = waited(pid);
    size_t stack_bytes = 1 << 20;
    char *stack = malloc(stack_bytes);
    how[4] = waited(clone(clone_child, stack + stack_bytes, SIGCHLD, &clone_arg));
    pid = _Fork();
    if (pid == 0) _exit(child_work());
    how[5] = waited(pid);
    const char *parent = all_as_written() ? "same" : "DIFFERENT";
    printf("rawfork: fork %s, SYS_fork %s, SYS_clone %s, SYS_clone3 %s, clone %s, _Fork %s, parent %s\n", how[0],
           how[1], how[2], how[3], how[4], how[5], parent);
    for (int i = 0; i < 6; i++)
        if (strcmp(how[i], "same") != 0) return 1;
    return strcmp(parent, "same") != 0;
}
