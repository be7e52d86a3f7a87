/* A fork child that unmaps its whole address space to die of SIGSEGV, as stress-ng's
 * vm-segv stressor does: it asks to be traced, stops itself (every thread of it stops,
 * uswap's too), and its parent resumes only the thread it traces. The child's munmap must
 * not wait for uswap's stopped threads: it dies of SIGSEGV, as without uswap. MIB of heap
 * written first, so that the parent has a pager and the child one of its own, and a page of
 * break of the program's own. Prints OK, or how the child ended; a child still there after
 * 20 s is killed and said to hang.
 * Usage: unmapall MIB */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

static pid_t child;

static void on_alarm(int sig) {
    (void)sig;
    kill(child, SIGKILL);
    static const char msg[] = "the child hangs in its munmap\n";
    write(1, msg, sizeof msg - 1);
    _exit(1);
}

static __attribute__((noinline)) void unmap_everything(size_t page) {
    /* The largest length the kernel takes first (it refuses those past the address space). */
    for (size_t len = (~(size_t)0 ^ (~(size_t)0 >> 1)); len > page; len >>= 1) munmap(NULL, len - page);
}

int main(int argc, char **argv) {
    size_t bytes = (size_t)atol(argc > 1 ? argv[1] : "32") << 20;
    char *heap = malloc(bytes);
    if (!heap) { perror("malloc"); return 1; }
    memset(heap, 7, bytes);
    /* A break of the program's own, which uswap unmaps around (stress-ng's brk stressor). */
    char *brk_page = sbrk(4096);
    if (brk_page == (void *)-1) { perror("sbrk"); return 1; }
    memset(brk_page, 9, 4096);
    child = fork();
    if (child < 0) { perror("fork"); return 1; }
    if (child == 0) {
        ptrace(PTRACE_TRACEME, 0, NULL, NULL);
        kill(getpid(), SIGSTOP);
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGSEGV);
        sigprocmask(SIG_BLOCK, &set, NULL);
        unmap_everything((size_t)sysconf(_SC_PAGESIZE));
        _exit(3);
    }
    signal(SIGALRM, on_alarm);
    alarm(20);
    /* The first stop is the child's SIGSTOP delivered to its traced thread: passed on, it
     * stops every thread of the child (a group stop; stress-ng's child gets there when one
     * of uswap's threads takes the signal). Then only the traced thread is resumed. */
    int status = 0;
    for (int stops = 0; stops < 16; stops++) {
        if (waitpid(child, &status, 0) != child) { perror("waitpid"); return 1; }
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) break;
        if (!WIFSTOPPED(status)) { printf("the child ended otherwise: status %#x\n", status); return 1; }
        int sig = WSTOPSIG(status);
        long pass = (sig == SIGSEGV || (sig == SIGSTOP && stops == 0)) ? sig : 0;
        ptrace(PTRACE_CONT, child, NULL, (void *)pass);
    }
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGSEGV) { printf("the child did not die of SIGSEGV\n"); return 1; }
    for (size_t i = 0; i < bytes; i += 4096)
        if (heap[i] != 7) { printf("the heap changed at %zu\n", i); return 1; }
    printf("OK\n");
    return 0;
}
