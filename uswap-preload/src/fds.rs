//! The program's descriptor calls, interposed so that they never close or replace the
//! pager's own descriptors (its userfaultfds, eventfds, stats socket, file device and
//! io_uring; see `uswap::fd`).
//!
//! Daemons and sandboxes close every descriptor above 2 at start. Closing a pager's
//! userfaultfd would unregister every region (what was swapped out would read as zeros)
//! and hand its number to the next `open`. The engine already keeps its descriptors at
//! high numbers (768 and up), out of the way of loops over the low ones; this module
//! covers the calls that reach them anyway:
//!
//! | call | on an engine descriptor |
//! |---|---|
//! | `close` | nothing closed; returns 0, as if it had been |
//! | `close_range`, `closefrom` | every other descriptor of the range is closed |
//! | `dup2`, `dup3` onto it | refused with `EBADF` (the program keeps its old descriptor) |
//! | `syscall(SYS_close / SYS_close_range / SYS_dup2 / SYS_dup3, ...)` | as above |
//!
//! The interposed `syscall` also sends `SYS_brk` to the program's own break
//! (`program_break`), `SYS_ioctl` to `program_userfaultfd`, and `SYS_prctl` and `SYS_seccomp` to
//! `program_seccomp`.
//!
//! Not covered: a system call made without the C library (a static program, inline
//! assembly), and `fcntl` flags changed on an engine descriptor.

use std::ffi::{c_int, c_long, c_uint, c_void};
use std::sync::atomic::AtomicPtr;

use crate::real::{self, set_errno};

type SyscallFn = unsafe extern "C" fn(c_long, c_long, c_long, c_long, c_long, c_long, c_long) -> c_long;
static REAL_SYSCALL: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// The C library's `syscall`, with six arguments (the unused ones are ignored by the kernel).
fn real_syscall(n: c_long, a: [c_long; 6]) -> c_long {
    let f = real::next_symbol(&REAL_SYSCALL, c"syscall");
    // SAFETY: `f` is the C library's `syscall`, which takes the number and up to six
    // register-sized arguments (passing six where fewer are used is how the C ABI works).
    unsafe {
        let f: SyscallFn = std::mem::transmute(f);
        f(n, a[0], a[1], a[2], a[3], a[4], a[5])
    }
}

fn sys_close(fd: c_int) -> c_int {
    real_syscall(libc::SYS_close, [fd as c_long, 0, 0, 0, 0, 0]) as c_int
}

#[no_mangle]
pub extern "C" fn close(fd: c_int) -> c_int {
    if uswap::fd::is_kept(fd) {
        return 0;
    }
    sys_close(fd)
}

/// `close_range(first, last, flags)` around the engine's descriptors: the kernel's call on
/// each stretch between them. `CLOSE_RANGE_CLOEXEC` only marks descriptors (the engine's
/// are close-on-exec already) and passes as it is; `CLOSE_RANGE_UNSHARE` goes with the
/// first call made.
fn close_range_around_kept(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    let call = |lo: c_uint, hi: c_uint, flags: c_int| {
        real_syscall(libc::SYS_close_range, [lo as c_long, hi as c_long, flags as c_long, 0, 0, 0]) as c_int
    };
    if flags & libc::CLOSE_RANGE_CLOEXEC as c_int != 0 || first > last {
        return call(first, last, flags);
    }
    let (kept, n) = uswap::fd::kept();
    let mut flags = flags;
    let mut lo = first as u64;
    // Bounded by the kept descriptors, a fixed array.
    for &fd in &kept[..n] {
        let fd = fd as u64;
        if fd < lo || fd > last as u64 {
            continue;
        }
        if fd > lo {
            let r = call(lo as c_uint, (fd - 1) as c_uint, flags);
            if r != 0 {
                return r;
            }
            flags &= !(libc::CLOSE_RANGE_UNSHARE as c_int);
        }
        lo = fd + 1;
    }
    if lo <= last as u64 {
        return call(lo as c_uint, last, flags);
    }
    if flags & libc::CLOSE_RANGE_UNSHARE as c_int != 0 {
        // Every descriptor of the range was the engine's: only the unsharing is left.
        // SAFETY: unshare(CLONE_FILES) gives this thread a private copy of the table.
        return unsafe { libc::unshare(libc::CLONE_FILES) };
    }
    0
}

#[no_mangle]
pub extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    close_range_around_kept(first, last, flags)
}

#[no_mangle]
pub extern "C" fn closefrom(lowfd: c_int) {
    close_range_around_kept(lowfd.max(0) as c_uint, c_uint::MAX, 0);
}

fn refuse_onto_kept(newfd: c_int) -> bool {
    if uswap::fd::is_kept(newfd) {
        set_errno(libc::EBADF);
        return true;
    }
    false
}

#[no_mangle]
pub extern "C" fn dup2(oldfd: c_int, newfd: c_int) -> c_int {
    if refuse_onto_kept(newfd) {
        return -1;
    }
    if oldfd == newfd {
        // dup2 onto itself checks the descriptor and changes nothing (dup3 refuses it).
        // SAFETY: F_GETFD reads a descriptor's flags; an invalid one gives EBADF.
        return if unsafe { libc::fcntl(oldfd, libc::F_GETFD) } < 0 { -1 } else { newfd };
    }
    real_syscall(libc::SYS_dup3, [oldfd as c_long, newfd as c_long, 0, 0, 0, 0]) as c_int
}

#[no_mangle]
pub extern "C" fn dup3(oldfd: c_int, newfd: c_int, flags: c_int) -> c_int {
    if refuse_onto_kept(newfd) {
        return -1;
    }
    real_syscall(libc::SYS_dup3, [oldfd as c_long, newfd as c_long, flags as c_long, 0, 0, 0]) as c_int
}

/// `syscall(n, ...)`. The arguments after the number are variadic in C; on the x86-64 and
/// AArch64 Linux ABIs variadic integer arguments travel where fixed ones do, so declaring
/// six reads what the caller passed (and harmless leftovers where it passed fewer).
#[no_mangle]
pub extern "C" fn syscall(n: c_long, a1: c_long, a2: c_long, a3: c_long, a4: c_long, a5: c_long, a6: c_long) -> c_long {
    match n {
        libc::SYS_close if uswap::fd::is_kept(a1 as c_int) => 0,
        libc::SYS_close_range => close_range_around_kept(a1 as c_uint, a2 as c_uint, a3 as c_int) as c_long,
        _ if is_dup(n) && refuse_onto_kept(a2 as c_int) => -1,
        libc::SYS_brk => crate::program_break::sys_brk(a1).unwrap_or_else(|| real_syscall(n, [a1, a2, a3, a4, a5, a6])),
        libc::SYS_ioctl => {
            crate::program_userfaultfd::sys_ioctl([a1, a2, a3], || real_syscall(n, [a1, a2, a3, a4, a5, a6]))
        }
        // A fork without the C library's (see `raw_fork`).
        _ if crate::raw_fork::is_raw_fork(n, a1, a2) => {
            crate::raw_fork::around(|_| real_syscall(n, [a1, a2, a3, a4, a5, a6]))
        }
        // A handler installed without the C library's `sigaction` (see `signals`).
        libc::SYS_rt_sigaction if crate::signals::routes_raw_sigaction(a1 as c_int, a4 as usize) => {
            // SAFETY: the program's arguments to rt_sigaction, whose contract they meet.
            unsafe { crate::signals::raw_sigaction(a1 as c_int, a2 as usize, a3 as usize) }
        }
        libc::SYS_prctl | libc::SYS_seccomp => {
            let ret = real_syscall(n, [a1, a2, a3, a4, a5, a6]);
            crate::program_seccomp::note(n, a1, a2, ret);
            ret
        }
        _ => real_syscall(n, [a1, a2, a3, a4, a5, a6]),
    }
}

/// Whether system call `n` duplicates a descriptor onto a number its caller names.
fn is_dup(n: c_long) -> bool {
    #[cfg(target_arch = "x86_64")]
    if n == libc::SYS_dup2 {
        return true;
    }
    n == libc::SYS_dup3
}
