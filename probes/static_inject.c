// Can a supervisor page a program that never loads uswap's library (a static binary: Go,
// musl builds) without its cooperation? This probe does the steps with ptrace and
// userfaultfd and times them:
//   1. the child (standing in for a static program) maps a region and stops;
//   2. the supervisor injects userfaultfd(2) into it at a syscall stop (PTRACE_SYSCALL,
//      the registers rewritten, the original call replayed after) and takes the new
//      descriptor with pidfd_getfd(2): the context's mm is the child's;
//   3. it registers the child's region, serves the child's faults from its own memory
//      (UFFDIO_COPY copies from the caller's address space into the context's mm), and
//   4. moves a page out of the child's region into a staging area inside the child
//      (UFFDIO_MOVE works within the context's mm) and reads it with process_vm_readv.
// Build: gcc -O2 -pthread static_inject.c -o static_inject; run as root (or with
// CAP_SYS_PTRACE over the child). Prints the cost of each step.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

// Debian 12's headers predate UFFDIO_MOVE (Linux 6.8): its ABI, from the kernel's uapi.
#ifndef UFFD_FEATURE_MOVE
#define UFFD_FEATURE_MOVE (1 << 16)
struct uffdio_move { uint64_t dst, src, len, mode; int64_t move; };
#define UFFDIO_MOVE _IOWR(UFFDIO, 0x05, struct uffdio_move)
#endif

#define NPAGES 4096
#define PAGE 4096UL
#define DIE(...) do { fprintf(stderr, __VA_ARGS__); fprintf(stderr, ": %s\n", strerror(errno)); exit(1); } while (0)

static double now_us(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }

static int pipe_ready[2], pipe_go[2];

static void child(void) {
    char *region = mmap(0, NPAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *staging = mmap(0, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uintptr_t addrs[2] = {(uintptr_t)region, (uintptr_t)staging};
    write(pipe_ready[1], addrs, sizeof addrs);
    char c;
    // Blocks in read(2): the supervisor injects at this syscall's stop.
    read(pipe_go[0], &c, 1);
    // Touch every page: each one faults to the supervisor.
    double t0 = now_us();
    uint64_t sum = 0;
    for (size_t i = 0; i < NPAGES; i++) sum += region[i * PAGE];
    double t1 = now_us();
    printf("child: %d faults served by the supervisor, %.2f us each (sum %llu)\n", NPAGES, (t1 - t0) / NPAGES,
           (unsigned long long)sum);
    fflush(stdout);
    read(pipe_go[0], &c, 1);
    _exit(region[0] == 7 ? 0 : 3);
}

static int uffd;
static volatile int served;
static void *serve(void *arg) {
    (void)arg;
    static char page[PAGE] __attribute__((aligned(4096)));
    memset(page, 7, sizeof page);
    while (served < NPAGES) {
        struct pollfd p = {uffd, POLLIN, 0};
        poll(&p, 1, 1000);
        struct uffd_msg m;
        if (read(uffd, &m, sizeof m) != sizeof m || m.event != UFFD_EVENT_PAGEFAULT) continue;
        struct uffdio_copy c = {.dst = m.arg.pagefault.address & ~(PAGE - 1), .src = (uintptr_t)page, .len = PAGE};
        if (ioctl(uffd, UFFDIO_COPY, &c)) DIE("UFFDIO_COPY into the child");
        served++;
    }
    return 0;
}

int main(void) {
    if (pipe(pipe_ready) || pipe(pipe_go)) DIE("pipe");
    pid_t pid = fork();
    if (pid == 0) { ptrace(PTRACE_TRACEME, 0, 0, 0); raise(SIGSTOP); child(); }
    int st;
    waitpid(pid, &st, 0);
    uintptr_t addrs[2];
    // Let the child map its memory and block in read(2) at a syscall stop.
    if (ptrace(PTRACE_SETOPTIONS, pid, 0, PTRACE_O_TRACESYSGOOD)) DIE("PTRACE_SETOPTIONS");
    if (ptrace(PTRACE_CONT, pid, 0, 0)) DIE("PTRACE_CONT");
    if (read(pipe_ready[0], addrs, sizeof addrs) != sizeof addrs) DIE("read addresses");
    kill(pid, SIGSTOP);
    waitpid(pid, &st, 0);
    // 2. Inject userfaultfd(O_CLOEXEC | O_NONBLOCK) at the next syscall entry.
    double t0 = now_us();
    struct user_regs_struct saved, regs;
    ptrace(PTRACE_SYSCALL, pid, 0, 0);
    waitpid(pid, &st, 0); // syscall-entry stop (the interrupted read restarts)
    ptrace(PTRACE_GETREGS, pid, 0, &saved);
    regs = saved;
    regs.orig_rax = SYS_userfaultfd;
    regs.rdi = O_CLOEXEC | O_NONBLOCK;
    ptrace(PTRACE_SETREGS, pid, 0, &regs);
    ptrace(PTRACE_SYSCALL, pid, 0, 0);
    waitpid(pid, &st, 0); // syscall-exit stop
    ptrace(PTRACE_GETREGS, pid, 0, &regs);
    long child_fd = (long)regs.rax;
    if (child_fd < 0) { errno = -child_fd; DIE("userfaultfd injected into the child"); }
    // Replay the original call: back to its syscall instruction, registers restored.
    saved.rip -= 2;
    saved.rax = saved.orig_rax;
    ptrace(PTRACE_SETREGS, pid, 0, &saved);
    int pidfd = syscall(SYS_pidfd_open, pid, 0);
    uffd = syscall(SYS_pidfd_getfd, pidfd, (int)child_fd, 0);
    if (uffd < 0) DIE("pidfd_getfd");
    double t1 = now_us();
    struct uffdio_api api = {.api = UFFD_API, .features = UFFD_FEATURE_MOVE};
    if (ioctl(uffd, UFFDIO_API, &api)) DIE("UFFDIO_API on the child's userfaultfd");
    // 3. Register the child's region and staging page (same descriptor: moves need it).
    struct uffdio_register r = {.range = {addrs[0], NPAGES * PAGE}, .mode = UFFDIO_REGISTER_MODE_MISSING};
    if (ioctl(uffd, UFFDIO_REGISTER, &r)) DIE("register the child's region");
    struct uffdio_register rs = {.range = {addrs[1], PAGE}, .mode = UFFDIO_REGISTER_MODE_MISSING};
    if (ioctl(uffd, UFFDIO_REGISTER, &rs)) DIE("register the child's staging page");
    printf("supervisor: userfaultfd injected and taken in %.0f us (fd %ld in the child)\n", t1 - t0, child_fd);
    ptrace(PTRACE_DETACH, pid, 0, 0);
    pthread_t th;
    pthread_create(&th, 0, serve, 0);
    write(pipe_go[1], "g", 1);
    pthread_join(th, 0);
    // 4. Take a page out of the child: by a move within its mm, or by dropping it from
    //    here after reading it. Each is tried and its answer printed.
    usleep(100000);
    struct uffdio_move mv = {.dst = addrs[1], .src = addrs[0] + 5 * PAGE, .len = PAGE};
    int moved = ioctl(uffd, UFFDIO_MOVE, &mv);
    printf("supervisor: UFFDIO_MOVE within the child's mm from here: %s\n", moved ? strerror(errno) : "moved");
    char buf[PAGE];
    struct iovec local = {buf, PAGE}, remote = {(void *)(addrs[0] + 6 * PAGE), PAGE};
    double t2 = now_us();
    ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    double t3 = now_us();
    printf("supervisor: process_vm_readv of one page: %zd bytes in %.1f us, byte %d\n", n, t3 - t2, buf[0]);
    struct iovec drop = {(void *)(addrs[0] + 6 * PAGE), PAGE};
    long d = syscall(SYS_process_madvise, pidfd, &drop, 1, MADV_DONTNEED, 0);
    printf("supervisor: process_madvise(MADV_DONTNEED) on the child: %s\n", d < 0 ? strerror(errno) : "dropped");
    long po = syscall(SYS_process_madvise, pidfd, &drop, 1, MADV_PAGEOUT, 0);
    printf("supervisor: process_madvise(MADV_PAGEOUT) on the child: %s (to the kernel's swap, not ours)\n",
           po < 0 ? strerror(errno) : "accepted");
    write(pipe_go[1], "g", 1);
    waitpid(pid, &st, 0);
    printf("child exit status %d\n", WEXITSTATUS(st));
    (void)t0;
    return 0;
}
