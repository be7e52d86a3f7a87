// A debugger's view of a program: runs PROG ARGS... as a traced child (PTRACE_TRACEME, as
// gdb's `run` does), lets every signal through as a debugger continuing would, and counts
// the stops each signal made. Prints "sigbus_stops N" on stderr and exits as the child did.
// Usage: tracer PROG [ARGS...]
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    pid_t child = fork();
    if (child < 0) { perror("fork"); return 3; }
    if (child == 0) {
        if (ptrace(PTRACE_TRACEME, 0, 0, 0) != 0) { perror("PTRACE_TRACEME"); _exit(3); }
        execvp(argv[1], argv + 1);
        perror("execvp");
        _exit(3);
    }
    long sigbus_stops = 0;
    // Bounded by the child: every round is one of its stops, and it ends.
    for (;;) {
        int status;
        if (waitpid(child, &status, 0) != child) { perror("waitpid"); return 3; }
        if (WIFEXITED(status) || WIFSIGNALED(status)) {
            fprintf(stderr, "sigbus_stops %ld\n", sigbus_stops);
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
        int sig = WSTOPSIG(status);
        sigbus_stops += sig == SIGBUS;
        // The exec's SIGTRAP is the tracer's own; anything else goes on to the child.
        if (ptrace(PTRACE_CONT, child, 0, (void *)(long)(sig == SIGTRAP ? 0 : sig)) != 0) { perror("PTRACE_CONT"); return 3; }
    }
}
