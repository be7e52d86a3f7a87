/* One of two processes of a tree, each in a pid namespace of its own (pid 1 in both), that
 * hold memory at the same moment: writes MIB MiB, leaves DIR/NAME.ready, waits for
 * DIR/WAITFOR, writes how much of its memory is in RAM (KiB, mincore) to DIR/NAME.rss, waits
 * for DIR/THEN, checks every byte and exits. Every wait ends after 120 s (status 4).
 * Usage: nsmem NAME MIB DIR WAITFOR THEN */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int wait_for(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    for (int i = 0; i < 12000; i++) {
        if (access(path, F_OK) == 0) return 0;
        usleep(10000);
    }
    fprintf(stderr, "no %s after 120 s\n", path);
    return 4;
}

/* KiB of [buf, buf + len) in RAM (mincore: a page uswap moved out is not), -1 on failure. */
static long resident_kib(unsigned char *buf, size_t len) {
    uintptr_t start = (uintptr_t)buf & ~(uintptr_t)4095, end = ((uintptr_t)buf + len + 4095) & ~(uintptr_t)4095;
    size_t nr = (end - start) / 4096;
    unsigned char *vec = calloc(nr, 1);
    if (!vec || mincore((void *)start, end - start, vec)) { perror("mincore"); return -1; }
    long kib = 0;
    for (size_t i = 0; i < nr; i++) kib += (vec[i] & 1) * 4;
    free(vec);
    return kib;
}

static int leave(const char *dir, const char *name, const char *text) {
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.part", path);
    FILE *f = fopen(tmp, "w");
    if (!f || fputs(text, f) < 0 || fclose(f)) { perror(tmp); return 1; }
    return rename(tmp, path) ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc != 6) { fprintf(stderr, "usage: nsmem NAME MIB DIR WAITFOR THEN\n"); return 2; }
    const char *name = argv[1], *dir = argv[3];
    size_t len = strtoul(argv[2], 0, 10) << 20;
    unsigned char *buf = malloc(len);
    if (!buf) { perror("malloc"); return 1; }
    unsigned seed = (unsigned char)name[0];
    for (size_t i = 0; i < len; i++) buf[i] = (unsigned char)(i * 13 + (i >> 12) + seed);
    char text[64], file[64];
    snprintf(file, sizeof file, "%s.ready", name);
    if (leave(dir, file, "ready\n")) return 1;
    int r = wait_for(dir, argv[4]);
    if (r) return r;
    snprintf(text, sizeof text, "%ld\n", resident_kib(buf, len));
    snprintf(file, sizeof file, "%s.rss", name);
    if (leave(dir, file, text)) return 1;
    if ((r = wait_for(dir, argv[5]))) return r;
    for (size_t i = 0; i < len; i++)
        if (buf[i] != (unsigned char)(i * 13 + (i >> 12) + seed)) { fprintf(stderr, "byte %zu wrong\n", i); return 3; }
    printf("%s ok\n", name);
    return 0;
}
