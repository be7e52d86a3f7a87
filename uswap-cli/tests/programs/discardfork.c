/* Memory the program discards with MADV_DONTNEED reads zero in a fork child made right
 * after: MIB of pages that do not compress to nothing are written (most go out), discarded
 * whole, and the process forks at once; the child counts the pages that do not read zero.
 * Eight rounds. Usage: discardfork MIB */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define ROUNDS 8

int main(int argc, char **argv) {
    size_t len = (size_t)(argc > 1 ? strtoul(argv[1], NULL, 10) : 64) << 20;
    int bad = 0;
    for (int r = 0; r < ROUNDS; r++) {
        uint8_t *x = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (x == MAP_FAILED) { perror("mmap"); return 2; }
        for (size_t o = 0; o < len; o += 8) *(uint64_t *)(x + o) = ((o + r) * 0x9E3779B97F4A7C15ull) >> 7 | 1;
        usleep(100000); /* reclaim settles: nothing is being written out at the fork */
        if (madvise(x, len, MADV_DONTNEED)) { perror("madvise"); return 2; }
        pid_t pid = fork();
        if (pid < 0) { perror("fork"); return 2; }
        if (pid == 0) {
            size_t n = 0;
            for (size_t o = 0; o < len; o += 8) n += *(uint64_t *)(x + o) != 0;
            if (n) printf("round %d: child: %zu words of %zu not zero\n", r, n, len / 8);
            fflush(stdout);
            _exit(n != 0);
        }
        int st = 0;
        if (waitpid(pid, &st, 0) != pid) { perror("waitpid"); return 2; }
        bad += !WIFEXITED(st) || WEXITSTATUS(st) != 0;
        if (munmap(x, len)) { perror("munmap"); return 2; }
    }
    printf("%d of %d rounds: discarded memory not zero in the child\n", bad, ROUNDS);
    return bad != 0;
}
