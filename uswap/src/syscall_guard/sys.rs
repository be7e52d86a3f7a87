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
