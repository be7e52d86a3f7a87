//! What the caller gave `uswap run` that the Rust runtime changes before `main`, given to the
//! program as the caller gave it: SIGPIPE's disposition and closed standard descriptors.
//!
//! The runtime ignores SIGPIPE for itself (the standard library's spawn then gives every
//! child the default action), and opens `/dev/null` on a closed descriptor 0, 1 or 2. So a
//! program run by a caller that ignores SIGPIPE (`trap '' PIPE`, a service manager's or a CI
//! runner's setting) was killed by a closed pipe where, run without uswap, its write failed
//! with `EPIPE`; and `uswap run -- echo hi >&-` exited 0, its output gone to `/dev/null`,
//! where `echo` alone fails with `EBADF`. Both are read by an ELF constructor, which runs
//! before `main`, and put back in the child between its fork and its exec.
//!
//! State: two atomics, written once by the constructor, before any thread exists.

use std::os::unix::process::CommandExt;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// Whether SIGPIPE was ignored when `uswap` started.
static SIGPIPE_IGNORED_AT_START: AtomicBool = AtomicBool::new(false);
/// The standard descriptors (bit `fd`) that were closed when `uswap` started.
static CLOSED_AT_START: AtomicU8 = AtomicU8::new(0);

extern "C" fn note_what_was_given() {
    // SAFETY: a null new action only reads the current one into `old`.
    let ignored = unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGPIPE, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    };
    SIGPIPE_IGNORED_AT_START.store(ignored, Ordering::Relaxed);
    let mut closed = 0u8;
    for fd in 0..3 {
        // SAFETY: F_GETFD reads a descriptor's flags; it fails with EBADF on a closed one.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
            closed |= 1 << fd;
        }
    }
    CLOSED_AT_START.store(closed, Ordering::Relaxed);
}

#[used]
#[link_section = ".init_array"]
static NOTE_WHAT_WAS_GIVEN: extern "C" fn() = note_what_was_given;

/// The program gets SIGPIPE as `uswap` got it (ignored if the caller ignored it, else the
/// default action; every other signal the caller ignored stays ignored through the exec by
/// itself), and the standard descriptors the caller had closed closed.
pub(super) fn give_the_program_what_was_given(command: &mut std::process::Command) {
    let sigpipe_ignored = SIGPIPE_IGNORED_AT_START.load(Ordering::Relaxed);
    let closed = CLOSED_AT_START.load(Ordering::Relaxed);
    if !sigpipe_ignored && closed == 0 {
        return;
    }
    // SAFETY: runs in the child between fork and exec, after the standard library reset
    // SIGPIPE and set up the child's descriptors (inherited here): signal(2) and close(2)
    // on plain values copied before the fork, nothing allocated.
    unsafe {
        command.pre_exec(move || {
            if sigpipe_ignored {
                libc::signal(libc::SIGPIPE, libc::SIG_IGN);
            }
            for fd in (0..3).filter(|fd| closed & (1 << fd) != 0) {
                libc::close(fd);
            }
            Ok(())
        });
    }
}
