/* Fills MiB of memory with incompressible words (splitmix64 of each word's index), says
 * where on stdout, and dies with a core dump: `abort` (SIGABRT), `segv` (a store to
 * address 0), or `handler` (a SIGSEGV handler of its own that puts the default action back
 * and returns, as Python's faulthandler and Rust's runtime do). Before dying it says whether
 * the action of the signal it dies of reads as the default (`default`), as a program sees it. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void on_segv(int sig) {
    /* Says nothing (not async-signal-safe); the default action, then the fault again. */
    signal(sig, SIG_DFL);
}

static void say_action(int sig) {
    struct sigaction old;
    if (sigaction(sig, NULL, &old) != 0) {
        perror("sigaction");
        exit(1);
    }
    printf("%s\n", old.sa_handler == SIG_DFL ? "default" : "not default");
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: coredump MiB abort|segv|handler\n");
        return 2;
    }
    size_t nr_words = (size_t)atol(argv[1]) << 17;
    uint64_t *buf = malloc(nr_words * 8);
    if (!buf) {
        perror("malloc");
        return 1;
    }
    for (size_t i = 0; i < nr_words; i++)
        buf[i] = splitmix64(i);
    printf("buf=%p words=%zu\n", (void *)buf, nr_words);
    const char *how = argv[2];
    if (strcmp(how, "handler") == 0) {
        struct sigaction sa, old;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_segv;
        if (sigaction(SIGSEGV, &sa, &old) != 0) {
            perror("sigaction");
            return 1;
        }
        printf("%s\n", old.sa_handler == SIG_DFL ? "default" : "not default");
    } else {
        say_action(strcmp(how, "abort") == 0 ? SIGABRT : SIGSEGV);
    }
    fflush(stdout);
    if (strcmp(how, "abort") == 0)
        abort();
    *(volatile int *)0 = 1;
    return 0;
}
