//! The C library's functions behind the entry points: the next definitions after this
//! library (`dlsym(RTLD_NEXT)`), found on first use, which a watcher passes a call on to.
//! A leaf: the C library's functions and the calling thread's errno.

use std::ffi::{c_int, c_long};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::names::{I_uswap_run_library, NAMES};

/// The C library's functions (the next definitions after this library), found on first use.
static C_LIBRARY: [AtomicUsize; NAMES.len()] = [const { AtomicUsize::new(0) }; NAMES.len()];

/// The C library's function for entry point `i`: `dlsym(RTLD_NEXT)` once, else one that
/// fails with `ENOSYS` (an entry point this C library lacks: `closefrom` before 2.34).
pub fn c_library_fn(i: usize) -> usize {
    let f = C_LIBRARY[i].load(Ordering::Acquire);
    if f != 0 {
        return f;
    }
    // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name.
    let found = unsafe { libc::dlsym(libc::RTLD_NEXT, NAMES[i].as_ptr()) } as usize;
    let f = match found {
        0 if i == I_uswap_run_library => stands_aside as *const () as usize,
        0 => missing as *const () as usize,
        f => f,
    };
    C_LIBRARY[i].store(f, Ordering::Release);
    f
}

extern "C" fn missing() -> c_long {
    set_errno(libc::ENOSYS);
    -1
}

/// `uswap_run_library` where the engine could not be loaded: it does not page the process.
extern "C" fn stands_aside() -> c_int {
    0
}

pub fn errno() -> i32 {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() }
}

pub fn set_errno(e: i32) {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() = e };
}
