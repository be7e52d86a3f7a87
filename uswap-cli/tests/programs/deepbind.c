/* Blocks that cross between the program and a library it loads with RTLD_DEEPBIND, as
 * PHP's extensions do: the library frees the program's blocks and the program the
 * library's. The library is loaded by a bare name that only the program's RUNPATH
 * ($ORIGIN) finds. Built twice: with -DLIB as libdeepbind.so, and without as the program.
 * Usage: deepbind MIB (MIB of heap first, so that the program's blocks are uswap's). */
#ifdef LIB
#include <stdlib.h>
#include <string.h>

char *lib_dup(const char *s) { return strdup(s); }
void lib_free(void *p) { free(p); }
#else
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: deepbind MIB\n"); return 2; }
    size_t len = strtoul(argv[1], 0, 10) << 20;
    unsigned char *big = malloc(len);
    if (!big) { perror("malloc"); return 1; }
    for (size_t i = 0; i < len; i++) big[i] = (unsigned char)(i * 7 + (i >> 12));
    void *h = dlopen("libdeepbind.so", RTLD_NOW | RTLD_DEEPBIND);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 1; }
    void (*lib_free)(void *) = (void (*)(void *))dlsym(h, "lib_free");
    char *(*lib_dup)(const char *) = (char *(*)(const char *))dlsym(h, "lib_dup");
    if (!lib_free || !lib_dup) { fprintf(stderr, "dlsym: %s\n", dlerror()); return 1; }
    for (int i = 0; i < 1000; i++) {
        char *p = malloc(100 + i);
        if (!p) return 1;
        memset(p, 'a', 100 + i);
        lib_free(p);
        char *q = lib_dup("from the library");
        if (!q || strcmp(q, "from the library")) { fprintf(stderr, "lib_dup wrong\n"); return 3; }
        free(q);
    }
    for (size_t i = 0; i < len; i++)
        if (big[i] != (unsigned char)(i * 7 + (i >> 12))) { fprintf(stderr, "byte %zu wrong\n", i); return 3; }
    free(big);
    printf("ok\n");
    return 0;
}
#endif
