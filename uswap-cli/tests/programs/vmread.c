/* Reads memory across processes as MPI's single-copy transfers do. The parent and a forked
 * child each fill MIB MiB of heap with their own pattern. Then the parent reads its own
 * buffer with process_vm_readv on itself, and the child's with process_vm_readv on the child,
 * 1 MiB at a time into its own buffer (both far larger than the limit), checking every word;
 * then its own buffer again asking for all of it in each call (a large call on itself used to
 * fail with EFAULT, nothing moved). Prints "self: N MiB, B bad words", "self whole: ..." and "child: N MiB read, B bad words" (or where the
 * transfer came back short: "child: short at MiB M: D of 1048576 bytes, errno E").
 * Usage: vmread MIB */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHUNK (1u << 20)

static uint64_t pattern(uint64_t i, uint64_t who) { return (i + 11 + who * 0x9E3779B97F4A7C15ull) * 0xD6E8FEB86659FD93ull; }

/* Reads `mib` MiB at `remote` in `pid` into `into`, chunk by chunk; checks them against `who`. */
static void read_all(pid_t pid, const char *name, uint64_t *remote, uint64_t *into, size_t mib, uint64_t who) {
    long bad = 0;
    for (size_t m = 0; m < mib; m++) {
        struct iovec local = { into + m * (CHUNK / 8), CHUNK }, rem = { remote + m * (CHUNK / 8), CHUNK };
        ssize_t n = process_vm_readv(pid, &local, 1, &rem, 1, 0);
        if (n != CHUNK) {
            printf("%s: short at MiB %zu: %zd of %u bytes, errno %d\n", name, m, n, CHUNK, n < 0 ? errno : 0);
            return;
        }
        for (size_t i = m * (CHUNK / 8); i < (m + 1) * (CHUNK / 8); i++) bad += into[i] != pattern(i, who);
    }
    printf("%s: %zu MiB read, %ld bad words\n", name, mib, bad);
}

/* Reads all of its own `mib` MiB at `mine` into `into` asking for the whole rest in each call,
 * as a program that takes short counts does: each call must move something. */
static void read_whole_self(uint64_t *mine, uint64_t *into, size_t mib) {
    size_t done = 0, total = mib << 20;
    long bad = 0;
    while (done < total) {
        struct iovec local = { (char *)into + done, total - done }, rem = { (char *)mine + done, total - done };
        ssize_t n = process_vm_readv(getpid(), &local, 1, &rem, 1, 0);
        if (n <= 0) {
            printf("self whole: stuck at byte %zu: %zd, errno %d\n", done, n, n < 0 ? errno : 0);
            return;
        }
        done += n;
    }
    for (size_t i = 0; i < total / 8; i++) bad += into[i] != pattern(i, 1);
    printf("self whole: %zu MiB read, %ld bad words\n", mib, bad);
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 48, words = (mib << 20) / 8;
    int to_parent[2], to_child[2];
    if (pipe(to_parent) || pipe(to_child)) { perror("pipe"); return 1; }
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); return 1; }
    if (pid == 0) {
        close(to_parent[0]);
        close(to_child[1]);
        uint64_t *mine = malloc(mib << 20);
        if (!mine) { perror("malloc"); _exit(1); }
        for (size_t i = 0; i < words; i++) mine[i] = pattern(i, 2);
        if (write(to_parent[1], &mine, sizeof mine) != sizeof mine) _exit(1);
        char done;
        _exit(read(to_child[0], &done, 1) == 1 ? 0 : 1);
    }
    close(to_parent[1]); /* a child that dies early ends the parent's read, and the parent's exit the child's */
    close(to_child[0]);
    uint64_t *mine = malloc(mib << 20), *into = malloc(mib << 20), *theirs;
    if (!mine || !into) { perror("malloc"); return 1; }
    for (size_t i = 0; i < words; i++) mine[i] = pattern(i, 1);
    read_all(getpid(), "self", mine, into, mib, 1);
    read_whole_self(mine, into, mib);
    if (read(to_parent[0], &theirs, sizeof theirs) != sizeof theirs) { perror("read"); return 1; }
    read_all(pid, "child", theirs, into, mib, 2);
    fflush(stdout);
    int st;
    if (write(to_child[1], "x", 1) != 1 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) {
        fprintf(stderr, "child failed\n");
        return 4;
    }
    return 0;
}
