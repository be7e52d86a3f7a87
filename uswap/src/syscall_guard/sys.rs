//! The raw memory calls the rewrite makes on code and trampolines: through `syscall(2)`, not
//! the C library's wrappers, which a preload library may interpose.

use std::ffi::c_void;

/// Raw `mmap(2)`.
pub(super) fn sys_mmap(addr: *mut c_void, len: usize, prot: i32, flags: i32, fd: i32, off: i64) -> *mut c_void {
    // SAFETY: the mmap system call; the kernel validates every argument.
    unsafe { libc::syscall(libc::SYS_mmap, addr as usize, len, prot, flags, fd, off) as *mut c_void }
}

/// Raw `munmap(2)`.
pub(super) fn sys_munmap(addr: *mut c_void, len: usize) -> i32 {
    // SAFETY: the munmap system call; the kernel validates the range. Unmapping memory the
    // caller still uses is the caller's contract, as for munmap itself.
    unsafe { libc::syscall(libc::SYS_munmap, addr as usize, len) as i32 }
}

/// Raw `mprotect(2)`.
pub(super) fn sys_mprotect(addr: *mut c_void, len: usize, prot: i32) -> i32 {
    // SAFETY: the mprotect system call; the kernel validates the range. What the new
    // protection means for the caller's memory is the caller's contract, as for mprotect.
    unsafe { libc::syscall(libc::SYS_mprotect, addr as usize, len, prot) as i32 }
}

/// Blocks every signal but the synchronous ones (a fault while blocked would kill the
/// process) on this thread; returns the mask to give back to [`sys_set_mask`]. Raw
/// `rt_sigprocmask`: `uswap run`'s library interposes the C library's.
pub(super) fn sys_block_async_signals() -> libc::sigset_t {
    // SAFETY: all-zero sigsets are valid; the set functions and the system call only read
    // and write these two locals.
    unsafe {
        let (mut block, mut old): (libc::sigset_t, libc::sigset_t) = (std::mem::zeroed(), std::mem::zeroed());
        libc::sigfillset(&mut block);
        for sig in [libc::SIGBUS, libc::SIGSEGV, libc::SIGILL, libc::SIGFPE, libc::SIGTRAP] {
            libc::sigdelset(&mut block, sig);
        }
        let (set, was) = (&block as *const libc::sigset_t, &mut old as *mut libc::sigset_t);
        libc::syscall(libc::SYS_rt_sigprocmask, libc::SIG_BLOCK, set, was, 8usize);
        old
    }
}

/// Gives this thread back the mask [`sys_block_async_signals`] returned.
pub(super) fn sys_set_mask(mask: &libc::sigset_t) {
    // SAFETY: the system call reads the caller's set; 8 bytes is the kernel's sigset size.
    unsafe {
        libc::syscall(libc::SYS_rt_sigprocmask, libc::SIG_SETMASK, mask as *const libc::sigset_t, 0usize, 8usize);
    }
}

/// The kernel's flag for a handler with a restorer of its own (x86-64).
const SA_RESTORER: usize = 0x0400_0000;

/// The action of signal `sig` now, as the kernel keeps it (`struct kernel_sigaction` on
/// x86-64: handler, flags, restorer, mask), by a raw `rt_sigaction` that changes nothing;
/// `None` where the kernel refuses (SIGKILL's, a number out of range).
pub(super) fn sys_signal_action(sig: usize) -> Option<[usize; 4]> {
    let mut act = [0usize; 4];
    // SAFETY: queries the action of `sig` into `act`, ours; changes nothing.
    let r = unsafe { libc::syscall(libc::SYS_rt_sigaction, sig, 0usize, act.as_mut_ptr(), 8usize) };
    (r == 0).then_some(act)
}

/// Whether a signal action's handler is a function (not the default, not ignored).
pub(super) fn is_handled(act: &[usize; 4]) -> bool {
    act[0] != libc::SIG_DFL && act[0] != libc::SIG_IGN
}

/// The restorers of the signal handlers installed now (`sa_restorer`, which every handler on
/// x86-64 has: the kernel pushes it as the handler's return address); none if no handler is
/// installed.
pub(super) fn sys_signal_restorers() -> Vec<usize> {
    let mut restorers = Vec::new();
    for act in (1..=64).filter_map(sys_signal_action) {
        if is_handled(&act) && act[1] & SA_RESTORER != 0 && !restorers.contains(&act[2]) {
            restorers.push(act[2]);
        }
    }
    restorers
}
