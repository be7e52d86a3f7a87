// A thread maps 2 MiB, writes it, and unmaps it in two halves, over and over, while the main
// thread forks children that check a 4 MiB buffer and exit. A fork can come between the
// kernel's unmap of a half and the engine's reading of its UNMAP event: the child inherits a
// region with a hole. Usage: forkunmap FORKS. Prints "forks N bad B" (children that read
// other bytes or failed); exits 1 if any did.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB (1 << 20)

static atomic_int stop;

static void *mapper(void *arg) {
    (void)arg;
    while (!atomic_load(&stop)) {
        char *m = mmap(NULL, 2 * MIB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) {
            perror("mmap");
            exit(2);
        }
        memset(m, 3, 2 * MIB);
        munmap(m, MIB);
        munmap(m + MIB, MIB);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int forks = argc > 1 ? atoi(argv[1]) : 200;
    unsigned char *buf = mmap(NULL, 4 * MIB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) {
        perror("mmap");
        return 2;
    }
    for (size_t i = 0; i < 4 * MIB; i++)
        buf[i] = (unsigned char)(i * 2654435761u >> 13);
    pthread_t t;
    pthread_create(&t, NULL, mapper, NULL);
    int bad = 0;
    for (int f = 0; f < forks; f++) {
        pid_t c = fork();
        if (c < 0) {
            perror("fork");
            return 2;
        }
        if (c == 0) {
            for (size_t i = 0; i < 4 * MIB; i++)
                if (buf[i] != (unsigned char)(i * 2654435761u >> 13))
                    _exit(1);
            _exit(0);
        }
        int st;
        if (waitpid(c, &st, 0) != c || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            bad++;
    }
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    printf("forks %d bad %d\n", forks, bad);
    return bad != 0;
}
