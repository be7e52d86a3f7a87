/* A SIGBUS handler installed with SA_RESETHAND runs once: the kernel puts the default
 * action back as it delivers the signal. MIB MiB of pseudo-random words are filled (under
 * a small limit most come back through faults), the handler is installed, SIGBUS is raised
 * (the handler counts it), the action is read back (it must be SIG_DFL), every word is
 * checked and "OK" printed, and SIGBUS is raised again: the process dies of it (status 135
 * from a shell), as without uswap.
 *
 * What it found: in signal mode uswap's chain kept calling the program's handler. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t handled;

static void on_sigbus(int sig) {
    (void)sig;
    handled++;
}

int main(int argc, char **argv) {
    size_t nr_words = ((size_t)(argc > 1 ? atoi(argv[1]) : 96) << 20) / 8;
    uint64_t *words = malloc(nr_words * 8);
    if (!words) return 2;
    uint64_t s = 1;
    for (size_t i = 0; i < nr_words; i++) words[i] = s = s * 6364136223846793005ull + 1442695040888963407ull;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigbus;
    sa.sa_flags = SA_RESETHAND;
    if (sigaction(SIGBUS, &sa, NULL) != 0) return 3;
    raise(SIGBUS);
    struct sigaction now;
    if (sigaction(SIGBUS, NULL, &now) != 0) return 4;
    if (handled != 1 || now.sa_handler != SIG_DFL) {
        printf("FAIL: handled %d times, action %s\n", (int)handled, now.sa_handler == SIG_DFL ? "default" : "kept");
        return 1;
    }
    long bad = 0;
    s = 1;
    for (size_t i = 0; i < nr_words; i++) bad += words[i] != (s = s * 6364136223846793005ull + 1442695040888963407ull);
    puts(bad ? "FAIL" : "OK");
    fflush(stdout);
    raise(SIGBUS);
    puts("FAIL: survived a second SIGBUS");
    return 1;
}
