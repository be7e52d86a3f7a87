// Starts the program argv[1] three ways that leave uswap's budget when it is a static
// program: posix_spawn, posix_spawnp (by name, from PATH), and fork + execve; then execs
// a path that does not exist (a failed exec: no process leaves). Waits for every child;
// exits 0 if each exited 0.
#define _GNU_SOURCE
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static int wait_ok(pid_t pid) {
    int st;
    if (waitpid(pid, &st, 0) != pid) return 0;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: escapes PATH NAME-ON-PATH\n");
        return 2;
    }
    char *args[] = {argv[1], NULL};
    pid_t pid;
    int ok = 1;
    if (posix_spawn(&pid, argv[1], NULL, NULL, args, environ) != 0) return 3;
    ok &= wait_ok(pid);
    char *named[] = {argv[2], NULL};
    if (posix_spawnp(&pid, argv[2], NULL, NULL, named, environ) != 0) return 4;
    ok &= wait_ok(pid);
    pid = fork();
    if (pid == 0) {
        char *missing[] = {"/nonexistent/program", NULL};
        execve(missing[0], missing, environ);
        execve(argv[1], args, environ);
        _exit(5);
    }
    ok &= wait_ok(pid);
    return ok ? 0 : 1;
}
