//! Processes that leave the budget at exec, judged in this library (`uswap_escape`, shared
//! with the first stage, `uswap-shim`, which judges them in processes that never loaded
//! this library): the module's [`init`] and the exported `posix_spawn` and `posix_spawnp`;
//! `execve` and its siblings are `crate::rlimit`'s, which carry the program's limits too.
//!
//! The library `LD_PRELOAD` must name for a new image to stay in the budget is the one the
//! loader preloaded: the first stage where it loaded this library (`crate::first_stage`),
//! this library itself where it was preloaded by hand.

pub use uswap_escape::*;

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::AtomicPtr;

/// At start-up, once the configuration is known: the library an `LD_PRELOAD` passed on must
/// name, and the run's directory.
pub fn init_here() {
    use std::os::unix::ffi::OsStrExt;
    let library = crate::first_stage::library_path().unwrap_or_else(|| object_path(init_here as *const () as usize));
    let run_dir = crate::config().and_then(|c| c.stats_dir.as_deref()).map(|d| d.as_os_str().as_bytes());
    init(library, run_dir);
}

static REAL_POSIX_SPAWN: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static REAL_POSIX_SPAWNP: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

fn real_spawn(slot: &AtomicPtr<c_void>, name: &CStr) -> PosixSpawnFn {
    let p = crate::real::next_symbol(slot, name);
    // SAFETY: `p` is the C library's posix_spawn or posix_spawnp, both of this type.
    unsafe { std::mem::transmute::<*mut c_void, PosixSpawnFn>(p) }
}

/// `posix_spawn` (whose exec the C library makes itself): the child is noted once started,
/// if its image leaves the budget.
///
/// # Safety
/// As the C library's `posix_spawn`.
#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    let f = real_spawn(&REAL_POSIX_SPAWN, c"posix_spawn");
    // SAFETY: the caller's arguments, as the C library's posix_spawn takes them.
    unsafe { spawn(f, false, pid, path, actions, attr, argv, envp) }
}

/// `posix_spawnp`: as [`posix_spawn`], the program found on `PATH` as the C library finds it.
///
/// # Safety
/// As the C library's `posix_spawnp`.
#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    let f = real_spawn(&REAL_POSIX_SPAWNP, c"posix_spawnp");
    // SAFETY: the caller's arguments, as the C library's posix_spawnp takes them.
    unsafe { spawn(f, true, pid, file, actions, attr, argv, envp) }
}

#[cfg(test)]
mod tests {
    #[test]
    fn notes_are_named_as_the_run_reads_them() {
        assert_eq!(super::ESCAPE_PREFIX, uswap::shared_charge::ESCAPE_PREFIX);
        assert_eq!(super::REFUSAL_PREFIX, uswap::shared_charge::REFUSAL_PREFIX);
    }
}
