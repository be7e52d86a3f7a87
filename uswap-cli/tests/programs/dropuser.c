/* A server that starts as root and drops to its own user before it allocates (mariadbd
 * with user=mysql, memcached -u): it sets its user and group to nobody, then fills and checks
 * MIB of memory. Linked with an asynchronous I/O library, `auto` gives it thread mode,
 * whose userfaultfd nobody may not open; the process then takes signal mode, said, and is
 * paged. Before, it ran wholly outside the budget and the run failed at its end.
 * Usage: dropuser MIB [SECONDS]. Prints its user and the words that read wrong, after
 * sleeping SECONDS (0) with its memory filled. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    size_t words = ((argc > 1 ? strtoul(argv[1], 0, 10) : 64) << 20) / 8, bad = 0;
    if (setgid(65534) != 0 || setuid(65534) != 0) {
        perror("setuid (run as root)");
        return 1;
    }
    uint64_t *p = malloc(words * 8);
    if (!p) return 1;
    for (size_t i = 0; i < words; i++) p[i] = i * 2654435761u + 1;
    for (size_t i = 0; i < words; i++) bad += p[i] != i * 2654435761u + 1;
    if (argc > 2) sleep((unsigned)atoi(argv[2]));
    printf("dropuser: uid %d, bad %zu\n", (int)getuid(), bad);
    return bad != 0;
}
