/* Memory a program locks stays resident (mlock(2): "guaranteed to stay in RAM"), whatever
 * else it touches: a key buffer locked with mlock, one with mlock2(MLOCK_ONFAULT) and a
 * third locked then unlocked; then MIB of heap written and read twice. Prints whether the
 * locked buffers were resident throughout (mincore after each pass) and every checksum.
 * A fork child, which inherits no lock, checks its copy of the data.
 * Usage: mlock MIB */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define KEY_BYTES (512 << 10)

static int resident(const char *p, size_t len) {
    unsigned char vec[KEY_BYTES / 4096];
    if (mincore((void *)p, len, vec)) { perror("mincore"); exit(4); }
    for (size_t i = 0; i < len / 4096; i++)
        if (!(vec[i] & 1)) return 0;
    return 1;
}

static uint64_t sum(const uint8_t *p, size_t len) {
    uint64_t s = 0;
    for (size_t i = 0; i < len; i++) s = s * 31 + p[i];
    return s;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 64;
    uint8_t *key = aligned_alloc(4096, KEY_BYTES), *lazy = aligned_alloc(4096, KEY_BYTES);
    uint8_t *undone = aligned_alloc(4096, KEY_BYTES);
    for (size_t i = 0; i < KEY_BYTES; i++) key[i] = (uint8_t)(i * 7 + 1), undone[i] = (uint8_t)i;
    printf("mlock %d\n", mlock(key, KEY_BYTES));
    printf("mlock2 onfault %d\n", mlock2(lazy, KEY_BYTES, MLOCK_ONFAULT));
    for (size_t i = 0; i < KEY_BYTES; i++) lazy[i] = (uint8_t)(i * 13 + 5);
    printf("mlock then munlock %d %d\n", mlock(undone, KEY_BYTES), munlock(undone, KEY_BYTES));
    size_t words = (mib << 20) / 8;
    uint64_t *a = malloc(words * 8), s = 0, first = 0;
    for (size_t i = 0; i < words; i++) a[i] = i * 0x9E3779B97F4A7C15ull;
    int held = resident((char *)key, KEY_BYTES) && resident((char *)lazy, KEY_BYTES);
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < words; i++) s += a[i] >> 8;
        if (pass == 0) first = s;
        held &= resident((char *)key, KEY_BYTES) && resident((char *)lazy, KEY_BYTES);
    }
    printf("locked buffers resident throughout: %s\n", held ? "yes" : "no");
    printf("sums %llu %llu %llu %llu\n", (unsigned long long)s, (unsigned long long)sum(key, KEY_BYTES),
           (unsigned long long)sum(lazy, KEY_BYTES), (unsigned long long)sum(undone, KEY_BYTES));
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        uint64_t t = 0;
        for (size_t i = 0; i < words; i++) t += a[i] >> 8;
        printf("child %s\n", t == first && sum(key, KEY_BYTES) ? "same" : "differs");
        fflush(stdout);
        _exit(0);
    }
    int st = 0;
    waitpid(child, &st, 0);
    printf("munlockall %d\n", munlockall());
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 5;
}
