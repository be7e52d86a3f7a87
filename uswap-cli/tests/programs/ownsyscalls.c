// A program that needs no shared library: built with -nostdlib as a position-independent
// executable it still names the dynamic loader, which preloads uswap's library, but every
// system call it makes is its own, as a Go program's built without cgo. It maps 32 MiB with
// its own mmap, writes a word in every page, checks every one and says "ok".
#include <stddef.h>

#include "raw_syscall.h"

enum { SYS_write = 1, SYS_mmap = 9, SYS_exit_group = 231 };
enum { BYTES = 32 << 20, PAGE = 4096 };
#define WORDS_PER_PAGE (PAGE / sizeof(unsigned long))

// The kernel enters _start with the stack 16-byte aligned, not as a call leaves it.
__attribute__((force_align_arg_pointer)) void _start(void) {
    // PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS
    unsigned long *mem = (unsigned long *)raw_syscall6(SYS_mmap, 0, BYTES, 3, 0x22, -1, 0);
    if ((unsigned long)mem > -4096UL)
        raw_syscall6(SYS_exit_group, 3, 0, 0, 0, 0, 0);
    for (size_t i = 0; i < BYTES / sizeof *mem; i += WORDS_PER_PAGE)
        mem[i] = i * 2654435761u;
    for (size_t i = 0; i < BYTES / sizeof *mem; i += WORDS_PER_PAGE)
        if (mem[i] != i * 2654435761u)
            raw_syscall6(SYS_exit_group, 4, 0, 0, 0, 0, 0);
    raw_syscall6(SYS_write, 1, (long)"ok\n", 3, 0, 0, 0);
    raw_syscall6(SYS_exit_group, 0, 0, 0, 0, 0, 0);
}
