/* Blocks aligned past what an allocator's arenas hold (128 KiB to 4 MiB, as x264 asks
 * 2 MiB for a frame it wants in one huge page) and small ones beside them, through
 * posix_memalign, memalign and aligned_alloc, MIB in all: each is checked aligned, filled
 * with bytes that depend on its index, one in four grown by realloc, then every byte is
 * checked and a checksum printed. Usage: largealign MIB */
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define MAX_BLOCKS 4096

static unsigned char byte_at(size_t block, size_t i) { return (unsigned char)(i * 131 + (i >> 12) + block * 7); }

int main(int argc, char **argv) {
    size_t target = (argc > 1 ? strtoul(argv[1], 0, 10) : 64) << 20, total = 0;
    static const size_t aligns[] = {128 << 10, 1 << 20, 2 << 20, 4 << 20, 64, 4096};
    static const size_t sizes[] = {100, 64 << 10, 2379452, 3 << 20, 5 << 20};
    static unsigned char *blocks[MAX_BLOCKS];
    static size_t lens[MAX_BLOCKS];
    size_t n = 0;
    for (; total < target && n < MAX_BLOCKS; n++) {
        size_t align = aligns[n % 6], len = sizes[(n / 6) % 5];
        void *p = NULL;
        switch (n % 3) {
        case 0: if (posix_memalign(&p, align, len) != 0) p = NULL; break;
        case 1: p = memalign(align, len); break;
        default: p = aligned_alloc(align, (len + align - 1) / align * align); break;
        }
        if (!p) { fprintf(stderr, "block %zu: %zu bytes aligned to %zu failed\n", n, len, align); return 1; }
        if ((uintptr_t)p % align != 0) { fprintf(stderr, "block %zu at %p not aligned to %zu\n", n, p, align); return 2; }
        if (malloc_usable_size(p) < len) { fprintf(stderr, "block %zu: usable size below %zu\n", n, len); return 2; }
        blocks[n] = p;
        lens[n] = len;
        for (size_t i = 0; i < len; i++) blocks[n][i] = byte_at(n, i);
        total += len;
    }
    for (size_t b = 0; b < n; b += 4) {
        unsigned char *g = realloc(blocks[b], lens[b] * 2);
        if (!g) { fprintf(stderr, "realloc of block %zu failed\n", b); return 1; }
        for (size_t i = lens[b]; i < lens[b] * 2; i++) g[i] = byte_at(b, i);
        blocks[b] = g;
        lens[b] *= 2;
    }
    uint64_t sum = 0;
    for (size_t b = 0; b < n; b++) {
        for (size_t i = 0; i < lens[b]; i++) {
            if (blocks[b][i] != byte_at(b, i)) { fprintf(stderr, "block %zu byte %zu wrong\n", b, i); return 3; }
            sum = sum * 31 + blocks[b][i];
        }
        free(blocks[b]);
    }
    printf("%zu blocks, checksum %llx\n", n, (unsigned long long)sum);
    return 0;
}
