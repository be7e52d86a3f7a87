/* A signal handler that allocates past --start-after while the main thread waits in
 * read(2), which the signal interrupts (no SA_RESTART: it returns EINTR into the C
 * library's code right after its `syscall` instruction). A pager that rewrote the C
 * library's code in the handler sent that return into rewritten bytes (SIGILL). The
 * child sends the signal once the parent sleeps (in its read), then the byte it reads.
 * The handler fills MIB MiB; main then allocates more, checks every byte the handler
 * wrote and prints a checksum. Usage: handlerstart MIB */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include <errno.h>
#include <string.h>

static unsigned char *big;
static size_t big_len;

static void on_alarm(int sig) {
    (void)sig;
    /* Not async-signal-safe, as in many real programs. */
    big = malloc(big_len);
    if (!big) _exit(4);
    for (size_t i = 0; i < big_len; i++) big[i] = (unsigned char)(i * 7 + (i >> 12));
}

/* Whether process `pid` sleeps (state S in its stat). */
static int sleeping(pid_t pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *close = strrchr(buf, ')');
    return close && close[1] == ' ' && close[2] == 'S';
}

int main(int argc, char **argv) {
    big_len = (argc > 1 ? strtoul(argv[1], 0, 10) : 48) << 20;
    int fds[2];
    if (pipe(fds)) { perror("pipe"); return 1; }
    struct sigaction sa = {0};
    sa.sa_handler = on_alarm;
    sa.sa_flags = 0;
    sigaction(SIGALRM, &sa, 0);
    pid_t parent = getpid();
    pid_t child = fork();
    if (child == 0) {
        /* Up to 10 s for the parent to sleep: in its read, the only place it can. */
        for (int i = 0; i < 10000 && !sleeping(parent); i++) usleep(1000);
        if (kill(parent, SIGALRM)) _exit(1);
        sleep(1); /* the reader has run the handler and waits again by now */
        if (write(fds[1], "x", 1) != 1) _exit(1);
        _exit(0);
    }
    char c;
    ssize_t r; while ((r = read(fds[0], &c, 1)) != 1) if (r >= 0 || errno != EINTR) { perror("read"); return 1; }
    waitpid(child, 0, 0);
    if (!big) { fprintf(stderr, "the handler never ran\n"); return 2; }
    size_t more_len = 16 << 20;
    unsigned char *more = malloc(more_len);
    for (size_t i = 0; i < more_len; i++) more[i] = (unsigned char)(i * 3);
    uint64_t sum = 0;
    for (size_t i = 0; i < big_len; i++) {
        if (big[i] != (unsigned char)(i * 7 + (i >> 12))) { fprintf(stderr, "byte %zu wrong\n", i); return 3; }
        sum = sum * 31 + big[i];
    }
    for (size_t i = 0; i < more_len; i++) {
        if (more[i] != (unsigned char)(i * 3)) { fprintf(stderr, "byte %zu of the second block wrong\n", i); return 3; }
    }
    printf("read %c, checksum %llx\n", c, (unsigned long long)sum);
    return 0;
}
