/* Installs SIGBUS handlers the ways that do not go through the C library's `sigaction`
 * symbol: `sigset`, `sysv_signal`, `bsd_signal`, `sigignore`, and `syscall(SYS_rt_sigaction)`
 * (the C library calls its own `sigaction` inside the first four). After each it reads
 * every word of MIB MiB of pseudo-random words (out of RAM under the limit), then, for a
 * handler, raises a real SIGBUS by reading past the end of a mapped file (FILE, truncated),
 * which its handler must get. Also checks what each call says the previous handler was.
 *
 * Usage: sigolder MIB FILE. Prints "OK" and exits 0 when every word held, each handler got
 * its SIGBUS and every previous handler read back as installed.
 *
 * What it found: each of these installed the program's handler in place of uswap's in
 * signal mode: the program's handler got uswap's faults (the first way exited 9 from it),
 * and `sigignore` or a raw `SIG_DFL` killed the program at its next fault (status 135). */
#define _GNU_SOURCE
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MiB (1UL << 20)

extern __sighandler_t sysv_signal(int, __sighandler_t);
extern __sighandler_t bsd_signal(int, __sighandler_t);
extern int sigignore(int);
extern __sighandler_t sigset(int, __sighandler_t);
extern __sighandler_t ssignal(int, __sighandler_t);
extern int __sigaction(int, const struct sigaction *, struct sigaction *);

static sigjmp_buf past_the_end;
static volatile int handled[8];
static volatile int way;

static void on_sigbus(int sig) {
    (void)sig;
    handled[way]++;
    siglongjmp(past_the_end, 1);
}

/* A second handler, so that each call's previous handler can be told apart. */
static void on_sigbus_too(int sig) { on_sigbus(sig); }

struct kernel_sigaction {
    void (*handler)(int);
    unsigned long flags;
    void (*restorer)(void);
    uint64_t mask;
};

static uint64_t *words;
static size_t nr_words;

static uint64_t word_at(size_t i) { return (i * 0x9E3779B97F4A7C15ULL) ^ (i >> 7) ^ 0x5DEECE66DULL; }

static int every_word_holds(void) {
    for (size_t i = 0; i < nr_words; i++)
        if (words[i] != word_at(i)) { fprintf(stderr, "word %zu wrong after way %d\n", i, way); return 0; }
    return 1;
}

static int real_sigbus_is_handled(volatile unsigned char *past) {
    int before = handled[way];
    if (!sigsetjmp(past_the_end, 1)) (void)past[0];
    if (handled[way] != before + 1) { fprintf(stderr, "way %d: the handler did not get the SIGBUS\n", way); return 0; }
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: sigolder MIB FILE\n"); return 2; }
    size_t bytes = strtoul(argv[1], 0, 10) * MiB;
    nr_words = bytes / sizeof *words;
    words = malloc(bytes);
    int fd = open(argv[2], O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (!words || fd < 0 || ftruncate(fd, 4096)) { perror("setup"); return 2; }
    volatile unsigned char *file = mmap(0, 8192, PROT_READ, MAP_SHARED, fd, 0);
    if (file == MAP_FAILED || ftruncate(fd, 0)) { perror("mmap"); return 2; }
    for (size_t i = 0; i < nr_words; i++) words[i] = word_at(i);
    int ok = 1;

    way = 0;
    ok &= sigset(SIGBUS, on_sigbus) != SIG_ERR;
    ok &= every_word_holds() && real_sigbus_is_handled(file);
    way = 1;
    ok &= sysv_signal(SIGBUS, on_sigbus_too) == on_sigbus;
    ok &= every_word_holds() && real_sigbus_is_handled(file);
    /* sysv_signal's handler is reset to the default when it runs. */
    way = 2;
    ok &= bsd_signal(SIGBUS, on_sigbus) == SIG_DFL;
    ok &= every_word_holds() && real_sigbus_is_handled(file);
    way = 3;
    /* x86-64 delivers only to a handler with a restorer: the C library's, read back from
     * another signal's action it installed. */
    struct sigaction usr = {0};
    usr.sa_handler = on_sigbus;
    struct kernel_sigaction libc_act = {0};
    ok &= sigaction(SIGUSR2, &usr, 0) == 0 && syscall(SYS_rt_sigaction, SIGUSR2, 0, &libc_act, 8) == 0;
    struct kernel_sigaction act = {on_sigbus_too, libc_act.flags, libc_act.restorer, 0}, old = {0};
    ok &= syscall(SYS_rt_sigaction, SIGBUS, &act, &old, 8) == 0 && old.handler == on_sigbus;
    ok &= every_word_holds() && real_sigbus_is_handled(file);
    way = 4;
    struct kernel_sigaction dfl = {SIG_DFL, libc_act.flags, libc_act.restorer, 0};
    ok &= syscall(SYS_rt_sigaction, SIGBUS, &dfl, 0, 8) == 0;
    ok &= every_word_holds();
    way = 5;
    /* The C library's other names for signal and sigaction. */
    ok &= ssignal(SIGBUS, on_sigbus) == SIG_DFL && every_word_holds() && real_sigbus_is_handled(file);
    struct sigaction act2 = {0}, old2 = {0};
    act2.sa_handler = on_sigbus_too;
    ok &= __sigaction(SIGBUS, &act2, &old2) == 0 && old2.sa_handler == on_sigbus;
    ok &= every_word_holds() && real_sigbus_is_handled(file);
    way = 6;
    ok &= sigignore(SIGBUS) == 0;
    ok &= every_word_holds();
    ok &= sigset(SIGBUS, SIG_DFL) == SIG_IGN;
    ok &= every_word_holds();
    if (!ok) { fprintf(stderr, "handled: %d %d %d %d\n", handled[0], handled[1], handled[2], handled[3]); return 1; }
    printf("OK\n");
    return 0;
}
