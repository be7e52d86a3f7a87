/* Grows one buffer by realloc many times (glibc would mremap it; here it moves), filling
 * each new part; then checks every byte and prints a checksum. Usage: grow MIB */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    size_t target = (argc > 1 ? strtoul(argv[1], 0, 10) : 64) << 20, len = 0, cap = 4096;
    unsigned char *buf = NULL;
    while (len < target) {
        cap = cap * 5 / 4 + 4096;
        if (cap > target) cap = target;
        unsigned char *n = realloc(buf, cap);
        if (!n) { perror("realloc"); return 1; }
        buf = n;
        for (; len < cap; len++) buf[len] = (unsigned char)(len * 131 + (len >> 12));
    }
    uint64_t sum = 0;
    for (size_t i = 0; i < len; i++) {
        if (buf[i] != (unsigned char)(i * 131 + (i >> 12))) { fprintf(stderr, "byte %zu wrong\n", i); return 3; }
        sum = sum * 31 + buf[i];
    }
    printf("grew to %zu bytes, checksum %llx\n", len, (unsigned long long)sum);
    free(buf);
    return 0;
}
