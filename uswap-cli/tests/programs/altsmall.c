/* Sets an alternate signal stack of MINSIGSTKSZ (2,048 bytes: under the kernel's own minimum
 * for a signal's frame on a machine with AVX, AT_MINSIGSTKSZ) on the main thread and on a
 * thread, each the top of a block whose lower 64 KiB hold a pattern, then reads every word of
 * MIB MiB of pseudo-random words (out of RAM under the limit). Prints "OK" and exits 0 when
 * every word held and nothing was written below either stack.
 *
 * What it found: in signal mode each fault is a signal taken on that stack, which its frame
 * overran: the program died of SIGSEGV (2,048 bytes), or spun for good re-entering the
 * handler (3,072). Usage: altsmall MIB */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GUARD_BYTES 65536
#define STACK_BYTES 2048

static uint64_t *words;
static size_t nr_words;

static uint64_t word_at(size_t i) { return (i * 0x9E3779B97F4A7C15ULL) ^ (i >> 5); }

/* Sets the stack and reads every word; returns 1 when all held and the pattern too. */
static int on_small_stack(void) {
    unsigned char *block = malloc(GUARD_BYTES + STACK_BYTES);
    if (!block) return 0;
    memset(block, 0xA5, GUARD_BYTES);
    stack_t ss = {.ss_sp = block + GUARD_BYTES, .ss_size = STACK_BYTES, .ss_flags = 0};
    if (sigaltstack(&ss, 0)) { perror("sigaltstack"); return 0; }
    for (size_t i = 0; i < nr_words; i++)
        if (words[i] != word_at(i)) { fprintf(stderr, "word %zu wrong\n", i); return 0; }
    for (size_t i = 0; i < GUARD_BYTES; i++)
        if (block[i] != 0xA5) { fprintf(stderr, "written below the stack, %zu bytes down\n", GUARD_BYTES - i); return 0; }
    return 1;
}

static void *thread_main(void *arg) {
    (void)arg;
    return (void *)(uintptr_t)on_small_stack();
}

int main(int argc, char **argv) {
    nr_words = (argc > 1 ? strtoul(argv[1], 0, 10) : 64) << 17;
    words = malloc(nr_words * sizeof *words);
    if (!words) { perror("malloc"); return 1; }
    for (size_t i = 0; i < nr_words; i++) words[i] = word_at(i);
    int ok = on_small_stack();
    pthread_t t;
    void *thread_ok = 0;
    if (pthread_create(&t, 0, thread_main, 0) || pthread_join(t, &thread_ok)) return 1;
    if (!ok || !thread_ok) return 1;
    printf("OK\n");
    return 0;
}
