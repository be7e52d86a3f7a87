/* Execs from a signal handler while the program maps and unmaps memory (a SIGALRM every
 * 3 ms interrupts an mmap/munmap loop and its handler execs the program again, N times),
 * then execs from handlers on small alternate stacks (8 KiB: execv, then execvp) and from
 * a thread with a 16 KiB stack (execvp). Prints "OK" when every exec ran.
 *
 * What it found: the exec path wrote the process's record (a lock the interrupted mmap
 * held, allocations), and hung; judging the new image took more stack than an 8 KiB
 * alternate stack had (SIGSEGV). */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

static char **gargv;
static char next[16];
static int use_execvp;

static void reexec(int sig) {
    (void)sig;
    char *a[] = {gargv[0], next, NULL};
    execv("/proc/self/exe", a);
    _exit(97);
}

static void run_true(int sig) {
    (void)sig;
    char *a[] = {"true", NULL};
    if (use_execvp)
        execvp("true", a);
    else
        execv("/bin/true", a);
    _exit(99);
}

static void *thread_exec(void *arg) {
    (void)arg;
    char *a[] = {"true", NULL};
    execvp("true", a);
    _exit(99);
}

/* Runs `what` in a fork child; whether it exited 0. */
static int child_ok(void (*what)(void)) {
    pid_t pid = fork();
    if (pid == 0) { what(); _exit(98); }
    int st;
    return waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static void on_alt_stack(void) {
    size_t sz = 8192;
    char *m = mmap(NULL, sz + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    mprotect(m, 4096, PROT_NONE);
    stack_t ss = {.ss_sp = m + 4096, .ss_size = sz, .ss_flags = 0};
    if (sigaltstack(&ss, NULL)) _exit(96);
    struct sigaction sa = {.sa_handler = run_true, .sa_flags = SA_ONSTACK};
    sigaction(SIGUSR1, &sa, NULL);
    raise(SIGUSR1);
}

static void on_small_thread(void) {
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, 16384);
    pthread_t t;
    pthread_create(&t, &at, thread_exec, NULL);
    pthread_join(t, NULL);
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 20;
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_UNBLOCK, &all, NULL);
    if (n > 0) {
        gargv = argv;
        snprintf(next, sizeof next, "%d", n - 1);
        struct sigaction sa = {.sa_handler = reexec};
        sigaction(SIGALRM, &sa, NULL);
        struct itimerval it = {{0, 0}, {0, 3000}};
        setitimer(ITIMER_REAL, &it, NULL);
        for (;;) {
            char *p = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            p[0] = 1;
            munmap(p, 1 << 20);
        }
    }
    int ok = child_ok(on_alt_stack);
    use_execvp = 1;
    ok &= child_ok(on_alt_stack);
    ok &= child_ok(on_small_thread);
    puts(ok ? "OK" : "FAIL: an exec on a small stack did not run");
    return ok ? 0 : 1;
}
