/* A program that ignores SIGBUS and is sent one (`kill`), as a process may be by another:
 * MIB MiB of pseudo-random words are filled, SIGBUS is set to SIG_IGN and sent to the
 * process itself, then every word is checked (under a small limit, most come back through
 * faults). Plain, the signal is dropped. Prints "OK" and exits 0 when every word held.
 *
 * What it found: in signal mode uswap's handler, given a SIGBUS it does not manage, set
 * the default action back for a program that ignores SIGBUS, and the next fault on
 * managed memory killed the program. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    size_t nr_words = ((size_t)(argc > 1 ? atoi(argv[1]) : 96) << 20) / 8;
    uint64_t *words = malloc(nr_words * 8);
    if (!words) return 2;
    uint64_t s = 1;
    for (size_t i = 0; i < nr_words; i++) words[i] = s = s * 6364136223846793005ull + 1442695040888963407ull;
    signal(SIGBUS, SIG_IGN);
    kill(getpid(), SIGBUS);
    raise(SIGBUS);
    long bad = 0;
    s = 1;
    for (size_t i = 0; i < nr_words; i++) bad += words[i] != (s = s * 6364136223846793005ull + 1442695040888963407ull);
    puts(bad ? "FAIL" : "OK");
    return bad ? 1 : 0;
}
