/* What runs before uswap's library has started: built with -DLIB, a library whose constructor
 * (run before those of preloaded libraries) clears the environment and allocates 1 MiB in
 * small blocks, then sets a variable again; without, a program that defines its own
 * `environ` (as legacy programs do: the C library's `__environ` is another variable then)
 * and links that library. Prints "ok" and the variable. Usage: earlyenv */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef LIB
void *early_blocks[1024];

__attribute__((constructor)) static void early(void) {
    clearenv();
    for (int i = 0; i < 1024; i++) {
        early_blocks[i] = malloc(1024);
        if (!early_blocks[i]) abort();
        memset(early_blocks[i], i & 0xff, 1024);
    }
    setenv("EARLY", "set", 1);
}
#else
char **environ; /* a definition of its own */
extern void *early_blocks[1024];

int main(void) {
    for (int i = 0; i < 1024; i++)
        for (int k = 0; k < 1024; k++)
            if (((unsigned char *)early_blocks[i])[k] != (i & 0xff)) { fprintf(stderr, "block %d changed\n", i); return 3; }
    for (int i = 0; i < 1024; i++) free(early_blocks[i]);
    char *big = malloc(64 << 20);
    memset(big, 7, 64 << 20);
    printf("ok %s %d\n", getenv("EARLY") ? getenv("EARLY") : "(unset)", big[12345]);
    free(big);
    return 0;
}
#endif
