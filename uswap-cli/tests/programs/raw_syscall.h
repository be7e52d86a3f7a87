/* A system call made with the `syscall` instruction itself, as programs that bring their own
 * (Go without cgo, liburing 2) make them: no C library function runs, so nothing that
 * interposes the C library sees it. x86-64 only. Needs no header. */
#ifndef RAW_SYSCALL_H
#define RAW_SYSCALL_H

static long raw_syscall6(long nr, long a, long b, long c, long d, long e, long f) {
    long ret;
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return ret;
}

#endif
