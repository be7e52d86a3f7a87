/* memalign and aligned_alloc with alignments that are not powers of two, or 0: the C
 * library (before 2.38) rounds them up to the next power of two (at least 16) and succeeds.
 * Prints one line per call: whether it succeeded and the result is aligned as rounded. */
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(void) {
    size_t aligns[] = {3, 0, 48, 4096, 5000};
    size_t rounded[] = {16, 16, 64, 4096, 8192};
    for (int i = 0; i < 5; i++) {
        void *m = memalign(aligns[i], 100);
        void *a = aligned_alloc(aligns[i], 200);
        printf("memalign %zu: %s; aligned_alloc %zu: %s\n", aligns[i],
               m && (uintptr_t)m % rounded[i] == 0 ? "ok" : "failed", aligns[i], a ? "ok" : "failed");
        free(m);
        free(a);
    }
    return 0;
}
